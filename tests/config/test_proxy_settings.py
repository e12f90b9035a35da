"""The proxy's settings in their home: pydantic-settings layers flags over variables over
defaults, each default written once (on its field), and a directly built config reads no
environment. (Flag and variable names are covered by tests/proxy/test_proxy_api.py.)"""

from __future__ import annotations

import pytest

from dressage.config.env import ENV, env_float
from dressage.config.proxy import (
    DEFAULT_PAUSE_TIMEOUT_S,
    PROXY_ENV,
    ProxyConfig,
    ProxyConfigError,
    ProxySettings,
    config_from_argv,
)
from dressage.training.proxy_pause_client import RolloutPause

pytestmark = pytest.mark.unit


def test_every_field_has_its_variable_declared_with_the_fields_default() -> None:
    for field, info in ProxyConfig.model_fields.items():
        declared = ENV[PROXY_ENV[field]]
        assert declared.doc == info.description, field
        if info.default is None:
            assert declared.default is None, field
            continue
        exported = ProxyConfig.model_validate({field: declared.default})
        assert getattr(exported, field) == info.default, (field, declared.default)


def test_the_pause_timeout_default_is_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC", raising=False)
    assert ProxyConfig().pause_timeout_s == DEFAULT_PAUSE_TIMEOUT_S
    assert env_float("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC") == DEFAULT_PAUSE_TIMEOUT_S
    assert RolloutPause.from_env().timeout_s == DEFAULT_PAUSE_TIMEOUT_S


def test_a_config_built_directly_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_PORT", "9")
    monkeypatch.setenv("DRESSAGE_PROXY_MODEL_NAME", "from-env")
    assert (ProxyConfig().port, ProxyConfig().served_model_name) == (8000, "dressage")
    layered, _ = config_from_argv(["--served-model-name", "from-flag"])
    assert isinstance(layered, ProxySettings) and isinstance(layered, ProxyConfig)
    assert (layered.port, layered.served_model_name) == (9, "from-flag")


def test_a_bad_variable_names_itself_and_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_ENGINE_TIMEOUT_SEC", "soon")
    with pytest.raises(ProxyConfigError) as info:
        config_from_argv([])
    message = str(info.value)
    assert "engine_timeout_s" in message and "DRESSAGE_PROXY_ENGINE_TIMEOUT_SEC" in message
    assert "'soon'" in message and "--engine-timeout" in message
