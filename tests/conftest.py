"""Suite-wide setup: offline model hub, quiet libraries, shared fixtures for real assets."""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import megatron_lm_root, slime_root

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# A slime checkout (the real-slime tier, tests/real_slime/) goes first on the path before anything
# imports dressage, so dressage.types picks slime's own Sample as it does on a cluster.
if (_slime := slime_root()) is not None:
    sys.path.insert(0, str(_slime))
# Megatron-LM's training code joins the wheel's megatron.core in the namespace package megatron.
if (_megatron_lm := megatron_lm_root()) is not None:
    sys.path.append(str(_megatron_lm))


LONGEST_FIRST = (
    "tests/e2e/test_mopd_transfer.py",
    "tests/test_chaos_script.py",
    "tests/e2e/test_airflow_ui.py",
    "tests/airflow/test_continue_from.py",
    "tests/jobs/test_train_job.py",
    "tests/e2e/test_demo.py",
    "tests/proxy/test_proxy_fuzz.py",
    "tests/examples/test_third_task.py",
)
"""Files whose tests take minutes, longest first. They are collected first, so that xdist starts
them first (``make test``'s ``--dist loadfile --no-loadscope-reorder`` hands files out in
collection order; xdist's own reorder puts files with many tests first, and so these last): started
last, one of them kept one worker busy for minutes while the other had nothing left to run."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}

    def order(item: pytest.Item) -> int:
        path = Path(str(item.path))
        return (
            rank.get(path.relative_to(root).as_posix(), len(rank))
            if root in path.parents
            else len(rank)
        )

    items.sort(key=order)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def qwen35_tokenizer():  # type: ignore[no-untyped-def]
    from dressage.assets import load_tokenizer

    return load_tokenizer("qwen3.5")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from dressage.tiny import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture(scope="session")
def embedded_checkpoints() -> list[Path]:
    """The embedded default's tiny teachers and student, built once if missing (what
    ``dressage assets --config configs/mopd/embedded.json`` and the DAGs' prepare task do):
    resolving a checkpoint never trains one, so tests that resolve them build them first."""
    from dressage.config.mopd import load_mopd_config
    from dressage.tiny.checkpoints import build_checkpoints

    config = load_mopd_config(Path(__file__).parents[1] / "configs/mopd/embedded.json")
    built = build_checkpoints(config.built_specs())  # in parallel processes, once; cached
    for outcome in built:
        if isinstance(outcome, ValueError):
            raise outcome
    return [path for path in built if isinstance(path, Path)]


@pytest.fixture
def memory_fs() -> Iterator[None]:
    """A clean fsspec memory:// store for one test (it is process-global)."""
    from fsspec.implementations.memory import MemoryFileSystem

    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs.clear()
    MemoryFileSystem.pseudo_dirs.append("")
    yield
    MemoryFileSystem.store.clear()


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port that is taken: a server that got as far as binding it fails there."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.fixture
def alone_with_timing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For a test whose verdict hangs on timing: no other such test runs while it does. On the
    2-core CI machine two of them at once (a proxy under attack, a trainer racing its rollouts)
    each load the cores the other measures on. A lock file that every xdist worker of the run
    sees (beside the workers' own temporary folders); the other tests run on meanwhile."""
    lock = tmp_path_factory.getbasetemp().parent / "dressage-timing.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
