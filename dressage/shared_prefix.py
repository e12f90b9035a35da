"""Last hidden states of a batch whose sequences share their first tokens, each shared prefix
computed once.

The tiny teachers are fine-tuned on transcripts of one task (:mod:`dressage.tiny.teachers`):
~200 tokens of system prompt and tool list in common, ~70 of their own. The plain padded forward
(:func:`dressage.causal_lm.causal_lm_hidden`) computes the common part once per sequence;
:func:`shared_prefix_hidden` computes it once per group:

1. :func:`prefix_groups` sorts the sequences and cuts the sorted order into groups whose common
   prefix is at least ``min_prefix`` tokens, choosing the cut that skips the most token
   positions (a mixture of two tasks forms two groups); sequences in no group go together
   through the plain padded forward;
2. each group's prefix runs once (batch 1, ``use_cache``, with gradient: the cached keys and
   values depend on the parameters, and the suffixes' gradient flows back through them);
3. the cache is expanded to the group (a view, not a copy) and the right-padded suffixes run on
   it, their positions continuing after the prefix, the attention mask covering prefix and
   suffix.

The output has ``causal_lm_hidden``'s layout, ``[B, L_max, H]``: position ``p`` of sequence
``i`` at ``[i, p]`` (the prefix's hidden states expanded into every member's row); what lies
past a sequence's end is padding, as there. Works with the forward's ``cache`` keyword of
transformers 5.24 and the ``past_key_values`` one of earlier releases.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dressage.causal_lm import causal_lm_hidden, input_embedding_module, to_device

__all__ = ["DEFAULT_MIN_PREFIX", "PrefixGroup", "prefix_groups", "shared_prefix_hidden"]

DEFAULT_MIN_PREFIX = 64
"""Shortest common prefix worth its own pass: below it the second forward's fixed cost (a
kernel launch per op, the cache concatenation) outweighs the tokens it saves."""


@dataclass(frozen=True)
class PrefixGroup:
    """Sequences (indices into the batch) whose first ``prefix_length`` tokens are the same;
    ``prefix_length`` 0: the sequences that share nothing worth a pass (plain forward)."""

    members: tuple[int, ...]
    prefix_length: int


def _common_length(a: Tensor, b: Tensor) -> int:
    """Number of leading tokens ``a`` and ``b`` (1-D) have in common."""
    n = min(a.numel(), b.numel())
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if differ.numel() else n


def prefix_groups(
    tokens: Sequence[Tensor], *, min_prefix: int = DEFAULT_MIN_PREFIX
) -> list[PrefixGroup]:
    """Partition of the batch into shared-prefix groups (and at most one plain group, last).

    In lexicographic order the common prefix of a run of sequences is the minimum of its
    neighbours' common prefixes, so the best cut of the sorted order into runs (the most token
    positions skipped: ``(size - 1) * prefix_length`` per group) is a small dynamic programme,
    ``O(B^2)``. A run counts only with two or more members and a prefix of ``min_prefix``
    tokens or more.
    """
    if min_prefix < 1:
        raise ValueError(f"min_prefix must be at least 1, got {min_prefix}")
    flat = [t.reshape(-1).cpu() for t in tokens]
    order = sorted(range(len(flat)), key=lambda i: flat[i].tolist())
    shared = [_common_length(flat[a], flat[b]) for a, b in zip(order, order[1:], strict=False)]
    n = len(order)
    best = [0] * (n + 1)  # best[j]: most positions skipped by a cut of order[:j]
    start = [0] * (n + 1)  # where the last run of that cut starts
    for j in range(1, n + 1):
        best[j], start[j] = best[j - 1], j - 1  # order[j - 1] alone
        common = shared[j - 2] if j > 1 else 0
        for i in range(j - 2, -1, -1):  # the run order[i:j], growing leftwards
            common = min(common, shared[i])
            gain = (j - i - 1) * common if common >= min_prefix else 0
            if best[i] + gain >= best[j]:
                best[j], start[j] = best[i] + gain, i
    groups, plain = [], []
    j = n
    while j > 0:
        run = order[start[j] : j]
        common = min(shared[start[j] : j - 1], default=0)
        if len(run) > 1 and common >= min_prefix:
            groups.append(PrefixGroup(tuple(sorted(run)), common))
        else:
            plain += run
        j = start[j]
    groups.reverse()
    if plain:
        groups.append(PrefixGroup(tuple(sorted(plain)), 0))
    return groups


def _cache_keyword(base: nn.Module) -> str:
    """transformers 5.24 names the forward's KV cache ``cache``; earlier 5.x ``past_key_values``
    (5.24 still takes it, with a deprecation warning)."""
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _expand_cache(cache: Any, batch: int) -> None:
    """Every layer's keys and values ``[1, heads, P, d]`` -> ``[batch, heads, P, d]`` views."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(hasattr(layer, "keys") for layer in layers):
        raise TypeError(f"{type(cache).__name__} has no per-layer keys/values to expand")
    for layer in layers:
        layer.keys = layer.keys.expand(batch, -1, -1, -1)
        layer.values = layer.values.expand(batch, -1, -1, -1)


def _group_hidden(model: nn.Module, tokens: Sequence[Tensor], prefix_length: int) -> Tensor:
    """Hidden states ``[g, P + S_max, H]`` of a group sharing its first ``prefix_length`` = P
    tokens: the prefix once, then the right-padded suffixes (longest ``S_max``) on its cache."""
    from transformers import DynamicCache

    base = cast(nn.Module, model.base_model)
    embed = input_embedding_module(model)
    device = next(model.parameters()).device
    keyword = _cache_keyword(base)
    flat = [t.reshape(-1).cpu() for t in tokens]
    cache = DynamicCache(config=cast(Any, base).config)
    prefix_ids = to_device(flat[0][:prefix_length][None], device)
    prefix = base(inputs_embeds=embed(prefix_ids), use_cache=True, **{keyword: cache})
    prefix_hidden: Tensor = prefix.last_hidden_state.expand(len(flat), -1, -1)
    lengths = [int(t.numel()) - prefix_length for t in flat]
    width = max(lengths)
    if width == 0:  # every member is the prefix itself
        return prefix_hidden
    ids = torch.zeros(len(flat), width, dtype=torch.long)
    mask = torch.ones(len(flat), prefix_length + width, dtype=torch.long)
    for i, t in enumerate(flat):
        ids[i, : lengths[i]] = t[prefix_length:]
        mask[i, prefix_length + lengths[i] :] = 0
    _expand_cache(cache, len(flat))
    positions = torch.arange(prefix_length, prefix_length + width)[None].expand(len(flat), -1)
    suffix = base(
        inputs_embeds=embed(to_device(ids, device)),
        attention_mask=None if min(lengths) == width else to_device(mask, device),
        position_ids=to_device(positions, device),
        use_cache=True,
        **{keyword: cache},
    )
    return torch.cat([prefix_hidden, suffix.last_hidden_state], dim=1)


def shared_prefix_hidden(
    model: nn.Module, tokens: Sequence[Tensor], *, min_prefix: int = DEFAULT_MIN_PREFIX
) -> Tensor:
    """Last hidden states ``[B, L_max, H]`` of ``tokens`` (1-D id tensors), laid out as
    :func:`dressage.causal_lm.causal_lm_hidden`'s, each group's shared prefix run once.

    Gradients reach the parameters through the prefix as through the plain forward: the
    prefix's hidden states feed every member's row, its keys and values every suffix token.
    """
    lengths = [int(t.numel()) for t in tokens]
    if not lengths or min(lengths) == 0:
        raise ValueError(f"need one or more non-empty sequences, got lengths {lengths}")
    width = max(lengths)
    rows: list[Tensor] = []
    members: list[int] = []
    for group in prefix_groups(tokens, min_prefix=min_prefix):
        picked = [tokens[i] for i in group.members]
        if group.prefix_length:
            hidden = _group_hidden(model, picked, group.prefix_length)
        else:
            hidden = causal_lm_hidden(model, picked)
        rows.append(F.pad(hidden, (0, 0, 0, width - hidden.shape[1])))
        members += group.members
    stacked = torch.cat(rows) if len(rows) > 1 else rows[0]
    if members == sorted(members):
        return stacked
    inverse = torch.empty(len(members), dtype=torch.long)
    inverse[torch.tensor(members)] = torch.arange(len(members))
    return stacked.index_select(0, to_device(inverse, stacked.device))
