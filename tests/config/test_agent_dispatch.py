"""The agent dispatch's settings: a slime ``args`` attribute over its ``DRESSAGE_*`` variable over
the default (declared from the field), and a bad value named with where it came from."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dressage.config.agent_dispatch import AgentDispatchSettings
from dressage.config.env import ENV
from dressage.rollout.generate.settings import dispatch_settings

pytestmark = pytest.mark.unit

URL = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AgentDispatchSettings.ENV.values():
        monkeypatch.delenv(name, raising=False)


def _args(**values: Any) -> SimpleNamespace:
    return SimpleNamespace(dressage_proxy_url=URL, **values)


def test_defaults_come_from_the_fields_and_are_declared() -> None:
    settings = dispatch_settings(_args())
    assert (settings.timeout_s, settings.attempts, settings.max_turns) == (600.0, 2, 4)
    assert str(settings.agent) == "tool_user" and not settings.partial_rollout
    declared = {name: ENV[name].default for name in AgentDispatchSettings.ENV.values()}
    assert declared["DRESSAGE_AGENT_TIMEOUT_SEC"] == "600"
    assert declared["DRESSAGE_AGENT_ATTEMPTS"] == "2"
    assert declared["DRESSAGE_AGENT_PARTIAL_ROLLOUT"] == "0"


def test_args_win_over_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_AGENT_MAX_TURNS", "7")
    monkeypatch.setenv("DRESSAGE_AGENT_TIMEOUT_SEC", "30")
    settings = dispatch_settings(_args(dressage_agent_timeout=5))
    assert (settings.max_turns, settings.timeout_s) == (7, 5.0)
    monkeypatch.setenv("DRESSAGE_PROXY_URL", "http://127.0.0.1:8/")
    assert dispatch_settings(SimpleNamespace()).proxy_url == "http://127.0.0.1:8"


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        ({"dressage_agent_attempts": 0}, {}, "args.dressage_agent_attempts=0"),
        ({}, {"DRESSAGE_AGENT_TIMEOUT_SEC": "soon"}, "DRESSAGE_AGENT_TIMEOUT_SEC='soon'"),
        ({}, {"DRESSAGE_AGENT_MAX_TURNS": "-1"}, "DRESSAGE_AGENT_MAX_TURNS='-1'"),
    ],
)
def test_a_bad_value_is_named_with_its_source(
    monkeypatch: pytest.MonkeyPatch, args: dict[str, Any], env: dict[str, str], named: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=named):
        dispatch_settings(_args(**args))
