"""Small helpers shared by tests (paths, free ports, the slime checkout, fuzz and auth figures)."""

from __future__ import annotations

import json
import math
import os
import random
import socket
import subprocess
import threading
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def slime_root() -> Path | None:
    """``$SLIME_ROOT`` resolved (a slime checkout for the real-slime tier), or None."""
    value = os.environ.get("SLIME_ROOT", "").strip()
    return Path(value).resolve() if value else None


def megatron_lm_root() -> Path | None:
    """``$MEGATRON_LM_ROOT`` resolved (Megatron-LM's training code, ``megatron/training``, at the
    tag of the pinned megatron-core), or None."""
    value = os.environ.get("MEGATRON_LM_ROOT", "").strip()
    return Path(value).resolve() if value else None


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free on 127.0.0.1 now, never handed out before in this process, and below the
    kernel's ephemeral range: a port from ``bind(0)`` lies in that range, where any outgoing
    connection of a test running beside this one can take it before the service under test binds
    it (it happened to a Ray head in CI)."""
    rng = random.Random()
    high = min(_ephemeral_low(), 32768)
    while True:
        port = rng.randrange(20000, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


ENGINE_KEY = "engine-control-key-for-tests"
"""The control key of the test engines that tests pause, abort or update (loopback only)."""


def first_line_with(stream: object, needle: str, timeout_s: float) -> str:
    """The first line of a child process's text ``stream`` that holds ``needle``; AssertionError
    with what it wrote instead when the stream ends or ``timeout_s`` passes first."""
    found: list[str] = []
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            if needle in line:
                found.append(line)
                break
            seen.append(line)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    done.wait(timeout_s)
    assert found, f"no line with {needle!r} in {timeout_s} s; it wrote: {''.join(seen)[-2000:]}"
    return found[0]


def stop(proc: subprocess.Popen[str]) -> None:
    """Terminate a child service and reap it (kill it if it outstays 30 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def report_fuzz(service: str, statuses: Counter[int], seconds: float) -> None:
    """Add a fuzz run's figures (cases, 5xx, seconds, statuses) to the JSON file named by
    ``$FUZZ_REPORT``, if set (how the issue's closing figures are produced)."""
    figures = {
        "cases": sum(statuses.values()),
        "5xx": sum(n for status, n in statuses.items() if status >= 500),
        "seconds": round(seconds, 1),
        "statuses": dict(sorted(statuses.items())),
    }
    _report("FUZZ_REPORT", service, figures)


def report_auth(matrix: str, attempts: int, refused: int) -> None:
    """Add an auth matrix's bad-credential figures (requests sent without the right key, and
    how many of them got the 401) to the JSON file named by ``$AUTH_REPORT``, if set."""
    _report("AUTH_REPORT", matrix, {"attempts": attempts, "refused": refused})


def _report(variable: str, name: str, figures: dict[str, object]) -> None:
    path = os.environ.get(variable)
    if not path:
        return
    existing = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    Path(path).write_text(json.dumps({**existing, name: figures}, indent=1))


FUZZ_SCALE_ENV = "DRESSAGE_FUZZ_SCALE"


def fuzz_scale() -> float:
    """``$DRESSAGE_FUZZ_SCALE`` (default 1): the fuzz tests draw this many times their example
    counts (scripts/chaos.py runs them at 10 for issue 15's ~20,000 cases). Below 1 (a smoke
    run) their floors shrink with them; at 1 or more the floors are CI's."""
    raw = os.environ.get(FUZZ_SCALE_ENV, "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = math.nan
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{FUZZ_SCALE_ENV} must be a positive number, got {raw!r}")
    return scale


def fuzz_examples(count: int) -> int:
    """``count`` examples at the fuzz scale (at least 1)."""
    return max(1, round(count * fuzz_scale()))


def fuzz_floor(count: int) -> int:
    """A fuzz test's floor ``count``, shrunk by a scale below 1 (never raised above it)."""
    return math.ceil(count * min(1.0, fuzz_scale()))


def fresh_clone(root: Path) -> Path:
    """The repository as a fresh clone holds it, at ``root``: its tracked and unignored files
    (no runs/, no airflow_home/), with the checkout's ``.venv`` linked in."""
    import shutil
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to(REPO / ".venv")
    return root


def bash_commands(page: Path) -> list[str]:
    """The commands of a Markdown page's bash blocks: continuation lines joined, comments
    dropped, one command a line."""
    import re

    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(re.sub(r"\s+", " ", line))
    return out
