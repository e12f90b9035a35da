"""Small helpers shared by tests (paths, free ports, the slime checkout, fuzz figures)."""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def slime_root() -> Path | None:
    """``$SLIME_ROOT`` resolved (a slime checkout for the real-slime tier), or None."""
    value = os.environ.get("SLIME_ROOT", "").strip()
    return Path(value).resolve() if value else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ENGINE_KEY = "engine-control-key-for-tests"
"""The control key of the test engines that tests pause, abort or update (loopback only)."""


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def report_fuzz(service: str, statuses: Counter[int], seconds: float) -> None:
    """Add a fuzz run's figures (cases, 5xx, seconds, statuses) to the JSON file named by
    ``$FUZZ_REPORT``, if set (how the issue's closing figures are produced)."""
    path = os.environ.get("FUZZ_REPORT")
    if not path:
        return
    figures = {
        "cases": sum(statuses.values()),
        "5xx": sum(n for status, n in statuses.items() if status >= 500),
        "seconds": round(seconds, 1),
        "statuses": dict(sorted(statuses.items())),
    }
    existing = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    Path(path).write_text(json.dumps({**existing, service: figures}, indent=1))
