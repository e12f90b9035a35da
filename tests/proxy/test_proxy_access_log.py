"""The access log: one line per request with method, route, session, status, milliseconds and,
on a 4xx, the refused field; never message content nor a key; on with ``--access-log``."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from dressage.config.proxy import config_from_argv
from dressage.proxy.access_log import ACCESS_LOGGER
from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration

ANSWER = "ok\n</think>\n\nFine.<|im_end|>"
SECRET = "the-content-no-log-may-hold"
KEY = "chat-key-0123456789"
LINE = re.compile(
    r"^(?P<method>[A-Z]+) (?P<route>\S+) session=(?P<session>\S+) status=(?P<status>\d+) "
    r"ms=(?P<ms>[0-9.]+)(?: refused=(?P<refused>\S+))?(?: code=(?P<code>\S+))?$"
)


def _lines(caplog: pytest.LogCaptureFixture) -> list[re.Match[str]]:
    out = []
    for record in caplog.records:
        if record.name == ACCESS_LOGGER:
            match = LINE.match(record.getMessage())
            assert match, record.getMessage()
            assert record.levelno == logging.INFO
            out.append(match)
    return out


def test_one_line_per_request_with_the_refused_field_and_nothing_secret(
    tmp_path: Path,
    qwen35_tito: TITOTokenizer,
    script: Callable[..., Script],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "m", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 8}
    proxy = scripted_proxy(script(ANSWER), tmp_path, qwen35_tito, api_key=KEY, access_log=True)
    with proxy as (url, _):
        ok = httpx.post(f"{url}/sessions/s-1/v1/chat/completions", json=body, headers=auth)
        bad = httpx.post(
            f"{url}/v1/chat/completions",
            json={**body, "top_p": 5},
            headers={**auth, "X-Session-Id": "s-2"},
        )
        wrong_key = httpx.post(
            f"{url}/sessions/s-3/v1/chat/completions",
            json=body,
            headers={"Authorization": "Bearer not-the-key-at-all"},
        )
        health = httpx.get(f"{url}/health")
    assert (ok.status_code, bad.status_code, wrong_key.status_code) == (200, 400, 401)
    assert health.status_code == 200
    lines = _lines(caplog)
    while lines and lines[0]["route"] == "/health":  # serve_proxy's own wait for the proxy
        lines.pop(0)
    assert len(lines) == 4, [m.group(0) for m in lines]
    first, second, third, fourth = lines
    assert first["method"] == "POST"
    assert first["route"] == "/sessions/{session_id}/v1/chat/completions"
    assert (first["session"], first["status"], first["refused"]) == ("s-1", "200", None)
    assert float(first["ms"]) > 0
    assert second["route"] == "/v1/chat/completions"
    assert (second["session"], second["status"], second["refused"]) == ("s-2", "400", "top_p")
    assert (third["session"], third["status"], third["code"]) == ("s-3", "401", "invalid_api_key")
    assert (fourth["method"], fourth["route"], fourth["status"]) == ("GET", "/health", "200")
    text = "\n".join(m.group(0) for m in lines)
    assert SECRET not in text and KEY not in text and "not-the-key" not in text


def test_no_access_log_writes_no_line(
    tmp_path: Path,
    qwen35_tito: TITOTokenizer,
    script: Callable[..., Script],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with scripted_proxy(script(ANSWER), tmp_path, qwen35_tito, access_log=False) as (url, _):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 5}
        answer = httpx.post(f"{url}/sessions/s/v1/chat/completions", json=body)
        assert answer.status_code == 400
    assert _lines(caplog) == []


def test_the_access_log_is_off_by_default_and_a_flag_turns_it_on() -> None:
    assert config_from_argv([])[0].access_log is False
    assert config_from_argv(["--access-log"])[0].access_log is True
    assert config_from_argv(["--no-access-log"])[0].access_log is False
