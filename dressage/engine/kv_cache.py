"""A slot KV cache and the attention function that reads and writes it.

Every running request owns one *slot*: row ``s`` of a per-layer tensor ``[slots, kv_heads,
capacity, head_dim]``. Running requests always occupy slots ``0 .. B-1`` (the scheduler compacts
on leave), so the decode batch is a plain slice and never a gather.

The transformers model runs unchanged; only its attention function is ours. It is registered in
transformers' ``AttentionInterface`` under :data:`ATTENTION_NAME`. That interface hands us the
query, key and value of the new tokens *after* the model's own projections, norms and rotary
embedding, so the numerics of everything but the attention product are transformers' own. Because
the name is not registered as a mask function, transformers builds no mask: the plan set here
before each forward says which slot and positions every token belongs to:

- :class:`DecodePlan`: one new token per slot, at per-slot positions; attends to its slot's
  positions ``0 .. pos``.
- :class:`PrefillPlan`: a packed row of several prompts (segments); each segment is causal over
  itself and is written to its slot from position 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTENTION_NAME = "dressage_slots"
_STATE_ATTR = "_dressage_kv_cache"


@dataclass(frozen=True)
class DecodePlan:
    """One token per running slot. ``positions`` [B] (long), ``mask`` [B, 1, 1, L] (bool)."""

    positions: torch.Tensor
    rows: torch.Tensor
    mask: torch.Tensor
    length: int


@dataclass(frozen=True)
class Segment:
    slot: int
    start: int  # offset of the segment in the packed row
    length: int


@dataclass(frozen=True)
class PrefillPlan:
    segments: tuple[Segment, ...]


class SlotKVCache:
    """Per-layer K/V tensors ``[slots, kv_heads, capacity, head_dim]`` that grow on demand."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.slots = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.plan: DecodePlan | PrefillPlan | None = None
        self._alloc(8, 256)

    @property
    def bytes_per_token(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element

    def _alloc(self, slots: int, capacity: int, keep_slots: int = 0, keep_len: int = 0) -> None:
        shape = (slots, self.num_kv_heads, capacity, self.head_dim)
        new_k = [self._zeros(shape) for _ in range(self.num_layers)]
        new_v = [self._zeros(shape) for _ in range(self.num_layers)]
        if keep_slots and keep_len:
            for old, new in zip(self.keys + self.values, new_k + new_v, strict=True):
                new[:keep_slots, :, :keep_len].copy_(old[:keep_slots, :, :keep_len])
        self.keys, self.values = new_k, new_v
        self.slots, self.capacity = slots, capacity

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def ensure(
        self,
        *,
        slots: int,
        length: int,
        live_slots: int,
        live_len: int,
        max_slots: int,
        max_len: int,
        max_tokens: int,
    ) -> None:
        """Hold at least ``slots`` x ``length``, growing geometrically but never past
        ``max_slots`` slots, ``max_len`` positions or ``max_tokens`` slot-positions in all.

        ``live_slots`` x ``live_len`` is the region whose contents survive a reallocation.
        """
        if slots <= self.slots and length <= self.capacity:
            return
        new_len = self.capacity
        if length > self.capacity:
            grown = -(-max(length, 2 * self.capacity) // 256) * 256
            new_len = max(length, min(grown, max_len))
        new_slots = self.slots
        if slots > self.slots:
            new_slots = max(slots, min(2 * self.slots, max_slots))
        new_slots = min(new_slots, max(slots, max_tokens // new_len))
        keep_len = min(live_len, self.capacity, new_len)
        self._alloc(new_slots, new_len, min(live_slots, self.slots, new_slots), keep_len)

    def reset(self) -> None:
        """Drop a large allocation once nothing runs, so an idle engine holds little memory."""
        if self.slots > 8 or self.capacity > 256:
            self._alloc(8, 256)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src`` into ``dst`` (positions ``0 .. length-1``) when compacting."""
        for tensor in self.keys + self.values:
            tensor[dst, :, :length].copy_(tensor[src, :, :length])

    def attach(self, model: torch.nn.Module) -> None:
        """Point every attention module of ``model`` at this cache."""
        found = 0
        for module in model.modules():
            if hasattr(module, "layer_idx") and hasattr(module, "scaling"):
                setattr(module, _STATE_ATTR, self)
                found += 1
        if found != self.num_layers:
            raise ValueError(
                f"found {found} attention modules (with layer_idx and scaling), "
                f"expected {self.num_layers}"
            )


def _decode_attention(
    cache: SlotKVCache,
    plan: DecodePlan,
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    batch, heads, _, dim = q.shape
    keys, values = cache.keys[layer], cache.values[layer]
    keys[plan.rows, :, plan.positions] = k[:, :, 0]
    values[plan.rows, :, plan.positions] = v[:, :, 0]
    kv_heads = keys.shape[1]
    # A decode query is one position, so the query heads that share a KV head can be laid out as
    # that KV head's "query positions": plain attention, no repeat of the cache for GQA.
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(
        grouped,
        keys[:batch, :, : plan.length],
        values[:batch, :, : plan.length],
        attn_mask=plan.mask,
        scale=scaling,
    )
    return out.reshape(batch, heads, 1, dim).transpose(1, 2)


def _prefill_attention(
    cache: SlotKVCache,
    plan: PrefillPlan,
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    keys, values = cache.keys[layer], cache.values[layer]
    outs = []
    for seg in plan.segments:
        end = seg.start + seg.length
        seg_k, seg_v = k[:, :, seg.start : end], v[:, :, seg.start : end]
        keys[seg.slot, :, : seg.length] = seg_k[0]
        values[seg.slot, :, : seg.length] = seg_v[0]
        outs.append(
            F.scaled_dot_product_attention(
                q[:, :, seg.start : end],
                seg_k,
                seg_v,
                is_causal=True,
                scale=scaling,
                enable_gqa=q.shape[1] != k.shape[1],
            )
        )
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2)


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface entry: [B, H, T, D] in, [B, T, H, D] out."""
    cache: SlotKVCache | None = getattr(module, _STATE_ATTR, None)
    if cache is None or cache.plan is None:
        raise RuntimeError("slot attention called without a cache plan (engine-internal error)")
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError("sliding-window and soft-capped attention are not supported")
    layer = int(getattr(module, "layer_idx"))  # noqa: B009 - set by transformers, not typed
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if isinstance(cache.plan, DecodePlan):
        return _decode_attention(cache, cache.plan, layer, query, key, value, scale), None
    return _prefill_attention(cache, cache.plan, layer, query, key, value, scale), None


AttentionInterface.register(ATTENTION_NAME, slot_attention)
