"""Resolve dotted-path hooks the way slime's ``load_function`` does; dressage's own hook paths.

slime splits the path on its **last dot**: ``"pkg.module.fn"`` imports ``pkg.module`` and takes
its attribute ``fn``. ``file.py:fn`` forms are not supported there, so they are rejected here too
(a path that works in the embedded trainer must work on a cluster).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["ROLLOUT_LOG_HOOK", "load_function"]

ROLLOUT_LOG_HOOK = "dressage.training.metrics_sink.log_rollout_metrics"
"""slime's ``--custom-rollout-log-function-path``: the rollout side of the run's metrics log.

A dotted path, never an import: the MOPD driver adds it to its own argv and the launcher's
command builder checks for it, and neither needs the training package to know the name."""


@functools.cache
def load_function(path: str) -> Callable[..., Any]:
    """Import ``module.attr`` from a dotted path; errors name the path and what is missing."""
    if not isinstance(path, str) or "." not in path or ":" in path:
        raise ValueError(f"hook path {path!r} must be a dotted 'package.module.function' path")
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"hook {path!r}: cannot import module {module_name!r}: {exc}") from exc
    try:
        fn = getattr(module, attr)
    except AttributeError as exc:
        raise AttributeError(f"hook {path!r}: module {module_name!r} has no {attr!r}") from exc
    if not callable(fn):
        raise TypeError(f"hook {path!r} is a {type(fn).__name__}, not a callable")
    return fn
