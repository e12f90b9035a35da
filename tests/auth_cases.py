"""The header cases of the auth matrices (tests/engine/test_engine_auth.py, the proxy's
tests/proxy/test_proxy_auth.py), and a client that sends them as they are.

Headers go out through ``http.client``, which sends them byte for byte: httpx refuses a header
value with a trailing space, and such headers are among the cases.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


def accepted(key: str) -> dict[str, str]:
    """Headers that carry ``key``: the scheme in any case, whitespace around the value."""
    return {
        "Bearer": f"Bearer {key}",
        "bearer": f"bearer {key}",
        "BEARER": f"BEARER {key}",
        "padded": f" Bearer {key}\t ",
    }


def refused(key: str, other: str | None) -> dict[str, str | None]:
    """Headers that do not carry ``key`` (``other``: the service's other key, if it has one)."""
    cases: dict[str, str | None] = {
        "no header": None,
        "wrong key": "Bearer wrong-key-0123456",
        "empty key": "Bearer ",
        "scheme only": "Bearer",
        "key without scheme": key,
        "two spaces": f"Bearer  {key}",
        "tab": f"Bearer\t{key}",
        "space inside": f"Bearer {key[:5]} {key[5:]}",
        "prefix of the key": f"Bearer {key[:-1]}",
        "key and more": f"Bearer {key}x",
        "other scheme": f"Basic {key}",
    }
    if other is not None:
        cases["the other key"] = f"Bearer {other}"
    return cases


def call(
    url: str, method: str, path: str, header: str | None, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    headers = {"content-type": "application/json"}
    if header is not None:
        headers["authorization"] = header
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw) if raw else None
    except ValueError:
        return response.status, raw.decode("utf-8", "replace")
