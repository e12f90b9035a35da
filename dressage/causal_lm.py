"""What the project needs of a Hugging Face causal LM: its embedding modules, checked, and the
last hidden states of a right-padded batch (so callers apply the vocabulary projection only
where they need logits). Shared by the trainer's log-probs (:mod:`dressage.training.log_probs`),
teacher streaming and the tiny teachers' fine-tuning (:mod:`dressage.tiny.teachers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import Tensor, nn

__all__ = ["causal_lm_hidden", "input_embedding_module", "output_embedding_module", "to_device"]


def input_embedding_module(model: nn.Module) -> nn.Module:
    """``model.get_input_embeddings()`` of a Hugging Face model, checked."""
    module = getattr(model, "get_input_embeddings", lambda: None)()
    if not isinstance(module, nn.Module):
        raise TypeError(f"{type(model).__name__} has no input embeddings (get_input_embeddings)")
    return module


def output_embedding_module(model: nn.Module) -> nn.Module:
    """``model.get_output_embeddings()`` (the vocabulary projection), checked."""
    module = getattr(model, "get_output_embeddings", lambda: None)()
    if not isinstance(module, nn.Module):
        raise TypeError(f"{type(model).__name__} has no output embeddings (get_output_embeddings)")
    return module


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """Host-to-device copy that never blocks the host behind queued GPU work (pinned, async).
    A tensor already on a GPU is moved with ``to``; an expanded view (rows sharing memory,
    which pinning refuses) is made contiguous first."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.contiguous().pin_memory().to(device, non_blocking=True)


def causal_lm_hidden(
    model: nn.Module,
    tokens: Sequence[Tensor],
    *,
    input_embeddings: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Last hidden states of a right-padded batch, ``[B, L_max, H]``.

    Runs ``model.base_model`` on ``inputs_embeds`` so the caller can supply the embeddings:
    ``input_embeddings`` maps the CPU id matrix ``[B, L_max]`` to device embeddings (teacher
    streaming gathers them from a CPU copy while the embedding matrix is in flight). Padding sits
    after each sequence, so causal attention never sees it and positions start at 0.
    """
    device = next(model.parameters()).device
    lengths = [int(t.numel()) for t in tokens]
    width = max(lengths)
    ids = torch.zeros(len(tokens), width, dtype=torch.long)
    mask = torch.zeros(len(tokens), width, dtype=torch.long)
    for i, t in enumerate(tokens):
        ids[i, : lengths[i]] = t.reshape(-1).cpu()
        mask[i, : lengths[i]] = 1
    if input_embeddings is not None:
        embeds = input_embeddings(ids)
    else:
        embeds = input_embedding_module(model)(to_device(ids, device))
    attention = None if min(lengths) == width else to_device(mask, device)
    base = cast(nn.Module, model.base_model)
    out = base(inputs_embeds=embeds, attention_mask=attention, use_cache=False)
    hidden: Tensor = out.last_hidden_state
    return hidden
