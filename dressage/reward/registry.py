"""Task rewards by name: modules register their reward functions; the reward hook looks them up.

    from dressage.reward.registry import register_reward

    @register_reward("calculator")
    def calculator(args, sample) -> float:      # or async def; may return a dict
        ...

A reward module registers itself when imported. The run lists its modules in the config's
``reward_modules`` (dotted module paths: ``args.reward_modules``, a list or comma-separated
text, else the MOPD config's ``reward_modules``); :func:`load_reward_modules` imports them.
The built-in rewards (dressage.reward.builtin) are always available.

A sample's task is ``metadata["task"]``, else slime's per-sample ``metadata["rm_type"]``, else
``args.rm_type``.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from dressage.config.mopd import load_mopd_config
from dressage.config.mopd_path import mopd_config_path
from dressage.slime.mopd_args import mopd_args
from dressage.slime.sample_meta import TASK, describe
from dressage.types import Sample

__all__ = [
    "RewardFn",
    "get_reward",
    "load_reward_modules",
    "register_reward",
    "registered_rewards",
    "reward_modules",
    "task_name",
]

RewardResult = float | dict[str, Any]
RewardFn = Callable[[Any, Sample], RewardResult | Awaitable[RewardResult]]
F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: dict[str, Callable[..., Any]] = {}
_IMPORTED: set[str] = set()


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def register_reward(name: str) -> Callable[[F], F]:
    """Decorator: register ``fn(args, sample)`` as the reward of task ``name``.

    Registering the same function again (a module reloaded) is allowed; another function under
    a taken name is an error naming both.
    """
    if not name:
        raise ValueError("a reward needs a non-empty task name")

    def decorator(fn: F) -> F:
        existing = _REGISTRY.get(name)
        if existing is not None and _qualname(existing) != _qualname(fn):
            raise ValueError(
                f"reward {name!r} is already registered by {_qualname(existing)}; "
                f"{_qualname(fn)} cannot take it"
            )
        _REGISTRY[name] = fn
        return fn

    return decorator


def _builtins() -> None:
    importlib.import_module("dressage.reward.builtin")


def registered_rewards() -> list[str]:
    _builtins()
    return sorted(_REGISTRY)


def get_reward(name: str) -> RewardFn:
    _builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"no reward registered for task {name!r}; registered: {sorted(_REGISTRY)} "
            "(list the module that registers it in reward_modules)"
        ) from None


def load_reward_modules(modules: Iterable[str]) -> None:
    """Import each dotted module path once, so that its rewards register themselves."""
    for module in modules:
        if module in _IMPORTED:
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"reward module {module!r} cannot be imported: {exc}") from exc
        _IMPORTED.add(module)


def reward_modules(args: Any) -> tuple[str, ...]:
    """The run's reward modules: ``args.reward_modules``, else the MOPD config's."""
    value = getattr(args, "reward_modules", None)
    if value is None:
        config = mopd_config_path(mopd_args(args).mopd_config, given_as="args.mopd_config")
        value = load_mopd_config(config).reward_modules if config else []
    if isinstance(value, str):
        value = value.split(",")
    return tuple(part.strip() for part in value if part and part.strip())


def task_name(args: Any, sample: Sample) -> str:
    name = sample.metadata.get(TASK) or sample.metadata.get("rm_type")
    name = name or getattr(args, "rm_type", None)
    if not name:
        raise ValueError(
            f"{describe(sample)} field=metadata.{TASK}: no task names the reward (set "
            "metadata['task'], metadata['rm_type'] or --rm-type)"
        )
    return str(name)
