"""The trainer's pause client settings: a value given to ``RolloutPause.from_env`` over its
``DRESSAGE_PROXY_*`` variable over the default, each default on its field, and a bad variable
named with its value."""

from __future__ import annotations

import pytest

from dressage.config.env import ENV
from dressage.config.pause_client import PauseClientSettings
from dressage.config.proxy import DEFAULT_PAUSE_TIMEOUT_S
from dressage.training.proxy_pause_client import RolloutPause

pytestmark = pytest.mark.unit

_VARIABLES = (
    "DRESSAGE_PROXY_URL",
    "DRESSAGE_PROXY_ADMIN_KEY",
    "DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE",
    "DRESSAGE_PROXY_PAUSE_REQUIRED",
    "DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_the_declared_ones() -> None:
    pause = RolloutPause.from_env()
    assert (pause.proxy_url, pause.enabled, pause.required) == (None, True, False)
    assert pause.timeout_s == DEFAULT_PAUSE_TIMEOUT_S
    assert ENV["DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE"].default == "1"
    assert ENV["DRESSAGE_PROXY_PAUSE_REQUIRED"].default == "0"


def test_given_values_win_over_variables_and_empty_variables_are_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC", "")
    monkeypatch.setenv("DRESSAGE_PROXY_PAUSE_REQUIRED", "yes")
    assert RolloutPause.from_env().proxy_url == "http://127.0.0.1:1"
    pause = RolloutPause.from_env(proxy_url="http://127.0.0.1:2", mode="in_place")
    assert (pause.proxy_url, pause.required, pause.mode) == ("http://127.0.0.1:2", True, "in_place")
    assert pause.timeout_s == DEFAULT_PAUSE_TIMEOUT_S


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC", "0"),  # the proxy refuses it too
        ("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC", "1e9"),  # longer than a day
        ("DRESSAGE_PROXY_PAUSE_REQUIRED", "maybe"),
    ],
)
def test_a_bad_variable_is_named_with_its_value(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}='{value}'"):
        RolloutPause.from_env()


def test_a_key_is_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="admin_key=<hidden>") as caught:
        PauseClientSettings.layered({"admin_key": ["k-secret-123"]}, given_as={})
    assert "k-secret-123" not in str(caught.value)
