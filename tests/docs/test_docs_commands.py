"""Every command in README.md and docs/*.md runs as written, on a fresh clone.

Each line of a ```bash block is a command (a trailing backslash joins the next line), and each
command must match one entry of CHECKS, which says how it is checked:

* ``run``: run as written by bash in a fresh clone (the repository's tracked and unignored
  files copied to a new folder, its ``.venv`` linked in), exit 0;
* ``parse``: too long to run here (a benchmark, a GPU): its program parses its arguments as
  written (argparse is stopped once they parse), in the fresh clone;
* ``make``: a Makefile target of the clone, which ``make -n`` accepts;
* ``run on a staged run``: run as written, after a small run of ``dressage_mopd`` was staged
  where the form and ``make demo`` stage theirs (``runs/artifacts/dressage_mopd/RUN/``);
* ``tested by ...``: another test runs it, named here.

The pages in SCRIPTS are one session each (services started in one block, used in the next):
their blocks run together as one bash script, and must exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, bash_commands, fresh_clone

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("embedded_checkpoints")]

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPTS = {"docs/guide-proxy.md": "answer: "}  # page -> what its output must show
_ENV = r"(?:[A-Z_]+=\S+ )*"
_GPU_TIER = "tested by tests/real_slime/test_megatron_gpu.py (a GPU)"
CHECKS: list[tuple[str, str]] = [
    (r"make (venv|demo|test|airflow|test-ui)", "make"),
    (r"DRESSAGE_MOPD_SCHEDULE=@daily make airflow", "make"),
    (r"\.venv/bin/python bench/\S+\.py.*", "parse"),
    (r"\.venv/bin/python scripts/profile_proxy\.py.*", "parse"),
    (
        r"\.venv/bin/python -m pytest -n 0 -s tests/proxy/frameworks",
        "tested by tests/proxy/frameworks/ (the test suite's own sessions)",
    ),
    (r"PYTHONPATH=\$PWD/examples \.venv/bin/dressage demo .*", "tested by tests/examples/"),
    (r"docker build -f containers/trainer\.Dockerfile .*", "tested by tests/containers/"),
    (
        r"DRESSAGE_MOPD_CONFIG=/mnt/nfs/\S+ .*bash scripts/run_mopd_qwen3\.5_sync\.sh",
        "tested by tests/launch/test_slime_command.py (the shell launcher)",
    ),
    (
        r'\.venv/bin/dressage artifacts show "\$\(ls -td runs/artifacts/dressage_mopd/\*/ '
        r'\| head -n 1\)"',
        "run on a staged run",
    ),
    (_ENV + r"\.venv/bin/dressage (assets|mopd check|mopd launch|artifacts show|env) .*", "run"),
    (r"\.venv/bin/python -m dressage\.slime\.model_flags \S+", "run"),
    (r"python -m dressage\.slime\.torch_dist to-(torch-dist|hf) .*", _GPU_TIER),
    (_ENV + r"\.venv/bin/python -m pytest -m megatron_gpu tests/real_slime/", _GPU_TIER),
    (
        _ENV + r"bash scripts/gpu_carry\.sh \.gpu-carry|bash \.gpu-carry/install\.sh && "
        r"\. \.gpu-carry/env\.sh",
        "tested by tests/real_slime/test_gpu_carry.py",
    ),
]


# How a line that is a command begins: such a block must be tagged bash, so that it is checked.
_COMMAND_START = re.compile(
    r"(?:[A-Z_]+=\S+ )*(?:\.venv/|\$ |(?:python3?|make|dressage(?:-proxy)?|bash|sh|curl|docker|"
    r"pip|uv|git|ray|airflow|cd|export)(?:\s|$))"
)


def _kind(command: str) -> str | None:
    return next((kind for pattern, kind in CHECKS if re.fullmatch(pattern, command)), None)


def _page_commands() -> list[tuple[str, str]]:
    return [
        (str(page.relative_to(REPO)), command)
        for page in PAGES
        if str(page.relative_to(REPO)) not in SCRIPTS
        for command in bash_commands(page)
    ]


def test_every_command_of_the_readme_and_docs_has_a_check() -> None:
    unchecked = [(page, cmd) for page, cmd in _page_commands() if _kind(cmd) is None]
    assert not unchecked, f"commands with no entry in CHECKS: {unchecked}"
    assert len(_page_commands()) >= 10  # the pages were read at all


def test_every_block_of_commands_is_tagged_bash() -> None:
    """A command in an untagged block (or one tagged sh, shell, console) escapes the checks."""
    untagged = [
        (str(page.relative_to(REPO)), block.splitlines()[0])
        for page in PAGES
        for tag, block in re.findall(r"^ *```(\S*)\n(.*?)^ *```", page.read_text(), re.S | re.M)
        if tag in ("", "sh", "shell", "console", "text")
        and any(_COMMAND_START.match(line.strip()) for line in block.splitlines()[:1])
    ]
    assert not untagged, f"blocks of commands not tagged bash: {untagged}"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_clone(tmp_path_factory.mktemp("clone") / "dressage")


def _env() -> dict[str, str]:
    drop = ("AIRFLOW", "DRESSAGE_MOPD_", "OUTPUT_DIR", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


# Runs a program with its arguments as a command line would, stopping it once argparse has
# parsed them: exit 0 when they parse, argparse's exit 2 when they do not.
_PARSE_ONLY = """
import argparse, runpy, sys
real = argparse.ArgumentParser.parse_known_args
depth = [0]
class Parsed(BaseException):
    pass
def parse_known_args(self, args=None, namespace=None):
    depth[0] += 1
    try:
        ns, rest = real(self, args, namespace)
    finally:
        depth[0] -= 1
    if depth[0] == 0 and self.prog != "dressage":
        if rest:
            self.error("unrecognized arguments: " + " ".join(rest))
        raise Parsed()
    return ns, rest
argparse.ArgumentParser.parse_known_args = parse_known_args
target, sys.argv = sys.argv[1], sys.argv[1:]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        sys.argv[0] = target
        from dressage.cli import main
        sys.exit(main(sys.argv[1:]))
except Parsed:
    print("parsed")
"""


def _parse_only(command: str, clone: Path) -> subprocess.CompletedProcess[str]:
    words = command.split()
    assert words[0] == ".venv/bin/python", command
    return subprocess.run(
        [sys.executable, "-c", _PARSE_ONLY, *words[1:]],
        cwd=clone,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _stage_a_run(clone: Path) -> None:
    """A one-rollout run of ``dressage_mopd``, staged as the DAG's stage task does."""
    from dressage.schemas import segments_to_table
    from dressage.staging import ArtifactWriter, stage_run
    from tests.staging.factories import segments

    output = clone / "runs/dressage_mopd/manual__docs/output"
    with ArtifactWriter(f"file://{output}/artifacts/rollout-00000", metadata={"step": 0}) as w:
        w.write_table("segments", segments_to_table(segments(2)))
    (output / "summary.json").write_text('{"steps": 1}')
    (output / "metrics.jsonl").write_text('{"step": 0, "time": 1, "metrics": {"reward": 1}}\n')
    staged = clone / "runs/artifacts/dressage_mopd/manual__docs"
    metadata = {"dag_id": "dressage_mopd", "run_id": "manual__docs", "steps": 1}
    stage_run(str(output), staged.as_uri(), metadata=metadata)


@pytest.mark.parametrize(("page", "command"), _page_commands())
def test_the_command_runs_as_written(page: str, command: str, clone: Path) -> None:
    kind = _kind(command)
    if kind is None or kind.startswith("tested by"):
        pytest.skip(f"{kind or 'no check'}")
    if kind == "make":
        target = command.split("make ", 1)[1]
        done = subprocess.run(
            ["make", "-n", target], cwd=clone, capture_output=True, text=True, check=False
        )
    elif kind == "parse":
        done = _parse_only(command, clone)
        assert "parsed" in done.stdout, done.stderr[-2000:]
    else:
        if kind == "run on a staged run":
            _stage_a_run(clone)
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=clone,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert done.returncode == 0, f"{page}: {command}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    if kind == "run on a staged run":  # the run's manifest: its metadata and its files
        assert "run_id: manual__docs" in done.stdout and "summary.json" in done.stdout


@pytest.mark.parametrize("page", sorted(SCRIPTS))
def test_a_guide_runs_as_one_session(page: str, clone: Path) -> None:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / page).read_text(), flags=re.S)
    # `make venv` is checked as a make target: run here it would install the clone's dressage
    # into the checkout's linked .venv
    lines = [line for block in blocks for line in block.splitlines()]
    lines = [line for line in lines if not line.startswith("make venv")]
    script = "set -euo pipefail\n" + "\n".join(lines)
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=clone,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert SCRIPTS[page] in done.stdout, out[-4000:]
