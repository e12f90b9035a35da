"""Checkpoint specs that name a project-built model instead of a folder, found or built.

    tiny:seed=1[,vocab=qwen3,hidden_size=32,...]     a tiny model (a seeded random init: seconds)
    tiny-sft:task=calculator[,steps=32,...]          a tiny teacher (trained: minutes on a CPU)

:func:`find_checkpoint` only looks: it builds, trains and writes nothing, and a spec that was not
built yet is None. :func:`resolve_checkpoint` builds a missing ``tiny:`` random init (seconds, no
training) and reports a missing ``tiny-sft:`` teacher (:class:`CheckpointNotBuiltError`), so
checkpoint resolution and validation name it. :func:`build_checkpoint` builds one
(``dressage assets --config CONFIG`` and the training DAGs' ``prepare`` task call it); a plain
folder is never built, only named.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from dressage.tiny.model import TinyModelSpec, cached_tiny_model_dir, tiny_model_dir

__all__ = [
    "TEACHER_PREFIX",
    "CheckpointNotBuiltError",
    "TINY_PREFIX",
    "build_checkpoint",
    "build_checkpoints",
    "find_checkpoint",
    "is_built_spec",
    "parse_tiny_model_spec",
    "resolve_checkpoint",
]

TINY_PREFIX = "tiny:"
TEACHER_PREFIX = "tiny-sft:"


def is_built_spec(value: str) -> bool:
    """Whether ``value`` names a project-built model rather than a folder."""
    return value.startswith((TINY_PREFIX, TEACHER_PREFIX))


def parse_tiny_model_spec(value: str) -> TinyModelSpec:
    """``tiny:seed=1,hidden_size=32`` -> :class:`TinyModelSpec`; unknown keys are an error."""
    if not value.startswith(TINY_PREFIX):
        raise ValueError(f"{value!r} does not start with {TINY_PREFIX!r}")
    defaults = {f.name: f.default for f in fields(TinyModelSpec)}
    kwargs: dict[str, Any] = {}
    for item in filter(None, value[len(TINY_PREFIX) :].split(",")):
        key, sep, raw = item.partition("=")
        if not sep or key not in defaults:
            raise ValueError(f"{value!r}: {item!r} is not key=value with key in {sorted(defaults)}")
        kwargs[key] = int(raw) if isinstance(defaults[key], int) else raw
    return TinyModelSpec(**kwargs)


def find_checkpoint(value: str) -> Path | None:
    """The folder ``value`` names: a plain path as given, a ``tiny:`` model or ``tiny-sft:``
    teacher only when it is already built (else None). Builds, trains and writes nothing.

    Raises:
        ValueError: a malformed spec (the message names the bad key).
    """
    if value.startswith(TEACHER_PREFIX):
        from dressage.tiny.teachers import cached_teacher_dir, parse_teacher_spec

        return cached_teacher_dir(parse_teacher_spec(value))
    if value.startswith(TINY_PREFIX):
        return cached_tiny_model_dir(parse_tiny_model_spec(value))
    return Path(value)


def build_checkpoint(value: str) -> Path:
    """Build (once; cached) the model a ``tiny:`` or ``tiny-sft:`` spec names.

    Raises:
        ValueError: ``value`` is a plain path (never built here) or a malformed spec.
    """
    if value.startswith(TEACHER_PREFIX):
        from dressage.tiny.teachers import parse_teacher_spec, tiny_teacher_dir

        return tiny_teacher_dir(parse_teacher_spec(value))
    if value.startswith(TINY_PREFIX):
        return tiny_model_dir(parse_tiny_model_spec(value))
    raise ValueError(f"{value!r} is a checkpoint path, not a tiny: or tiny-sft: spec to build")


def build_checkpoints(specs: list[str], *, workers: int | None = None) -> list[Path | ValueError]:
    """:func:`build_checkpoint` for each spec, in parallel processes (one per core, at most one
    per spec: a teacher's training is single-threaded work, so two cores build two at once).

    Each build runs in a fresh interpreter (``python -c``), not a multiprocessing child: a spawned
    child re-runs the parent's main script first, and inside an Airflow task that is ``airflow``
    itself, whose import fails in a task's sandboxed environment.

    Returns, per spec in order, its folder or the ``ValueError`` of a malformed spec; any other
    failure is raised.
    """
    if not specs:
        return []
    import os
    from concurrent.futures import ThreadPoolExecutor

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    count = max(1, min(len(specs), workers or cores))
    if count == 1:
        return [_try_build(spec) for spec in specs]
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(_build_in_process, specs))


_BUILD_ONE = """
import json, sys
from transformers.utils import logging
logging.disable_progress_bar()  # the caller's log (the demo's task output): no tqdm bars
from dressage.tiny.checkpoints import _try_build
outcome = _try_build(sys.argv[1])
key = "error" if isinstance(outcome, ValueError) else "path"
print("\\n" + json.dumps({key: str(outcome)}))
"""


def _build_in_process(spec: str) -> Path | ValueError:
    import json
    import subprocess
    import sys

    done = subprocess.run(  # its stderr (the build's log) is the caller's
        [sys.executable, "-c", _BUILD_ONE, spec], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = done.stdout.strip().splitlines()
    if lines[:-1]:
        print("\n".join(lines[:-1]), flush=True)
    if done.returncode != 0 or not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"building {spec} failed (exit {done.returncode}); its log is above")
    result = json.loads(lines[-1])
    return ValueError(result["error"]) if "error" in result else Path(result["path"])


def _try_build(spec: str) -> Path | ValueError:
    try:
        return build_checkpoint(spec)
    except ValueError as exc:
        return exc


class CheckpointNotBuiltError(ValueError):
    """A ``tiny-sft:`` teacher (or a ``tiny:`` pre-trained base) named by a config is not built:
    resolution never trains one."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        super().__init__(
            f"{spec} is not built yet (resolving a checkpoint never trains one): build it with "
            f"`dressage assets --checkpoint '{spec}'`, or every one a config names with "
            "`dressage assets --config CONFIG` (the training DAGs' prepare task does the same)"
        )


def resolve_checkpoint(value: str) -> Path:
    """The folder of a checkpoint path, a ``tiny:key=value,...`` tiny-model spec (a seeded random
    init, built on first use: seconds, no training) or a ``tiny-sft:task=...,key=value`` tiny
    teacher (found, never trained; nothing is written while looking).

    Raises:
        CheckpointNotBuiltError: a ``tiny-sft:`` teacher, or a ``tiny:`` spec naming a base
            pre-trained on first use, that is not built yet.
        ValueError: a malformed spec (the message names the bad key).
    """
    if not is_built_spec(value):
        return Path(value)
    found = find_checkpoint(value)
    if found is not None:
        return found
    if value.startswith(TINY_PREFIX):
        spec = parse_tiny_model_spec(value)
        if not spec.pretrained:  # a seeded random init: callers rely on it being made here
            return tiny_model_dir(spec)
    raise CheckpointNotBuiltError(value)
