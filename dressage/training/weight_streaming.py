"""Stream another model's weights into the live parameters while the current model computes.

Teacher rotation shares one set of GPU parameter buffers between the student and every teacher.
Restoring a whole 8 GB teacher before scoring costs ~150 ms of idle GPU at ~55 GB/s; this module
hides it. Parameters are grouped by decoder layer (the model's largest ``nn.ModuleList``) plus
one *outer* group (embeddings, final norm, output head). For a transition from model A to
model B:

* during A's **last** micro-batch, a forward hook after decoder layer ``i`` records an event on
  the compute stream; a side copy stream waits on it and copies B's layer ``i`` from pinned CPU
  into the shared buffers. The outer group follows once A's forward (output head included) is
  queued.
* in B's forward, a pre-hook on layer ``i`` makes the compute stream wait for that layer's copy
  event, and pre-hooks on the outer modules wait for the outer copy. B's first micro-batch takes
  its input embeddings from B's CPU copy (a row gather on the host, done while the GPU still runs
  A), so layer 0 can start before the large embedding matrix has landed.
* with no forward to hide behind (the first swap of a scoring call), everything is queued at
  once, outer group first, and B's layers start as soon as their own copies land.

So B's layer ``i`` lands while A computes layers ``i+1..N`` and the transfer is hidden whenever a
layer's compute is at least its copy time. GPU memory stays one model; ordering is by CUDA
events, never by host synchronisation. On CPU the same logic runs with :class:`InlineCopies`,
which copies at once in program order (the hooks fire after A's last use of each layer, so the
result is identical to a sequential restore; the tests check exactly that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dressage.causal_lm import to_device

__all__ = ["CopyEngine", "CudaCopies", "InlineCopies", "LayerStreamer", "find_layer_list"]

CopyPairs = list[tuple[Tensor, Tensor]]  # (destination, source)


class CopyEngine(Protocol):
    """Where weight copies run and how compute waits for them."""

    def mark_compute(self) -> Any: ...
    def copy_after(self, ready: Any, pairs: CopyPairs) -> Any: ...
    def wait(self, done: Any) -> None: ...
    def synchronize(self) -> None: ...


class InlineCopies:
    """No side stream: copy immediately. Used on CPU and to test the schedule's logic."""

    def mark_compute(self) -> None:
        return None

    def copy_after(self, ready: Any, pairs: CopyPairs) -> None:
        for dst, src in pairs:
            dst.copy_(src)

    def wait(self, done: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None


class CudaCopies:
    """Copies on a side CUDA stream, ordered after compute-stream events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def mark_compute(self) -> Any:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def copy_after(self, ready: Any, pairs: CopyPairs) -> Any:
        with torch.cuda.stream(self.stream):
            if ready is not None:
                self.stream.wait_event(ready)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return done

    def wait(self, done: Any) -> None:
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)

    def synchronize(self) -> None:
        self.stream.synchronize()


def find_layer_list(model: nn.Module) -> nn.ModuleList:
    """The model's repeated blocks: the ``nn.ModuleList`` holding the most parameters."""
    candidates = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not candidates:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList of layers to stream")
    return max(candidates, key=lambda m: sum(p.numel() for p in m.parameters()))


class LayerStreamer:
    """Schedules group-wise weight copies between models that share ``params``.

    Args:
        model: the live model (hooks are installed on its layers and outer modules).
        params: name -> live parameter (tied parameters once).
        backups: tag -> name -> CPU tensor (pinned on CUDA).
        copies: :class:`CudaCopies` or :class:`InlineCopies`.
    """

    def __init__(
        self,
        model: nn.Module,
        params: Mapping[str, nn.Parameter],
        backups: Mapping[str, Mapping[str, Tensor]],
        copies: CopyEngine,
    ) -> None:
        self.model, self.params, self.backups, self.copies = model, params, backups, copies
        by_id = {id(p): name for name, p in params.items()}
        self.layers = list(find_layer_list(model))
        self.layer_names = [
            sorted({by_id[id(p)] for p in layer.parameters() if id(p) in by_id})
            for layer in self.layers
        ]
        in_layers = {n for names in self.layer_names for n in names}
        self.outer_names = [n for n in params if n not in in_layers]
        outer_ids = {id(params[n]) for n in self.outer_names}
        self.outer_modules = [
            m
            for m in model.modules()
            if any(id(p) in outer_ids for p in m.parameters(recurse=False))
        ]
        embedding = getattr(model, "get_input_embeddings", lambda: None)()
        self._embedding_name: str | None = None
        if isinstance(embedding, nn.Embedding) and id(embedding.weight) in outer_ids:
            self._embedding_name = by_id[id(embedding.weight)]
            self._embedding = embedding
        self._layer_ready: dict[int, Any] = {}
        self._outer_ready: Any = None
        self._outer_pending_for: str | None = None
        self._armed: tuple[str, str] | None = None

    # -- hooks ---------------------------------------------------------------------------------

    @contextmanager
    def installed(self) -> Iterator[LayerStreamer]:
        """Install the hooks for the duration of a scoring pass; always removed."""
        handles = []
        for i, layer in enumerate(self.layers):
            handles.append(layer.register_forward_pre_hook(self._before_layer(i)))
            handles.append(layer.register_forward_hook(self._after_layer(i)))
        for module in self.outer_modules:
            handles.append(module.register_forward_pre_hook(self._before_outer))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _before_layer(self, i: int) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any) -> None:
            if i in self._layer_ready:
                self.copies.wait(self._layer_ready.pop(i))

        return hook

    def _after_layer(self, i: int) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if self._armed is not None:
                self._layer_ready[i] = self.copies.copy_after(
                    self.copies.mark_compute(), self._pairs(self.layer_names[i], self._armed[1])
                )

        return hook

    def _before_outer(self, module: nn.Module, inputs: Any) -> None:
        if self._outer_ready is not None:
            self.copies.wait(self._outer_ready)
            self._outer_ready = None
            self._outer_pending_for = None

    # -- schedule ------------------------------------------------------------------------------

    def _pairs(self, names: list[str], tag: str) -> list[tuple[Tensor, Tensor]]:
        source = self.backups[tag]
        return [(self.params[n].detach(), source[n]) for n in names]

    def transition_now(self, tag: str) -> None:
        """Copy ``tag`` in with no forward of ours to hide behind.

        The copies still wait for everything already queued on the compute stream: work queued
        before scoring (an optimizer step, a restore, another model's forward) may still read or
        write the shared buffers, and a side-stream copy that ignored it would race it.
        The outer group goes first: the embedding lookup is the first thing ``tag``'s forward
        needs, and waiting for it is cheaper than gathering rows on the host while no GPU work
        is queued to hide that gather.
        """
        queued = self.copies.mark_compute()
        self._outer_ready = self.copies.copy_after(queued, self._pairs(self.outer_names, tag))
        self._outer_pending_for = None  # wait for the copy; no host-side embedding gather
        for i, names in enumerate(self.layer_names):
            self._layer_ready[i] = self.copies.copy_after(queued, self._pairs(names, tag))

    def arm(self, current: str, following: str) -> None:
        """During the next forward (``current``'s last), stream ``following`` in behind it."""
        self._armed = (current, following)

    def forward_done(self) -> None:
        """Call after each forward: an armed transition now queues the outer group and ends."""
        if self._armed is None:
            return
        tag = self._armed[1]
        self._armed = None
        self._outer_ready = self.copies.copy_after(
            self.copies.mark_compute(), self._pairs(self.outer_names, tag)
        )
        self._outer_pending_for = tag

    def input_embeddings(self, tag: str) -> Callable[[Tensor], Tensor] | None:
        """Embeddings from ``tag``'s CPU copy while its embedding matrix is still in flight."""
        if self._embedding_name is None or self._outer_pending_for != tag:
            return None
        table = self.backups[tag][self._embedding_name]
        device = self._embedding.weight.device

        def embed(ids: Tensor) -> Tensor:
            return to_device(F.embedding(ids.cpu(), table), device)

        return embed

    def finish(self) -> None:
        """Order the compute stream after every outstanding copy and wait for the copy stream."""
        for done in self._layer_ready.values():
            self.copies.wait(done)
        self._layer_ready.clear()
        if self._outer_ready is not None:
            self.copies.wait(self._outer_ready)
        self._outer_ready, self._outer_pending_for, self._armed = None, None, None
        self.copies.synchronize()
