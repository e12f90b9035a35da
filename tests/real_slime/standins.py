"""Stand-ins for the GPU-only packages that stand between slime's modules and a CPU machine.

slime's actor, rollout manager and argument parser import ``sglang``, ``sglang_router``,
``torch_memory_saver`` and Megatron-LM's ``megatron.training`` at module level. None of them
installs here. :func:`install` puts a finder on ``sys.meta_path`` that answers those imports
(and only those) with modules whose every attribute is a placeholder class: enough for
``from X import Y`` and for subclassing, and nothing more. Calling or instantiating a
placeholder raises :class:`StandInCalled` naming it, so a test that reaches GPU-only code fails
loudly instead of running a fake. A test that needs behaviour (``torch_memory_saver.pause``)
patches it in explicitly.

slime's own code is never replaced: a package that *is* importable is left alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["GPU_ONLY", "StandInCalled", "install", "uninstall"]

GPU_ONLY = ("sglang", "sglang_router", "torch_memory_saver", "megatron.training")


class StandInCalled(RuntimeError):
    """GPU-only code was reached through a stand-in."""


class _Meta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise StandInCalled(f"{cls.__qualname__} is a stand-in for a GPU-only package")

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(qualname: str) -> type:
    return _Meta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package: any submodule resolves too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, prefixes: Sequence[str]) -> None:
        self.prefixes = tuple(prefixes)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes):
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


_installed: _Finder | None = None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install() -> tuple[str, ...]:
    """Answer imports of the GPU-only packages that are missing; returns the ones stood in."""
    global _installed
    if _installed is not None:
        return _installed.prefixes
    missing = tuple(name for name in GPU_ONLY if not _importable(name))
    _installed = _Finder(missing)
    sys.meta_path.insert(0, _installed)
    return missing


def uninstall() -> None:
    """Remove the finder and every module it made."""
    global _installed
    if _installed is None:
        return
    sys.meta_path.remove(_installed)
    for name in list(sys.modules):
        if isinstance(sys.modules[name], _StandInModule):
            del sys.modules[name]
    _installed = None
