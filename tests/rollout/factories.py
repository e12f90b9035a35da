"""Small builders for segments, templates and multi-segment batches (shared by rollout,
training and reward tests)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from dressage.rollout.multi_segment import expand_segments_to_samples
from dressage.trajectory import NO_VERSION, Segment
from dressage.types import Sample


def slime_args(**overrides: Any) -> SimpleNamespace:
    """An args namespace with slime's defaults for the flags dressage reads."""
    values: dict[str, Any] = {
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "n_samples_per_prompt": 4,
        "global_batch_size": 8,
        "rollout_batch_size": 2,
        "reward_key": None,
        "max_tokens_per_gpu": None,
        "context_parallel_size": 1,
        "use_dynamic_batch_size": False,
        "rollout_top_p": 1.0,
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def segment(
    session: str = "sess-0",
    index: int = 0,
    *,
    prompt: int = 3,
    runs: Sequence[tuple[int, int]] = ((1, 4), (0, 2), (1, 3)),
    versions: Sequence[int] | None = None,
    finish: str = "stop",
    seed: int = 0,
) -> Segment:
    """A segment: ``prompt`` untrained tokens, then ``runs`` of (mask, length).

    ``versions`` gives the weight version of each trainable run in order (default all 0).
    """
    rng = random.Random(seed)
    tokens = [rng.randrange(1, 1000) for _ in range(prompt)]
    mask, logprobs, token_versions = [0] * prompt, [0.0] * prompt, [NO_VERSION] * prompt
    trainable_run = 0
    for m, length in runs:
        version = NO_VERSION
        if m:
            version = versions[trainable_run] if versions is not None else 0
            trainable_run += 1
        tokens += [rng.randrange(1, 1000) for _ in range(length)]
        mask += [m] * length
        logprobs += [-round(rng.random() * 3, 3) if m else 0.0 for _ in range(length)]
        token_versions += [version] * length
    return Segment(
        session_id=session,
        segment_index=index,
        tokens=tokens,
        full_loss_mask=mask,
        full_logprobs=logprobs,
        messages=[{"role": "user", "content": "q"}],
        finish_reason=finish,
        full_versions=token_versions,
        prompt_length=prompt,
    )


def template(
    index: int, group_index: int, *, instance: str | None = None, **metadata: Any
) -> Sample:
    meta = {"instance_id": instance or f"prompt-{group_index}", "task": "calculator", **metadata}
    return Sample(index=index, group_index=group_index, prompt="2+2?", label="4", metadata=meta)


def trajectory(
    args: Any,
    tmpl: Sample,
    trainable: Sequence[int],
    *,
    reward: float | None = None,
) -> list[Sample]:
    """Expand one trajectory whose segment ``k`` has ``trainable[k]`` trainable tokens."""
    session = f"sess-{tmpl.index}"
    segments = [
        segment(session, k, prompt=2, runs=((1, n), (0, 1)), seed=tmpl.index or 0)
        for k, n in enumerate(trainable)
    ]
    samples = expand_segments_to_samples(tmpl, segments, args=args, agent_response="Answer: 4")
    if reward is not None:
        samples[-1].reward = reward
    return samples


def batch(
    args: Any,
    prompts: Sequence[Sequence[Sequence[int]]],
    rewards: Sequence[Sequence[float]] | None = None,
    **metadata: Any,
) -> list[Sample]:
    """``prompts[p][r]`` = trainable tokens per segment of trajectory ``r`` of prompt ``p``."""
    out: list[Sample] = []
    index = 0
    for p, trajectories in enumerate(prompts):
        for r, split in enumerate(trajectories):
            reward = rewards[p][r] if rewards is not None else float((p + r) % 2)
            out += trajectory(args, template(index, p, **metadata), split, reward=reward)
            index += 1
    return out
