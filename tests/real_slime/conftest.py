"""The real-slime tier: the project's hooks run through slime's own code.

Every test under ``tests/real_slime/`` carries the marker ``slime`` (``pytest -m slime`` runs
exactly them) and needs ``SLIME_ROOT``, a checkout of slime at the reference commit (``.ci/run``
points it at one when there is one beside the repository). Without it the tier is skipped with one
reason. With it, a checkout that is not slime, or lacks a module or name the contract names,
fails: it never skips.

The root ``tests/conftest.py`` puts ``SLIME_ROOT`` first on ``sys.path`` before anything imports
``dressage``, so ``dressage.types.Sample`` is slime's own class throughout such a run, as on a
cluster. The GPU-only packages slime imports at module level get stand-ins for the tier's
duration (``tests/real_slime/standins.py``); slime's own modules are never replaced.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slime_root
from tests.real_slime import standins

HERE = Path(__file__).parent
NO_SLIME = "SLIME_ROOT is not set: the real-slime tier needs a slime checkout"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = slime_root()
    for item in items:
        if HERE not in Path(str(item.fspath)).parents:
            continue
        item.add_marker(pytest.mark.slime)
        if root is None:
            item.add_marker(pytest.mark.skip(reason=NO_SLIME))


def _check_checkout(root: Path) -> None:
    problems = [
        f"{root / rel} is missing"
        for rel in ("slime/__init__.py", "slime/utils/types.py", "train.py", "train_async.py")
        if not (root / rel).is_file()
    ]
    try:
        import slime

        located = Path(os.path.abspath(slime.__file__)).parent  # files may be links
        if located != root / "slime":
            problems.append(f"'import slime' found {located}, not {root / 'slime'}")
    except ImportError as exc:
        problems.append(f"'import slime' failed: {exc}")
    if problems:
        pytest.fail(f"SLIME_ROOT={root} is not a slime checkout: " + "; ".join(problems))


@pytest.fixture(scope="session", autouse=True)
def slime_checkout() -> Iterator[Path]:
    """SLIME_ROOT, checked, with the GPU-only stand-ins installed while the tier runs."""
    root = slime_root()
    assert root is not None  # the tier is skipped without it
    _check_checkout(root)
    standins.install()
    yield root
    standins.uninstall()


@pytest.fixture(scope="module")
def megatron_world() -> Iterator[None]:
    """A gloo world of one process with megatron-core's parallel state (TP = CP = 1), for a
    module whose tests call slime code that asks Megatron for its ranks and groups."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from tests.helpers import free_port

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    mpu.initialize_model_parallel(1, 1)
    yield
    mpu.destroy_model_parallel()
    dist.destroy_process_group()
