"""Small helpers shared by tests (paths, free ports, the slime checkout)."""

from __future__ import annotations

import os
import socket
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
