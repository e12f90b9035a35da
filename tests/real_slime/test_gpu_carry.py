"""``scripts/gpu_carry.sh``: what travels to a GPU machine without slime's image.

The script gathers, from PyPI, the wheels that slime's Megatron actor needs beside PyTorch, with
copies of ``SLIME_ROOT`` and ``MEGATRON_LM_ROOT``. Here it builds the folder for this
interpreter's Python, installs it offline into a folder of the test's, and imports numpy from
there: the carried numpy 1.x comes before the environment's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, megatron_lm_root, slime_root

SCRIPT = REPO / "scripts" / "gpu_carry.sh"
PINNED = {
    "megatron_core": "0.16.1",
    "torch_memory_saver": "0.0.10",
    "numpy": "1.26.4",
    "pydantic": "2.14.4",
    "pydantic_core": "2.50.5",
    "annotated_types": "0.8.0",
    "typing_inspection": "0.4.5",
    "typing_extensions": "4.16.0",
    "pydantic_settings": "2.16.3",
    "python_dotenv": "1.2.4",
    "orjson": "3.13.0",
    "pytest": "9.2.0",
    "pluggy": "1.7.0",
    "iniconfig": "2.3.1",
    "pygments": "2.21.0",
    "pytest_timeout": "2.4.0",
}


def _run(*args: str, env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_the_carry_refuses_what_it_cannot_copy(tmp_path: Path) -> None:
    env = {**os.environ, "SLIME_ROOT": str(tmp_path / "nowhere")}
    env.pop("MEGATRON_LM_ROOT", None)
    done = _run(str(SCRIPT), str(tmp_path / "carry"), env=env)
    assert done.returncode == 2
    assert f"SLIME_ROOT must name a folder (it is '{tmp_path / 'nowhere'}')" in done.stderr
    (tmp_path / "fake").mkdir()
    env.update(SLIME_ROOT=str(tmp_path / "fake"), MEGATRON_LM_ROOT=str(tmp_path / "fake"))
    done = _run(str(SCRIPT), str(tmp_path / "carry"), env=env)
    assert done.returncode == 2 and "has no slime/ package" in done.stderr
    assert not (tmp_path / "carry").exists()


def test_the_carry_installs_offline_and_comes_first(tmp_path: Path) -> None:
    megatron = megatron_lm_root()
    if megatron is None:
        pytest.skip("MEGATRON_LM_ROOT is not set: the carry copies Megatron-LM's training code")
    slime = slime_root()
    assert slime is not None  # the tier is skipped without it
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "SLIME_ROOT": str(slime), "MEGATRON_LM_ROOT": str(megatron)}
    carry = tmp_path / "carry"
    done = _run(str(SCRIPT), str(carry), "--python", version, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    wheels = sorted(p.name for p in (carry / "wheels").iterdir())
    assert {w.split("-")[0].lower(): w.split("-")[1] for w in wheels} == PINNED, wheels
    assert (carry / "slime" / "slime" / "__init__.py").is_file()
    assert (carry / "megatron-lm" / "megatron" / "training").is_dir()

    bin_dir = tmp_path / "bin"  # the machine's python3: this interpreter
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    site = tmp_path / "site"
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = _run(str(carry / "install.sh"), str(site), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"installed {len(PINNED)} wheels into {site}" in done.stdout
    check = (
        f". {carry / 'env.sh'} {site} && python3 -c "
        "'import numpy, os; print(numpy.__version__, numpy.__file__, "
        'os.environ["SLIME_ROOT"], os.environ["MEGATRON_LM_ROOT"])\''
    )
    done = _run("-c", check, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    numpy_version, numpy_file, slime_env, megatron_env = done.stdout.split()
    assert numpy_version == "1.26.4" and numpy_file.startswith(str(site))
    assert (slime_env, megatron_env) == (str(carry / "slime"), str(carry / "megatron-lm"))
