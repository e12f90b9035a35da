"""The proxy's settings in their home: pydantic-settings layers flags over variables over
defaults, each default written once (on its field), and a directly built config reads no
environment. (Flag and variable names are covered by tests/proxy/test_proxy_api.py.)"""

from __future__ import annotations

import logging

import pytest

from dressage.config.env import ENV, env_float
from dressage.config.proxy import (
    DEFAULT_PAUSE_TIMEOUT_S,
    PROXY_ENV,
    ProxyConfig,
    ProxyConfigError,
    ProxySettings,
    config_from_argv,
    parser,
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
    monkeypatch.setenv("DRESSAGE_PROXY_SERVED_MODEL_NAME", "from-env")
    assert (ProxyConfig().port, ProxyConfig().served_model_name) == (8000, "dressage")
    layered, _ = config_from_argv(["--served-model-name", "from-flag"])
    assert isinstance(layered, ProxySettings) and isinstance(layered, ProxyConfig)
    assert (layered.port, layered.served_model_name) == (9, "from-flag")


def test_a_bad_variable_names_itself_and_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_ENGINE_TIMEOUT_SEC", "soon")
    with pytest.raises(ProxyConfigError) as info:
        config_from_argv([])
    assert info.value.sentences == (
        "DRESSAGE_PROXY_ENGINE_TIMEOUT_SEC should be a valid number, unable to parse string as a "
        "number, got 'soon'",
    )
    with pytest.raises(ProxyConfigError) as info:  # the flag wins, and is the one named
        config_from_argv(["--engine-timeout-sec", "-1"])
    assert info.value.sentences == ("--engine-timeout-sec should be greater than 0, got -1.0",)


def test_a_check_across_fields_shows_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_API_KEY", "api-key-0123456789")
    with pytest.raises(ProxyConfigError) as info:
        config_from_argv(["--host", "0.0.0.0"])
    (sentence,) = info.value.sentences
    assert sentence.startswith("host '0.0.0.0' is not a loopback address: set an admin key")
    assert "api-key-0123456789" not in str(info.value)


def test_flags_and_variables_are_spelled_alike() -> None:
    flags: dict[str, list[str]] = {}
    for action in parser()._actions:
        flags.setdefault(action.dest, []).extend(action.option_strings)
    assert "--served-model-name" in flags["served_model_name"]
    assert PROXY_ENV["served_model_name"] == "DRESSAGE_PROXY_SERVED_MODEL_NAME"
    assert "--engine-timeout-sec" in flags["engine_timeout_s"]
    assert PROXY_ENV["engine_timeout_s"] == "DRESSAGE_PROXY_ENGINE_TIMEOUT_SEC"
    assert "--pause-timeout-sec" in flags["pause_timeout_s"]
    assert PROXY_ENV["pause_timeout_s"] == "DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC"


def test_old_spellings_still_work_and_name_the_new_ones(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("DRESSAGE_PROXY_SERVED_MODEL_NAME", raising=False)
    monkeypatch.setenv("DRESSAGE_PROXY_MODEL_NAME", "old-name")
    with caplog.at_level(logging.WARNING):
        config, _ = config_from_argv(["--engine-timeout", "5", "--pause-timeout", "7"])
    assert (config.engine_timeout_s, config.pause_timeout_s) == (5.0, 7.0)
    assert config.served_model_name == "old-name"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("--engine-timeout is deprecated; use --engine-timeout-sec" in w for w in warnings)
    assert any("--pause-timeout is deprecated; use --pause-timeout-sec" in w for w in warnings)
    assert any(
        "DRESSAGE_PROXY_MODEL_NAME is deprecated; set DRESSAGE_PROXY_SERVED_MODEL_NAME" in w
        for w in warnings
    )


def test_the_new_variable_wins_over_the_old_one_and_the_warning_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_MODEL_NAME", "old-name")
    monkeypatch.setenv("DRESSAGE_PROXY_SERVED_MODEL_NAME", "new-name")
    with caplog.at_level(logging.WARNING):
        config, _ = config_from_argv([])
    assert config.served_model_name == "new-name"
    deprecated = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert deprecated == [
        "DRESSAGE_PROXY_MODEL_NAME is deprecated and ignored: "
        "DRESSAGE_PROXY_SERVED_MODEL_NAME is set too and wins"
    ]
    caplog.clear()
    monkeypatch.setenv("DRESSAGE_PROXY_MODEL_NAME", "new-name")  # both alike: no warning
    with caplog.at_level(logging.WARNING):
        assert config_from_argv([])[0].served_model_name == "new-name"
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]


def test_the_worker_count_comes_from_its_flag_or_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from dressage.config.proxy import config_from_argv

    assert config_from_argv([])[0].workers == 1
    monkeypatch.setenv("DRESSAGE_PROXY_WORKERS", "4")
    assert config_from_argv([])[0].workers == 4
    assert config_from_argv(["--workers", "2"])[0].workers == 2
