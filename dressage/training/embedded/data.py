"""train_data in, slime's rank-local ``rollout_data`` out: checked first, tensorised like slime.

``check_train_data`` runs before any forward pass and fails naming the key, the sample (its
position, ``sample_indices`` entry and dataset from ``source_names``) and the teacher: missing
keys, lengths that disagree, a ``teacher_id`` (``prompt`` slot) no loaded teacher answers to,
siblings of one rollout that name different teachers. ``select`` then keeps the scheduled
samples, as slime's DP split does, and tensorises them (docs/slime.md §3.3): ``tokens``
long, ``loss_masks`` int, ``rollout_log_probs``/``teacher_log_probs`` float32 (lists of per-sample
tensors), ``rollout_mask_sums`` one float32 tensor.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

__all__ = ["PER_SAMPLE_KEYS", "REQUIRED_KEYS", "check_train_data", "select"]

REQUIRED_KEYS = ("tokens", "response_lengths", "loss_masks", "rollout_ids")
# The keys slime forwards per DP rank (raw_reward is shipped whole; the trainer localises it).
PER_SAMPLE_KEYS = (
    "tokens",
    "response_lengths",
    "rewards",
    "raw_reward",
    "truncated",
    "loss_masks",
    "sample_indices",
    "rollout_ids",
    "rollout_mask_sums",
    "rollout_log_probs",
    "source_names",
    "prompt",
    "teacher_log_probs",
)
_TOKEN_KEYS = ("loss_masks", "rollout_log_probs", "teacher_log_probs")


def _name(train_data: Mapping[str, Any], i: int) -> str:
    parts = [f"sample {i}"]
    indices = train_data.get("sample_indices")
    if indices is not None and indices[i] is not None:
        parts.append(f"index {indices[i]}")
    sources = train_data.get("source_names")
    if sources is not None and sources[i] not in (None, "unknown"):
        parts.append(f"dataset {sources[i]!r}")
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


def _check_teachers(train_data: Mapping[str, Any], known: Collection[str], n: int) -> None:
    teacher_ids = train_data.get("prompt")
    if teacher_ids is None:
        raise KeyError(
            "train_data has no 'prompt' key: with teachers loaded, every sample must carry its "
            "teacher_id there (dressage.rollout.convert_samples writes it)"
        )
    first_of_rollout: dict[int, int] = {}
    for i in range(n):
        tid = teacher_ids[i]
        if not isinstance(tid, str) or tid not in known:
            raise ValueError(
                f"{_name(train_data, i)}: teacher_id {tid!r} is not a loaded teacher "
                f"(loaded: {sorted(known)})"
            )
        rid = int(train_data["rollout_ids"][i])
        j = first_of_rollout.setdefault(rid, i)
        if teacher_ids[j] != tid:
            raise ValueError(
                f"rollout {rid}: siblings disagree on the teacher: {_name(train_data, j)} names "
                f"{teacher_ids[j]!r}, {_name(train_data, i)} names {tid!r}"
            )


def check_train_data(
    train_data: Mapping[str, Any], *, teachers: Collection[str] | None = None
) -> int:
    """Validate ``train_data``; returns the sample count. ``teachers``: ids that can score."""
    missing = [k for k in REQUIRED_KEYS if k not in train_data]
    if missing:
        raise KeyError(f"train_data lacks {missing}; it has {sorted(train_data)}")
    n = len(train_data["tokens"])
    if n == 0:
        raise ValueError("train_data has no samples")
    for key in PER_SAMPLE_KEYS:
        values = train_data.get(key)
        if key == "raw_reward" or values is None:
            continue
        if len(values) != n:
            raise ValueError(f"train_data[{key!r}] has {len(values)} entries for {n} samples")
    for i in range(n):
        total = len(train_data["tokens"][i])
        resp = int(train_data["response_lengths"][i])
        if not 0 <= resp < total:
            raise ValueError(
                f"{_name(train_data, i)}: response_length {resp} must be in [0, {total}) "
                "(len(tokens); a response needs a prompt token before it)"
            )
        for key in _TOKEN_KEYS:
            values = train_data.get(key)
            if values is not None and len(values[i]) != resp:
                raise ValueError(
                    f"{_name(train_data, i)}: {key} has {len(values[i])} entries, "
                    f"response_length {resp}"
                )
    if teachers is not None:
        _check_teachers(train_data, teachers, n)
    return n


def _local_raw_reward(train_data: Mapping[str, Any], order: Sequence[int], n: int) -> list[Any]:
    raw = list(train_data["raw_reward"])
    if len(raw) != n:
        raise ValueError(f"train_data['raw_reward'] has {len(raw)} entries for {n} samples")
    return [raw[i] for i in order]


def select(
    train_data: Mapping[str, Any], order: Sequence[int], device: torch.device
) -> dict[str, Any]:
    """The scheduled samples as slime's rank-local ``rollout_data`` (tensors on ``device``)."""
    n = len(train_data["tokens"])
    out: dict[str, Any] = {}
    for key in PER_SAMPLE_KEYS:
        values = train_data.get(key)
        if values is None:
            continue
        if key == "raw_reward":
            out[key] = _local_raw_reward(train_data, order, n)
            continue
        picked = [values[i] for i in order]
        if key == "tokens":
            out[key] = [torch.as_tensor(v, dtype=torch.long) for v in picked]
        elif key == "loss_masks":
            out[key] = [torch.as_tensor(v, dtype=torch.int32, device=device) for v in picked]
        elif key in ("rollout_log_probs", "teacher_log_probs"):
            out[key] = [torch.as_tensor(v, dtype=torch.float32, device=device) for v in picked]
        elif key == "rollout_mask_sums":
            out[key] = torch.as_tensor(picked, dtype=torch.float32, device=device)
        else:
            out[key] = [v.item() if isinstance(v, torch.Tensor) else v for v in picked]
    out["total_lengths"] = [int(t.numel()) for t in out["tokens"]]
    out["response_lengths"] = [int(r) for r in out["response_lengths"]]
    return out
