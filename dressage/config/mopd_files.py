"""Reading a MOPD config file: ``${VAR}`` placeholders, relative paths, type errors as problems.

Used by :func:`dressage.config.mopd.load_mopd_config` only; kept apart so that the config's
model and checks read on their own.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from dressage.commands import error_message
from dressage.config.env import cache_dir
from dressage.config.problems import Problem

if TYPE_CHECKING:
    from dressage.config.mopd import MopdConfig

__all__ = ["pydantic_problems", "resolve_paths"]

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def pydantic_problems(exc: ValidationError, data: Any, model: type[BaseModel]) -> list[Problem]:
    """Each type error as one sentence, its subject named as the config names it (a dataset by
    its name), a misspelled key with the key it may have meant."""
    out = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        subject = ".".join(str(p) for p in loc) or "config"
        if len(loc) >= 2 and loc[0] == "datasets" and isinstance(loc[1], int):
            try:
                name = data["datasets"][loc[1]].get("name")
            except (KeyError, IndexError, TypeError, AttributeError):
                name = None
            rest = ".".join(str(p) for p in loc[2:])
            subject = f"dataset {name!r}" if name else f"datasets[{loc[1]}]"
            subject += f" {rest}" if rest else ""
        elif len(loc) >= 2 and loc[0] == "teachers":
            rest = ".".join(str(p) for p in loc[2:])
            subject = f"teacher {loc[1]!r}" + (f" {rest}" if rest else "")
        out.append(Problem(subject, error_message(err, model)))
    return out


def _expand(value: str, subject: str, base: Path, problems: list[Problem]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if name == "DRESSAGE_CACHE_DIR" and not found:
            return str(cache_dir())
        if not found:
            problems.append(Problem(subject, f"${{{name}}} in {value!r} is not set"))
            return match.group(0)
        return found

    expanded = _PLACEHOLDER.sub(sub, value)
    if expanded.startswith(("tiny:", "tiny-sft:")) or "://" in expanded:  # not paths
        return expanded
    path = Path(expanded).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def resolve_paths(config: MopdConfig, base: Path, problems: list[Problem]) -> MopdConfig:
    """A copy with ``${VAR}`` expanded and relative paths made absolute against ``base``."""

    def fix(value: str | None, subject: str) -> str | None:
        return None if value is None else _expand(value, subject, base, problems)

    teachers = {
        tid: t.model_copy(
            update={
                "load": fix(t.load, f"teacher {tid!r} load"),
                "tokenizer": fix(t.tokenizer, f"teacher {tid!r} tokenizer"),
            }
        )
        for tid, t in config.teachers.items()
    }
    datasets = [
        d.model_copy(
            update={
                "path": fix(d.path, f"dataset {d.name!r} path"),
                "eval_path": fix(d.eval_path, f"dataset {d.name!r} eval_path"),
            }
        )
        for d in config.datasets
    ]
    student = config.student
    if student is not None:
        student = student.model_copy(
            update={
                "hf_checkpoint": fix(student.hf_checkpoint, "student hf_checkpoint"),
                "ref_load": fix(student.ref_load, "student ref_load"),
            }
        )
    return config.model_copy(
        update={"teachers": teachers, "datasets": datasets, "student": student}
    )
