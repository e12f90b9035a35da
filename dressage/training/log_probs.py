"""Per-token log-probs and entropies of response tokens, bounded in memory.

Two layers:

* Tensor level, backend-neutral. ``response_log_probs(args, batch, logits)`` turns the logits a
  slime loss hook receives (packed: samples concatenated along the sequence, ``[1, T, V]``) into
  per-sample response log-probs on one rank (no TP, no CP). Loss hooks get their log-prob
  function through :func:`log_prob_function`: this one off Megatron, and slime's own
  ``get_log_probs_and_entropy`` (vocab-parallel logits, CP slices) inside slime's Megatron
  actor (:mod:`dressage.training.megatron_path`), so the same hooks run unchanged on both.
* Model level, for Hugging Face causal LMs (the embedded trainer and teacher scoring): a padded
  forward through ``model.base_model`` and the output embeddings applied in chunks of tokens, so
  full ``[T, V]`` logits exist only where the loss hook needs them. Samples that share a long
  prompt prefix (an agent's system prompt and tool list) have it computed once per group
  (:func:`dressage.shared_prefix.shared_prefix_hidden`; same values up to float rounding, and
  the plain padded forward where nothing is shared).

Vocabularies are large (Qwen3.5: 248k), so log-softmax runs over chunks of tokens
(``args.log_probs_chunk_size`` tokens, auto when <= 0) with a hand-written backward that
recomputes the softmax per chunk instead of storing it.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from dressage.causal_lm import causal_lm_hidden, output_embedding_module, to_device
from dressage.shared_prefix import shared_prefix_hidden
from dressage.slime.hooks import load_function
from dressage.slime.train_args import log_prob_args
from dressage.training.megatron_path import megatron_active, slime_response_log_probs

__all__ = [
    "LogProbFunction",
    "causal_lm_packed_logits",
    "causal_lm_response_hidden",
    "causal_lm_response_log_probs",
    "causal_lm_response_log_softmax",
    "chunk_rows",
    "log_prob_function",
    "response_log_probs",
    "response_positions",
    "token_entropy",
    "token_log_probs",
]

# (args, batch, logits, with_entropy) -> (per-sample log-probs, per-sample entropies or None)
LogProbFunction = Callable[..., tuple[list[Tensor], list[Tensor] | None]]

# logits elements per chunk when auto: 64 MiB of float32 on CPU, 512 MiB on a GPU (larger
# kernels; a few temporaries of this size are negligible next to a model).
_CHUNK_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 27}


def chunk_rows(vocab_size: int, chunk_tokens: int = 0, device: torch.device | None = None) -> int:
    """Tokens per chunk: ``chunk_tokens`` when positive, else a fixed logits budget."""
    if chunk_tokens > 0:
        return chunk_tokens
    budget = _CHUNK_ELEMENTS.get(device.type if device is not None else "cpu", 1 << 24)
    return max(1, budget // max(vocab_size, 1))


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """float32 ``logits / temperature`` (no extra copy at temperature 1)."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


class _TokenLogProb(torch.autograd.Function):
    """``log softmax(logits[rows] / T)[targets]`` without storing the softmax."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, rows: Tensor, targets: Tensor, temperature: float, chunk: int
    ) -> Tensor:
        out = torch.empty(rows.numel(), dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for s in range(0, rows.numel(), chunk):
            z = _scaled(logits.index_select(0, rows[s : s + chunk]), temperature)
            target = targets[s : s + chunk, None]
            # log_softmax is one fused pass (logsumexp takes several on CPU); lse follows from it.
            out[s : s + chunk] = torch.log_softmax(z, dim=-1).gather(-1, target).squeeze(-1)
            lse[s : s + chunk] = z.gather(-1, target).squeeze(-1) - out[s : s + chunk]
        ctx.save_for_backward(logits, rows, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        logits, rows, targets, lse = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        t, chunk = ctx.temperature, ctx.chunk
        for s in range(0, rows.numel(), chunk):
            r, g = rows[s : s + chunk], grad_out[s : s + chunk].float()
            z = _scaled(logits.index_select(0, r), t)
            # d/dz [z_y - lse(z)] = onehot(y) - softmax(z); the 1/T comes from z = logits / T.
            part = -torch.exp(z - lse[s : s + chunk, None]) * g[:, None]
            part.scatter_add_(-1, targets[s : s + chunk, None], g[:, None])
            grad.index_copy_(0, r, (part / t).to(grad.dtype))
        return grad, None, None, None, None


class _TokenEntropy(torch.autograd.Function):
    """Entropy of ``softmax(logits[rows] / T)`` per row, recomputing the softmax in backward."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, rows: Tensor, temperature: float, chunk: int) -> Tensor:
        out = torch.empty(rows.numel(), dtype=torch.float32, device=logits.device)
        for s in range(0, rows.numel(), chunk):
            logp = torch.log_softmax(
                _scaled(logits.index_select(0, rows[s : s + chunk]), temperature), -1
            )
            out[s : s + chunk] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(logits, rows, out)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        logits, rows, entropy = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        t, chunk = ctx.temperature, ctx.chunk
        for s in range(0, rows.numel(), chunk):
            r = rows[s : s + chunk]
            logp = torch.log_softmax(_scaled(logits.index_select(0, r), t), -1)
            # dH/dz = -p * (log p + H)
            part = -logp.exp() * (logp + entropy[s : s + chunk, None])
            part = part * grad_out[s : s + chunk, None].float() / t
            grad.index_copy_(0, r, part.to(grad.dtype))
        return grad, None, None, None


def token_log_probs(
    logits: Tensor,
    rows: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
) -> Tensor:
    """Log-prob of ``targets`` under ``logits[rows]``.

    Args:
        logits: ``[T, V]``, any float dtype; may require grad.
        rows: ``[N]`` long, distinct row indices into ``logits``.
        targets: ``[N]`` long token ids.

    Returns:
        ``[N]`` float32 log-probs (nats), differentiable in ``logits``.
    """
    chunk = chunk_rows(logits.shape[-1], chunk_tokens, logits.device)
    return _TokenLogProb.apply(logits, rows, targets, float(temperature), chunk)


def token_entropy(
    logits: Tensor, rows: Tensor, *, temperature: float = 1.0, chunk_tokens: int = 0
) -> Tensor:
    """Entropy (nats) of the next-token distribution at ``logits[rows]``, ``[N]`` float32."""
    chunk = chunk_rows(logits.shape[-1], chunk_tokens, logits.device)
    return _TokenEntropy.apply(logits, rows, float(temperature), chunk)


def response_positions(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    *,
    device: torch.device | None = None,
) -> tuple[Tensor, Tensor]:
    """Indices into the packed sequence for every response token, samples in order.

    Returns ``(logit_rows, token_rows)``, each ``[sum R_i]``: the row of the logits that predicts
    the token (one before it) and the row of the token itself.
    """
    logit_rows, token_rows, offset = [], [], 0
    for i, (total, resp) in enumerate(zip(total_lengths, response_lengths, strict=True)):
        if not 0 <= resp < total:
            raise ValueError(
                f"sample {i}: response_length {resp} must be in [0, total_length {total}) "
                "(a response needs at least one prompt token before it)"
            )
        start = offset + total - resp
        token_rows.append(torch.arange(start, offset + total))
        logit_rows.append(torch.arange(start - 1, offset + total - 1))
        offset += total
    if not token_rows:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return empty, empty
    return torch.cat(logit_rows).to(device), torch.cat(token_rows).to(device)


def _packed_tokens(batch: Mapping[str, Any]) -> Tensor:
    unconcat = batch.get("unconcat_tokens")
    if unconcat is not None:
        return torch.cat([torch.as_tensor(t).reshape(-1) for t in unconcat])
    tokens = batch.get("tokens")
    if tokens is None:
        raise KeyError("loss batch has neither 'unconcat_tokens' nor 'tokens'")
    if isinstance(tokens, Tensor):
        return tokens.reshape(-1)
    return torch.cat([torch.as_tensor(t).reshape(-1) for t in tokens])


def response_log_probs(
    args: Namespace, batch: Mapping[str, Any], logits: Tensor, with_entropy: bool = False
) -> tuple[list[Tensor], list[Tensor] | None]:
    """Per-sample response log-probs (and entropies) from packed logits; one rank, no TP/CP.

    Args:
        args: reads ``rollout_temperature`` (logits are divided by it, as slime does; default 1)
            and ``log_probs_chunk_size``.
        batch: slime's loss batch: ``total_lengths``, ``response_lengths`` and the tokens
            (``unconcat_tokens`` per sample, or ``tokens`` packed ``[1, T]``).
        logits: ``[1, T', V]`` or ``[T', V]`` with ``T' >= sum total_lengths`` (trailing padding
            ignored); row ``j`` predicts packed token ``j + 1``.

    Returns:
        ``(log_probs, entropies)``: lists of ``[R_i]`` float32 tensors, differentiable in
        ``logits``; ``entropies`` is None unless ``with_entropy``.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    total, resp = list(batch["total_lengths"]), list(batch["response_lengths"])
    rows, token_rows = response_positions(total, resp, device=flat.device)
    targets = _packed_tokens(batch).to(flat.device).index_select(0, token_rows)
    view = log_prob_args(args)
    temperature, chunk = view.rollout_temperature, view.chunk_tokens
    logp = token_log_probs(flat, rows, targets, temperature=temperature, chunk_tokens=chunk)
    split = [int(r) for r in resp]
    entropy = None
    if with_entropy:
        ent = token_entropy(flat, rows, temperature=temperature, chunk_tokens=chunk)
        entropy = list(ent.split(split))
    return list(logp.split(split)), entropy


def log_prob_function(args: Namespace) -> LogProbFunction:
    """The logits→log-prob function for loss hooks.

    ``args.log_prob_function_path`` when set; slime's own (vocab-parallel, CP-aware) path when
    Megatron's parallel state is up (:mod:`dressage.training.megatron_path`); else ours.
    """
    path = log_prob_args(args).log_prob_function_path
    if path:
        return load_function(path)
    if megatron_active():
        return slime_response_log_probs
    return response_log_probs


# --- Hugging Face causal LMs -------------------------------------------------------------------


def causal_lm_response_log_probs(
    model: nn.Module,
    tokens: Sequence[Tensor],
    response_lengths: Sequence[int],
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    input_embeddings: Callable[[Tensor], Tensor] | None = None,
) -> list[Tensor]:
    """Log-probs of each sample's last ``R_i`` tokens under ``model``: list of ``[R_i]`` float32.

    The output embeddings run over chunks of response positions only; prompt positions never
    reach the vocabulary projection. Call under ``torch.no_grad()`` for scoring.
    """
    h, target, head = causal_lm_response_hidden(
        model, tokens, response_lengths, input_embeddings=input_embeddings
    )
    chunk = chunk_rows(int(cast(Tensor, head.weight).shape[0]), chunk_tokens, h.device)
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for s in range(0, h.shape[0], chunk):
        z = _scaled(head(h[s : s + chunk]), temperature)
        out[s : s + chunk] = (
            torch.log_softmax(z, dim=-1).gather(-1, target[s : s + chunk, None]).squeeze(-1)
        )
    return list(out.split([int(r) for r in response_lengths]))


def causal_lm_response_log_softmax(
    model: nn.Module,
    tokens: Sequence[Tensor],
    response_lengths: Sequence[int],
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    input_embeddings: Callable[[Tensor], Tensor] | None = None,
) -> list[Tensor]:
    """The whole next-token log-softmax at each sample's response positions: ``[R_i, V]`` float32.

    Row ``t`` is the distribution the sampled token ``t`` was drawn from (the dense MOPD
    objective's teacher, :mod:`dressage.training.mopd_dense`); the output holds ``sum R_i x V``
    floats, so keep it to small vocabularies. Call under ``torch.no_grad()``.
    """
    h, _, head = causal_lm_response_hidden(
        model, tokens, response_lengths, input_embeddings=input_embeddings
    )
    vocab = int(cast(Tensor, head.weight).shape[0])
    chunk = chunk_rows(vocab, chunk_tokens, h.device)
    out = torch.empty(h.shape[0], vocab, dtype=torch.float32, device=h.device)
    for s in range(0, h.shape[0], chunk):
        out[s : s + chunk] = torch.log_softmax(_scaled(head(h[s : s + chunk]), temperature), -1)
    return list(out.split([int(r) for r in response_lengths]))


def causal_lm_response_hidden(
    model: nn.Module,
    tokens: Sequence[Tensor],
    response_lengths: Sequence[int],
    *,
    input_embeddings: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor, nn.Module]:
    """Hidden states that predict the response tokens ``[sum R_i, H]``, those tokens
    ``[sum R_i]`` (on the same device) and the output embedding module, samples in order: what
    a scoring pass applies the vocabulary projection to, a chunk of rows at a time."""
    hidden = (
        shared_prefix_hidden(model, tokens)
        if input_embeddings is None
        else causal_lm_hidden(model, tokens, input_embeddings=input_embeddings)
    )
    rows_h, targets = [], []
    for i, (t, resp) in enumerate(zip(tokens, response_lengths, strict=True)):
        total = int(t.numel())
        if not 0 <= resp < total:
            raise ValueError(f"sample {i}: response_length {resp} not in [0, {total})")
        rows_h.append(hidden[i, total - resp - 1 : total - 1])
        targets.append(t.reshape(-1)[total - resp :])
    h = torch.cat(rows_h)
    return h, to_device(torch.cat(targets).cpu(), h.device), output_embedding_module(model)


def causal_lm_packed_logits(model: nn.Module, tokens: Sequence[Tensor]) -> Tensor:
    """Logits in slime's packed layout, ``[1, sum L_i, V]``: what a loss hook receives."""
    hidden = shared_prefix_hidden(model, tokens)
    packed = torch.cat([hidden[i, : int(t.numel())] for i, t in enumerate(tokens)])
    logits: Tensor = output_embedding_module(model)(packed)
    return logits.unsqueeze(0)
