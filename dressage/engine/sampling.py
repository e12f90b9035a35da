"""Sampling parameters and the batched lm_head + sampler.

What the logprobs are (matching SGLang's default sampler, ``SGLANG_RETURN_ORIGINAL_LOGPROB``
unset): ``output_token_logprobs[i][0] = log_softmax(logits / T)[token]``, the log-probability under
the temperature-scaled distribution *before* top-k / top-p / min-p truncation. Greedy requests
(``temperature < 1e-6``) use ``T = 1``, so their logprobs are ``log_softmax(logits)``; with
``temperature = 1`` (what RL rollouts use) they equal a plain full forward's log-softmax.

Why the lm_head is chunked: for the tiny model the ``[B, hidden] x [hidden, vocab=248k]`` product
and one pass over the ``[B, 248k]`` logits dominate a decode step. Materialising all logits costs a
32 MB write plus fresh-page faults per step; instead the vocabulary is processed in chunks that
stay in L2 cache, split over CPU threads. Each chunk leaves only its row maxima and the sums of
``exp(logit - max)`` over 64-token blocks (computed as ``exp2`` of logits in bits, several times
cheaper than ``exp``). That is enough for an exact log-normaliser and for exact inverse-CDF
sampling: pick a block by its mass, then recompute the chosen block's 64 logits and pick inside
it. One uniform number per request and step drives the choice, a hash of the request's seed
(``sampling_seed``) and the token's position, so a seed reproduces regardless of the batch.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch


class StepInterrupted(Exception):
    """The vocabulary pass stopped early because a pause or abort-all is waiting."""


_BLOCK = 64
_GREEDY_BELOW = 1e-6  # SGLang turns temperatures in [0, 1e-6) into greedy decoding
_TOPK_PROBE = 1024  # top-p first looks for its nucleus among this many tokens before a full sort
_PAD_BATCH = 32
_MAX_BUFFERS = 8
_FLOAT_MIN = torch.finfo(torch.float32).min
_LOG2E = 1.0 / math.log(2.0)
_LN2 = math.log(2.0)


@dataclass(frozen=True)
class SamplingParams:
    """Validated ``sampling_params`` of one request (see ``protocol.parse_sampling_params``)."""

    max_new_tokens: int | None = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    stream_interval: int = 1
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: tuple[str, str] | None = None
    """(``json_schema`` | ``regex`` | ``ebnf`` | ``structural_tag``, its text)."""

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_BELOW or self.top_k == 1

    @property
    def inv_temperature(self) -> float:
        return 1.0 if self.temperature < _GREEDY_BELOW else 1.0 / self.temperature

    @property
    def has_filter(self) -> bool:
        return not self.greedy and (self.top_k > 1 or self.top_p < 1.0 or self.min_p > 0.0)


@dataclass(frozen=True)
class _ChunkPass:
    """What one pass over the vocabulary leaves: see ``VocabSampler._chunk_pass``."""

    chunk_rows: int
    maxima: torch.Tensor  # [chunks, B] row maxima of the (temperature-scaled) logits per chunk
    blocks: torch.Tensor  # [blocks, B] sums of exp(logit - chunk max) over 64-token blocks
    kept: torch.Tensor | None  # [V, F] raw logits of the filtered rows


@dataclass(frozen=True)
class RowSpec:
    """What the sampler needs for one row of a step."""

    inv_temperature: float
    greedy: bool
    uniform: float  # in [0, 1), from the request's generator
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before temperature, as SGLang does."""
    allowed: torch.Tensor | None = None
    """The grammar's bitmask of this step (int32 words, xgrammar's layout), or None."""
    top_logprobs: int = 0
    """Return this many most likely tokens with their log-probs (``top_logprobs_num``)."""

    @property
    def has_filter(self) -> bool:
        return not self.greedy and (self.top_k > 1 or self.top_p < 1.0 or self.min_p > 0.0)

    @property
    def whole_row(self) -> bool:
        """The row is sampled from its whole logits row (bias, grammar mask or top log-probs)."""
        return bool(self.logit_bias) or self.allowed is not None or self.top_logprobs > 0

    @staticmethod
    def of(
        params: SamplingParams,
        uniform: float,
        allowed: torch.Tensor | None = None,
        top_logprobs: int = 0,
    ) -> RowSpec:
        return RowSpec(
            params.inv_temperature,
            params.greedy,
            uniform,
            params.top_k,
            params.top_p,
            params.min_p,
            params.logit_bias,
            allowed,
            top_logprobs,
        )


TopLogprobs = list[tuple[float, int]]
"""A position's most likely tokens, ``(logprob, token id)``, most likely first."""


class VocabSampler:
    """lm_head + sampling for a batch of last hidden states.

    Args:
        lm_head: the model's output embedding (``weight`` [V, H], optional ``bias`` [V]); read at
            every call, so in-place weight updates are seen.
        chunk_elements: logits held at once per chunk (``rows x batch``); ``None`` = one chunk
            (right for GPUs, where memory traffic is not the bottleneck).
    """

    def __init__(
        self, lm_head: torch.nn.Module, *, chunk_elements: int | None, workers: int = 1
    ) -> None:
        self.lm_head = lm_head
        self.vocab_size = int(self._weight.shape[0])
        self.chunk_elements = chunk_elements
        self._buffers: dict[tuple[int, int, int], torch.Tensor] = {}
        # CPU: the vocabulary pass is split over threads, each working single-threaded on its
        # own chunks and its own L2-sized buffer (no per-op barriers, unlike intra-op threads).
        self._pool = ThreadPoolExecutor(workers, "dressage-lm-head") if workers > 1 else None
        self.workers = workers

    @property
    def _weight(self) -> torch.Tensor:
        weight = self.lm_head.weight
        assert isinstance(weight, torch.Tensor)
        return weight

    @property
    def _bias(self) -> torch.Tensor | None:
        bias = getattr(self.lm_head, "bias", None)
        return bias if isinstance(bias, torch.Tensor) else None

    # ----------------------------------------------------------------------------------------
    def sample(
        self,
        hidden: torch.Tensor,
        rows: Sequence[RowSpec],
        interrupt: threading.Event | None = None,
    ) -> tuple[list[int], list[float]]:
        """Pick one token per row. hidden [B, H] -> (token ids [B], logprobs [B]).

        Raises :class:`StepInterrupted` (nothing chosen) if ``interrupt`` is set mid-pass.
        """
        tokens, logprobs, _ = self.sample_rows(hidden, rows, interrupt)
        return tokens, logprobs

    def sample_rows(
        self,
        hidden: torch.Tensor,
        rows: Sequence[RowSpec],
        interrupt: threading.Event | None = None,
    ) -> tuple[list[int], list[float], list[TopLogprobs | None]]:
        """:meth:`sample`, plus each row's top log-probs (None where not asked for).

        A row with a logit bias, a grammar mask or top log-probs is sampled from its whole
        logits row (:meth:`_whole_rows`): biased, masked (disallowed tokens at -inf), then
        temperature, then top-k / top-p / min-p; its log-prob is taken under the biased and
        masked distribution at the temperature, before truncation (SGLang's order: the logit
        bias and the grammar's vocabulary mask are applied to the logits before its sampler).
        """
        batch = hidden.shape[0]
        device = hidden.device
        inv_t = torch.tensor([r.inv_temperature for r in rows], dtype=torch.float32, device=device)
        whole = [i for i, r in enumerate(rows) if r.whole_row]
        filtered = [i for i, r in enumerate(rows) if r.has_filter or r.whole_row]
        padded = self._padded(batch)
        # The pass works in base 2 (exp2 is several times cheaper than exp on CPU): the hidden
        # columns carry 1/T * log2(e), so the lm_head directly yields logits / T in bits.
        scale = inv_t * _LOG2E
        hidden_p, scale_p = hidden, scale
        if padded > batch:
            hidden_p = torch.cat([hidden, hidden.new_zeros(padded - batch, hidden.shape[1])])
            scale_p = torch.cat([scale, scale.new_full((padded - batch,), _LOG2E)])
        pass_out = self._chunk_pass(hidden_p, scale_p, filtered, interrupt)
        maxima, blocks = pass_out.maxima[:, :batch], pass_out.blocks[:, :batch]
        top = maxima.amax(0)  # [B], in bits
        chunks = maxima.shape[0]
        rescale = torch.exp2(maxima - top)[:, None, :]
        blocks = (blocks.unflatten(0, (chunks, -1)) * rescale).flatten(0, 1)  # [nb, B]
        total = blocks.sum(0)  # sum over the vocabulary of exp(logit / T - top)
        log_norm = top * _LN2 + total.log()  # natural log of the softmax normaliser

        tokens = torch.zeros(batch, dtype=torch.long, device=device)
        uniforms = torch.tensor([r.uniform for r in rows], dtype=torch.float32, device=device)
        greedy = [i for i, r in enumerate(rows) if r.greedy and not r.whole_row]
        plain = [i for i, r in enumerate(rows) if not r.greedy and not r.has_filter]
        plain = [i for i in plain if not rows[i].whole_row]
        filtered_only = [i for i in filtered if not rows[i].whole_row]
        if greedy:
            tokens[greedy] = self._argmax(hidden, maxima, greedy, pass_out.chunk_rows)
        if plain:
            index = torch.tensor(plain, device=device)
            tokens[index] = self._inverse_cdf(
                hidden[index],
                blocks[:, index],
                top[index],
                scale[index],
                uniforms[index] * total[index],
            )
        tops: list[TopLogprobs | None] = [None] * batch
        if filtered:
            assert pass_out.kept is not None
            logits = pass_out.kept.T * _LN2  # kept logits are logit / T in bits
            if filtered_only:
                at = [filtered.index(i) for i in filtered_only]
                tokens[filtered_only] = self._filtered(logits[at], [rows[i] for i in filtered_only])
        chosen = self._logits_at(hidden, tokens) * inv_t
        # a certain token's logprob is 0; rounding in the base-2 pass must not lift it above
        out = (chosen - log_norm).clamp(min=_FLOAT_MIN, max=0.0).tolist()
        if whole:
            at = [filtered.index(i) for i in whole]
            picked = self._whole_rows(logits[at], [rows[i] for i in whole])
            for i, (chosen_id, chosen_logprob, row_top) in zip(whole, picked, strict=True):
                tokens[i] = chosen_id
                out[i] = chosen_logprob
                tops[i] = row_top
        return tokens.tolist(), out, tops

    def prompt_logprobs(self, hidden: torch.Tensor, targets: Sequence[int]) -> list[float]:
        """log_softmax(logits)[target] per position (T = 1). hidden [N, H], targets [N]."""
        out: list[float] = []
        weight, bias = self._weight, self._bias
        for start in range(0, len(targets), 64):
            h = hidden[start : start + 64]
            logits = torch.nn.functional.linear(h, weight, bias).float()
            index = torch.tensor(targets[start : start + 64], device=h.device)[:, None]
            lp = logits.gather(1, index)[:, 0] - torch.logsumexp(logits, 1)
            # JSON has no -inf (as SGLang clamps); rounding must not lift a certain token above 0
            out.extend(lp.clamp(min=_FLOAT_MIN, max=0.0).tolist())
        return out

    # ----------------------------------------------------------------------------------------
    def _chunk_rows(self, batch: int) -> int:
        vocab_blocks = -(-self.vocab_size // _BLOCK) * _BLOCK
        if self.chunk_elements is None:
            return vocab_blocks
        rows = max(_BLOCK, (self.chunk_elements // batch) // _BLOCK * _BLOCK)
        return min(rows, vocab_blocks)

    def _buffer(self, rows: int, batch: int, device: torch.device, worker: int) -> torch.Tensor:
        """A reused [rows, batch] logits buffer per worker (fresh big buffers fault in pages)."""
        key = (rows, batch, worker)
        buf = self._buffers.pop(key, None)
        if buf is None or buf.device != device:
            while len(self._buffers) >= _MAX_BUFFERS:  # least recently used goes first
                self._buffers.pop(next(iter(self._buffers)))
            buf = torch.empty(rows, batch, dtype=torch.float32, device=device)
        self._buffers[key] = buf
        return buf

    def _padded(self, batch: int) -> int:
        """CPU: lm_head batches go up in steps of 32 columns. The matmul costs about the same
        from 8 to 32 columns, and the column-wise max is only vectorised at full width."""
        if self.chunk_elements is None or batch == 1:
            return batch
        return -(-batch // _PAD_BATCH) * _PAD_BATCH

    def _chunk_pass(
        self,
        hidden: torch.Tensor,
        scale: torch.Tensor,
        keep: list[int],
        interrupt: threading.Event | None = None,
    ) -> _ChunkPass:
        """Per-chunk maxima [chunks, B] of ``logit * scale``, block sums of
        ``exp2(logit * scale - chunk max)`` [blocks, B] and, for the rows in ``keep``, the scaled
        logits [V, len(keep)] (top-k/top-p/min-p need the whole row)."""
        weight, bias = self._weight, self._bias
        batch, vocab = hidden.shape[0], self.vocab_size
        rows = self._chunk_rows(batch)
        chunks = -(-vocab // rows)
        per_chunk = rows // _BLOCK
        hidden_t = (hidden.float() * scale[:, None]).T.contiguous().to(weight.dtype)
        maxima = torch.empty(chunks, batch, dtype=torch.float32, device=hidden.device)
        blocks = torch.empty(chunks * per_chunk, batch, dtype=torch.float32, device=hidden.device)
        kept = None
        if keep:
            kept = torch.empty(vocab, len(keep), dtype=torch.float32, device=hidden.device)
            keep_index = torch.tensor(keep, device=hidden.device)

        def run(chunk_ids: range, buf: torch.Tensor) -> bool:
            with torch.inference_mode():  # thread-local: pool threads need it too
                for c in chunk_ids:
                    if interrupt is not None and interrupt.is_set():
                        return False
                    lo, hi = c * rows, min(vocab, (c + 1) * rows)
                    out = buf[: hi - lo]
                    if weight.dtype == torch.float32:
                        torch.mm(weight[lo:hi], hidden_t, out=out)
                    else:
                        out.copy_(torch.mm(weight[lo:hi], hidden_t))
                    if bias is not None:
                        out.add_(bias[lo:hi, None].float() * scale[None, :])
                    if hi - lo < rows:
                        buf[hi - lo :].fill_(-math.inf)  # padding rows carry no mass
                    if kept is not None:
                        torch.index_select(out, 1, keep_index, out=kept[lo:hi])
                    row_max = maxima[c]
                    torch.amax(buf, 0, out=row_max)
                    buf.sub_(row_max).exp2_()
                    torch.sum(
                        buf.view(per_chunk, _BLOCK, batch),
                        1,
                        out=blocks[c * per_chunk : (c + 1) * per_chunk],
                    )
            return True

        shards = min(self.workers, chunks) if self._pool is not None else 1
        if shards == 1:
            complete = run(range(chunks), self._buffer(rows, batch, hidden.device, 0))
        else:
            assert self._pool is not None
            futures = [
                self._pool.submit(
                    run, range(w, chunks, shards), self._buffer(rows, batch, hidden.device, w)
                )
                for w in range(shards)
            ]
            complete = all([future.result() for future in futures])
        if not complete:
            raise StepInterrupted
        return _ChunkPass(rows, maxima, blocks, kept)

    def _rows_logits(self, hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Logits of token ids ``index`` [N, K] for the rows of ``hidden`` [N, H] -> [N, K]."""
        weight, bias = self._weight, self._bias
        flat = index.reshape(-1)
        gathered = weight[flat].view(index.shape[0], index.shape[1], -1)
        logits = torch.bmm(gathered, hidden.to(weight.dtype)[:, :, None])[:, :, 0].float()
        if bias is not None:
            logits = logits + bias[flat].view(index.shape).float()
        return logits

    def _logits_at(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._rows_logits(hidden, tokens[:, None])[:, 0]

    def _argmax(
        self, hidden: torch.Tensor, maxima: torch.Tensor, rows: list[int], chunk_rows: int
    ) -> torch.Tensor:
        """Greedy tokens: the first chunk holding the row's maximum, then its argmax there."""
        weight, bias = self._weight, self._bias
        best = maxima[:, rows].argmax(0).tolist()
        out = []
        for row, chunk in zip(rows, best, strict=True):
            lo, hi = chunk * chunk_rows, min(self.vocab_size, (chunk + 1) * chunk_rows)
            logits = torch.mv(weight[lo:hi], hidden[row].to(weight.dtype)).float()
            if bias is not None:
                logits = logits + bias[lo:hi].float()
            out.append(lo + int(logits.argmax()))
        return torch.tensor(out, device=hidden.device)

    def _inverse_cdf(
        self,
        hidden: torch.Tensor,
        blocks: torch.Tensor,
        top: torch.Tensor,
        scale: torch.Tensor,
        target: torch.Tensor,
    ) -> torch.Tensor:
        """Exact inverse-CDF sampling: the block where the cumulative mass passes ``target``, then
        the token inside that block. blocks [nb, N] (already relative to ``top`` [N], in bits),
        scale [N] = log2(e) / T, target [N]."""
        cdf = blocks.T.cumsum(1)  # [N, nb]
        nb = cdf.shape[1]
        block = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=nb - 1)
        before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
        residual = target[:, None] - before
        ids = block * _BLOCK + torch.arange(_BLOCK, device=hidden.device)[None, :]
        valid = ids < self.vocab_size
        logits = self._rows_logits(hidden, ids.clamp(max=self.vocab_size - 1))
        mass = torch.exp2(logits * scale[:, None] - top[:, None]) * valid
        pick = torch.searchsorted(mass.cumsum(1), residual, right=True)
        pick = torch.minimum(pick, _last_positive(mass)[:, None])
        return (block * _BLOCK + pick)[:, 0]

    def _filtered(self, logits: torch.Tensor, rows: Sequence[RowSpec]) -> torch.Tensor:
        """top-k / top-p / min-p rows. logits [F, V] (already temperature-scaled).

        Same truncation as SGLang: over the probabilities sorted high to low, keep rank < top_k,
        keep a token if the mass *before* it is <= top_p, keep p >= min_p * p_max.
        """
        probs = torch.softmax(logits, dim=1)
        out = []
        for p, row in zip(probs, rows, strict=True):
            vals, ids = _candidates(p, row)
            if row.top_p < 1.0:
                vals = vals * ((vals.cumsum(0) - vals) <= row.top_p)
            if row.min_p > 0.0:
                vals = vals * (vals >= row.min_p * p.max())
            cdf = vals.cumsum(0)
            j = int(torch.searchsorted(cdf, cdf[-1:] * row.uniform, right=True)[0])
            j = min(j, int(_last_positive(vals[None, :])[0]))
            out.append(int(ids[j]))
        return torch.tensor(out, device=logits.device)

    def _whole_rows(
        self, logits: torch.Tensor, rows: Sequence[RowSpec]
    ) -> list[tuple[int, float, TopLogprobs | None]]:
        """Rows sampled from their whole logits (see :meth:`sample_rows`). logits [W, V],
        already divided by the temperature."""
        out = []
        for row_logits, row in zip(logits, rows, strict=True):
            z = row_logits.clone()
            if row.logit_bias:
                ids = torch.tensor([t for t, _ in row.logit_bias], device=z.device)
                bias = torch.tensor([b for _, b in row.logit_bias], device=z.device)
                z.index_add_(0, ids, bias * row.inv_temperature)
            if row.allowed is not None:
                z.masked_fill_(~_unpack_bitmask(row.allowed, z.shape[0]), -math.inf)
            logprobs = torch.log_softmax(z, 0)
            if row.greedy:
                token = int(z.argmax())
            else:
                p = logprobs.exp()
                vals, ids = _candidates(p, row)
                if row.top_p < 1.0:
                    vals = vals * ((vals.cumsum(0) - vals) <= row.top_p)
                if row.min_p > 0.0:
                    vals = vals * (vals >= row.min_p * p.max())
                cdf = vals.cumsum(0)
                j = int(torch.searchsorted(cdf, cdf[-1:] * row.uniform, right=True)[0])
                j = min(j, int(_last_positive(vals[None, :])[0]))
                token = int(ids[j])
            logprob = float(logprobs[token].clamp(min=_FLOAT_MIN, max=0.0))
            top = None
            if row.top_logprobs > 0:
                k = min(row.top_logprobs, z.shape[0])
                values, ids = torch.topk(logprobs, k)
                top = [
                    (float(v), int(t))
                    for v, t in zip(
                        values.clamp(min=_FLOAT_MIN).tolist(), ids.tolist(), strict=True
                    )
                ]
            out.append((token, logprob, top))
        return out


def _unpack_bitmask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's int32 bitmask (bit j of word i: token 32 i + j allowed) as a bool [vocab]."""
    bits = torch.arange(32, dtype=torch.int32, device=words.device)
    allowed = ((words.reshape(-1)[:, None] >> bits) & 1).bool().reshape(-1)
    if allowed.shape[0] < vocab:  # rows past the tokenizer's vocabulary are never allowed
        allowed = torch.cat([allowed, allowed.new_zeros(vocab - allowed.shape[0])])
    return allowed[:vocab]


def _candidates(p: torch.Tensor, row: RowSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities in descending order (as many as the filters can keep) and their ids."""
    vocab = p.shape[0]
    if 1 < row.top_k < vocab:
        vals, ids = torch.topk(p, row.top_k)
        return vals, ids
    if row.top_p < 1.0:
        probe = min(vocab, _TOPK_PROBE)
        vals, ids = torch.topk(p, probe)
        if float(vals.sum()) > row.top_p or probe == vocab:
            return vals, ids
        vals, ids = torch.sort(p, descending=True)
        return vals, ids
    return p, torch.arange(vocab, device=p.device)  # min_p only: no ordering needed


def _last_positive(mass: torch.Tensor) -> torch.Tensor:
    """Index of the last entry > 0 in each row of ``mass`` [N, K] (0 if none)."""
    k = mass.shape[1]
    positions = torch.arange(1, k + 1, device=mass.device)[None, :] * (mass > 0)
    return (positions.amax(1) - 1).clamp(min=0)
