"""Build-once cache folders, safe under concurrent builders (pytest-xdist, parallel jobs)."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from dressage.config.env import cache_dir

_DONE = ".complete"


def recipe_key(recipe: dict[str, Any]) -> str:
    """The name of ``recipe``'s cache folder: a hash of its JSON (computing it writes nothing)."""
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cached_path(kind: str, recipe: dict[str, Any]) -> Path | None:
    """``<cache>/<kind>/<key>`` when a complete build of ``recipe`` is there, else None (never
    builds: what checkpoint resolution uses for assets that take minutes to build)."""
    final = cache_dir() / kind / recipe_key(recipe)
    return final if (final / _DONE).exists() else None


def cached_build(kind: str, recipe: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """Return ``<cache>/<kind>/<key>``, running ``build(tmp_dir)`` once if it is missing.

    The build writes into a scratch folder that is renamed into place only when complete, so a
    killed build never leaves a folder that looks usable.
    """
    root = cache_dir() / kind
    root.mkdir(parents=True, exist_ok=True)
    final = root / recipe_key(recipe)
    if (final / _DONE).exists():
        return final
    with FileLock(str(final) + ".lock"):
        if (final / _DONE).exists():
            return final
        scratch = root / f".build-{uuid.uuid4().hex}"
        scratch.mkdir()
        try:
            build(scratch)
            (scratch / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
            (scratch / _DONE).write_text("ok\n")
            if final.exists():
                shutil.rmtree(final)
            scratch.rename(final)
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)
    return final
