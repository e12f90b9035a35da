"""Teacher rotation: several frozen teachers scored through one model's parameter buffers.

A :class:`TeacherBank` keeps one CPU copy of the live model's parameters per tag (pinned when
the model is on CUDA): the student (``"student"``), each teacher, optionally a reference model.
GPU memory stays one model; host memory grows by one model per tag. ``score`` groups a local batch
by tag, packs compact micro-batches per tag (longest first, under a padded-token budget), swaps
each teacher's weights into the shared buffers, computes the log-probs of the response tokens,
scatters them back to the batch order and swaps the student back in, also when scoring fails.

Two swap strategies, same results:

* sequential: ``restore(tag)`` (per-tensor ``copy_``, ``non_blocking`` from pinned memory), then
  score;
* overlapped (default on CUDA): the next model streams in layer by layer behind the current
  model's last micro-batch (``dressage.training.weight_streaming``).

The student may be scored in the same call (its tag in ``tags``): it runs first, and the first
teacher streams in behind it. For the tags in ``full_tags`` the score is the whole log-softmax
at each response position, not only the sampled token's (the dense MOPD objective's teachers,
:mod:`dressage.training.mopd_dense`); for those in ``topk_tags`` the sampled token's log-probs
carry the model's top-``topk`` support (the topk objective's teachers,
:mod:`dressage.training.mopd_topk`). Usage::

    bank = TeacherBank(model)                       # backs the student up
    bank.add_teacher("math", "/ckpt/math-teacher")  # HF safetensors folder, validated
    logps = bank.score(tokens, response_lengths, ["math", "code", ...])
    ...optimizer.step(); bank.mark_student_changed()
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from dressage.causal_lm import input_embedding_module, to_device
from dressage.training.log_probs import (
    causal_lm_response_log_probs,
    causal_lm_response_log_softmax,
)
from dressage.training.mopd_topk import causal_lm_response_topk
from dressage.training.weight_store import WeightStore
from dressage.training.weight_streaming import CopyEngine, CudaCopies, InlineCopies, LayerStreamer

__all__ = ["ScoreForward", "TeacherBank", "plan_micro_batches"]

# (tokens, response_lengths, input_embeddings or None) -> per-sample [R_i] log-probs
ScoreForward = Callable[
    [Sequence[Tensor], Sequence[int], Callable[[Tensor], Tensor] | None], list[Tensor]
]


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Pack sample positions into micro-batches of at most ``max_tokens`` padded tokens.

    Longest first, so each micro-batch's padding is small; a sample longer than the budget gets
    a micro-batch of its own. Returns lists of positions into ``lengths``.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class TeacherBank(WeightStore):
    """Host copies of the live model per tag (see :class:`WeightStore`) and rotating scoring.

    Args:
        model: the live model; its parameters are the shared buffers.
        student_tag: the tag of the model's own (trained) weights; backed up at once.
        forward: scoring function; default: Hugging Face causal-LM response log-probs.
        temperature: logits are divided by it when scoring (slime: ``--rollout-temperature``).
        chunk_tokens: tokens per log-softmax chunk (0: auto).
        pin_memory: pin the host copies; default: when the model is on CUDA.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        student_tag: str = "student",
        forward: ScoreForward | None = None,
        temperature: float = 1.0,
        chunk_tokens: int = 0,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__(model, pin_memory=pin_memory)
        self.student_tag = student_tag
        self._custom_forward = forward is not None
        self._forward = forward or self._hf_scorer(causal_lm_response_log_probs)
        self._temperature, self._chunk_tokens = temperature, chunk_tokens
        self._student_versions: dict[str, int] = {}
        self._streamer: LayerStreamer | None = None
        self.backup(student_tag)

    def close(self) -> None:
        super().close()
        self._streamer = None

    # -- is the student's host copy current? ---------------------------------------------------

    def _versions(self) -> dict[str, int]:
        # In-place updates bump a tensor's version counter (fused optimizers do not: see
        # mark_student_changed).
        return {name: int(getattr(p, "_version", 0)) for name, p in self.params.items()}

    def backup(self, tag: str) -> None:
        super().backup(tag)
        if tag == self.student_tag:
            self._student_versions = self._versions()

    def restore(self, tag: str) -> None:
        super().restore(tag)
        if tag == self.student_tag:
            self._student_versions = self._versions()

    def mark_student_changed(self) -> None:
        """Tell the bank the live student was updated (after every optimizer step)."""
        self._student_versions = {}

    def _student_current(self) -> bool:
        return bool(self._student_versions) and self._student_versions == self._versions()

    # -- scoring -------------------------------------------------------------------------------

    def _hf_scorer(self, score: Callable[..., list[Tensor]], *extra: Any) -> ScoreForward:
        """A scoring function of the bank's own model: ``score(model, tokens, response_lengths,
        *extra, ...)`` (one of :mod:`dressage.training.log_probs`'s or
        :func:`dressage.training.mopd_topk.causal_lm_response_topk`) at the bank's temperature
        and chunk size."""

        def forward(
            tokens: Sequence[Tensor],
            response_lengths: Sequence[int],
            input_embeddings: Callable[[Tensor], Tensor] | None,
        ) -> list[Tensor]:
            return score(
                self.model,
                tokens,
                response_lengths,
                *extra,
                temperature=self._temperature,
                chunk_tokens=self._chunk_tokens,
                input_embeddings=input_embeddings,
            )

        return forward

    def _forwards(
        self,
        tags: Collection[str],
        full_tags: Collection[str],
        topk_tags: Collection[str],
        topk: int,
    ) -> dict[str, ScoreForward]:
        """Each tag's scoring function: the whole log-softmax, the top-k support or the
        sampled tokens' log-probs."""
        both = sorted(set(full_tags) & set(topk_tags))
        if both:
            raise ValueError(f"score: tags {both} are in both full_tags and topk_tags")
        special = sorted({*full_tags, *topk_tags})
        if special and self._custom_forward:
            raise ValueError(
                f"score: full_tags and topk_tags ({special}) need the bank's own Hugging Face "
                "forward, not a custom one"
            )
        if topk_tags and topk < 1:
            raise ValueError(f"score: topk_tags {sorted(topk_tags)} need topk >= 1, got {topk}")
        forwards = {tag: self._forward for tag in tags}
        for tag in forwards:
            if tag in full_tags:
                forwards[tag] = self._hf_scorer(causal_lm_response_log_softmax)
            elif tag in topk_tags:
                forwards[tag] = self._hf_scorer(causal_lm_response_topk, topk)
        return forwards

    def _jobs(
        self, lengths: Sequence[int], tags: Sequence[str], max_tokens: int
    ) -> list[tuple[str, list[list[int]]]]:
        order: dict[str, list[int]] = {}
        for i, tag in enumerate(tags):
            if tag not in self.backups:
                raise KeyError(
                    f"sample {i}: unknown teacher {tag!r}; known: {sorted(self.backups)}"
                )
            order.setdefault(tag, []).append(i)
        # The live student needs no swap, so it goes first; teachers keep first-seen order.
        names = sorted(order, key=lambda t: t != self.student_tag)
        jobs = []
        for tag in names:
            positions = order[tag]
            plan = plan_micro_batches([lengths[i] for i in positions], max_tokens)
            jobs.append((tag, [[positions[j] for j in mb] for mb in plan]))
        return jobs

    def score(
        self,
        tokens: Sequence[Tensor],
        response_lengths: Sequence[int],
        tags: Sequence[str],
        *,
        max_tokens: int = 16384,
        overlap: bool | None = None,
        full_tags: Collection[str] = (),
        topk_tags: Collection[str] = (),
        topk: int = 0,
    ) -> list[Tensor]:
        """Log-probs of each sample's response tokens under the model its tag names.

        Args:
            tokens: per sample ``[L_i]`` token ids (prompt + response).
            response_lengths: ``R_i`` per sample.
            tags: per sample a teacher id, or the student tag.
            max_tokens: padded tokens per micro-batch.
            overlap: stream weights behind compute (default: on CUDA); on CPU it runs the same
                schedule with inline copies.
            full_tags: tags whose samples get the whole log-softmax at each response position,
                ``[R_i, V]``, instead of ``[R_i]`` (the dense MOPD objective's teachers); the
                default Hugging Face forward only.
            topk_tags: tags whose samples' ``[R_i]`` log-probs each carry the model's top-``topk``
                support at the response positions (:func:`dressage.training.mopd_topk.support_of`;
                the topk MOPD objective's teachers); the default Hugging Face forward only.
            topk: K for ``topk_tags``, 1 <= K <= the vocabulary.

        Returns:
            Per sample ``[R_i]`` (``[R_i, V]`` for ``full_tags``) float32 log-probs, in the input
            order, on the model's device. The live parameters hold the student's weights
            afterwards, bit for bit.
        """
        if not len(tokens) == len(response_lengths) == len(tags):
            raise ValueError(
                f"score: {len(tokens)} token lists, {len(response_lengths)} response lengths, "
                f"{len(tags)} tags"
            )
        jobs = self._jobs([int(t.numel()) for t in tokens], tags, max_tokens)
        forwards = self._forwards([tag for tag, _ in jobs], full_tags, topk_tags, topk)
        if any(tag != self.student_tag for tag, _ in jobs) and not self._student_current():
            self.backup(self.student_tag)
        results: list[Tensor | None] = [None] * len(tokens)
        overlap = self.device.type == "cuda" if overlap is None else overlap
        with torch.no_grad():
            if overlap:
                self._score_overlapped(jobs, tokens, response_lengths, results, forwards)
            else:
                self._score_sequential(jobs, tokens, response_lengths, results, forwards)
        return [r if r is not None else torch.zeros(0) for r in results]

    @staticmethod
    def _run(
        forward: ScoreForward,
        positions: list[int],
        tokens: Sequence[Tensor],
        response_lengths: Sequence[int],
        results: list[Tensor | None],
        input_embeddings: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        out = forward(
            [tokens[i] for i in positions],
            [int(response_lengths[i]) for i in positions],
            input_embeddings,
        )
        for i, logp in zip(positions, out, strict=True):
            results[i] = logp

    def _score_sequential(
        self,
        jobs: list[tuple[str, list[list[int]]]],
        tokens: Sequence[Tensor],
        response_lengths: Sequence[int],
        results: list[Tensor | None],
        forwards: dict[str, ScoreForward],
    ) -> None:
        live = self.student_tag
        try:
            for tag, micro_batches in jobs:
                if tag != live:
                    self.restore(tag)
                    live = tag
                for positions in micro_batches:
                    self._run(forwards[tag], positions, tokens, response_lengths, results)
        finally:
            if live != self.student_tag:
                self.restore(self.student_tag)

    def _live_embeddings(self) -> Callable[[Tensor], Tensor]:
        """The live embedding lookup as an ``input_embeddings`` callable (which makes the
        forward a single plain pass: :func:`dressage.causal_lm.causal_lm_hidden`)."""
        module = input_embedding_module(self.model)

        def embed(ids: Tensor) -> Tensor:
            return cast(Tensor, module(to_device(ids, self.device)))

        return embed

    def _copies(self) -> CopyEngine:
        return CudaCopies(self.device) if self.device.type == "cuda" else InlineCopies()

    def _score_overlapped(
        self,
        jobs: list[tuple[str, list[list[int]]]],
        tokens: Sequence[Tensor],
        response_lengths: Sequence[int],
        results: list[Tensor | None],
        forwards: dict[str, ScoreForward],
    ) -> None:
        if self._streamer is None:
            self._streamer = LayerStreamer(self.model, self.params, self.backups, self._copies())
        streamer = self._streamer
        live = self.student_tag
        try:
            with streamer.installed():
                for k, (tag, micro_batches) in enumerate(jobs):
                    if tag != live:  # only for the first job: later ones streamed in already
                        streamer.transition_now(tag)
                    live = tag
                    following = jobs[k + 1][0] if k + 1 < len(jobs) else self.student_tag
                    for j, positions in enumerate(micro_batches):
                        armed = j == len(micro_batches) - 1 and following != tag
                        if armed:
                            streamer.arm(tag, following)
                        embeddings = streamer.input_embeddings(tag)
                        if armed and embeddings is None:
                            # One pass through the layers: the shared-prefix forward makes two
                            # (the prefix, then the suffixes on its cache), and the next model's
                            # layer i lands in the buffers right after its first use.
                            embeddings = self._live_embeddings()
                        self._run(
                            forwards[tag], positions, tokens, response_lengths, results, embeddings
                        )
                        if j == len(micro_batches) - 1 and following != tag:
                            streamer.forward_done()
                            live = following
                streamer.finish()
        except BaseException:
            streamer.finish()
            self.restore(self.student_tag)
            self._sync()
            raise
        self._student_versions = self._versions()
