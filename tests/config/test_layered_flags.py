"""The settings that used to be layered by hand, now by :mod:`dressage.config.layered`: the MOPD
config path, the rollout's proxy, the launcher's variables (``TP_SIZE``, ...), ``--address`` and
``dressage demo --steps``. For each: a flag (or ``args`` attribute) beats its variable, the
variable beats the default, an empty variable is unset, and a bad value is one sentence naming
the flag or variable and the value."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from dressage.airflow.demo import _parse as demo_args
from dressage.config.layered import SettingsError
from dressage.config.mopd_path import mopd_config_path
from dressage.config.proxy_access import ProxyAccessSettings
from dressage.config.run import MopdRunConfig, MopdRunSettings, RaySubmitSettings
from dressage.launch.slime_command import main as launch
from dressage.reward.registry import reward_modules
from dressage.training.mopd_train import add_mopd_arguments, layer_mopd_arguments
from tests.helpers import REPO

pytestmark = pytest.mark.unit

EMBEDDED = str(REPO / "configs/mopd/embedded.json")
_LAUNCHER = tuple(MopdRunSettings.ENV.values())
_OTHERS = ("DRESSAGE_PROXY_URL", "DRESSAGE_PROXY_ADMIN_KEY", "RAY_ADDRESS", "DEMO_STEPS")
_OTHERS += ("DRESSAGE_MOPD_TEACHER_CONFIG",)  # the MOPD config's old spelling


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*_LAUNCHER, *_OTHERS):
        monkeypatch.delenv(name, raising=False)


# -- the MOPD config path ---------------------------------------------------------------------


def test_the_mopd_config_path_flag_over_variable_over_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert mopd_config_path(None) is None
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", "")  # empty: unset
    assert mopd_config_path(None) is None
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", "/from/variable.json")
    assert mopd_config_path(None) == "/from/variable.json"
    assert mopd_config_path("") == "/from/variable.json"  # "" is not given
    assert mopd_config_path(Path("/from/flag.json")) == "/from/flag.json"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_old_mopd_config_variable_still_works_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DRESSAGE_MOPD_TEACHER_CONFIG", "/old.json")
    with caplog.at_level(logging.WARNING):
        assert mopd_config_path(None) == "/old.json"
        assert _layered(mopd_config=None).mopd_config == "/old.json"  # the launcher's too
    assert _warnings(caplog) == 2 * [
        "DRESSAGE_MOPD_TEACHER_CONFIG is deprecated; set DRESSAGE_MOPD_CONFIG instead"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert mopd_config_path("/flag.json") == "/flag.json"  # a flag given: no variable read
    assert _warnings(caplog) == []


def test_the_new_mopd_config_variable_wins_over_the_old_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", "/new.json")
    monkeypatch.setenv("DRESSAGE_MOPD_TEACHER_CONFIG", "/old.json")
    with caplog.at_level(logging.WARNING):
        assert mopd_config_path(None) == "/new.json"
    assert _warnings(caplog) == [
        "DRESSAGE_MOPD_TEACHER_CONFIG is deprecated and ignored: DRESSAGE_MOPD_CONFIG is set "
        "too and wins"
    ]
    caplog.clear()
    monkeypatch.setenv("DRESSAGE_MOPD_TEACHER_CONFIG", "/new.json")  # both alike: for old children
    with caplog.at_level(logging.WARNING):
        assert mopd_config_path(None) == "/new.json"
    assert _warnings(caplog) == []


def test_the_reward_modules_read_the_attribute_before_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = json.loads(Path(EMBEDDED).read_text())
    for ds in config["datasets"]:
        ds["path"] = str(REPO / "configs/mopd" / ds["path"])
        ds["eval_path"] = str(REPO / "configs/mopd" / ds["eval_path"])
    config["reward_modules"] = ["tests.reward.reward_plugin"]
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", str(tmp_path / "missing.json"))
    assert reward_modules(SimpleNamespace(mopd_config=str(path))) == ("tests.reward.reward_plugin",)
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", str(path))
    assert reward_modules(SimpleNamespace()) == ("tests.reward.reward_plugin",)


def test_the_drivers_flags_are_layered_after_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = add_mopd_arguments(argparse.ArgumentParser())
    helps = {a.dest: a.help or "" for a in parser._actions}
    assert "$DRESSAGE_MOPD_CONFIG" in helps["mopd_config"]
    assert "$DRESSAGE_PROXY_URL" in helps["dressage_proxy_url"]
    assert parser.get_default("mopd_config") is None  # read after parsing, not by argparse
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", "/v.json")
    monkeypatch.setenv("DRESSAGE_PROXY_URL", "http://variable:1")
    args = parser.parse_args([])
    layer_mopd_arguments(args)
    assert (args.mopd_config, args.dressage_proxy_url) == ("/v.json", "http://variable:1")
    args = parser.parse_args(["--mopd-config", "/f.json", "--dressage-proxy-url", "http://f:2"])
    layer_mopd_arguments(args)
    assert (args.mopd_config, args.dressage_proxy_url) == ("/f.json", "http://f:2")
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", "")
    monkeypatch.delenv("DRESSAGE_PROXY_URL")
    args = parser.parse_args([])
    layer_mopd_arguments(args)
    assert (args.mopd_config, args.dressage_proxy_url) == (None, None)


# -- the rollout's proxy ----------------------------------------------------------------------


def test_the_rollouts_proxy_attribute_over_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ProxyAccessSettings.from_args(SimpleNamespace()).proxy_url is None
    monkeypatch.setenv("DRESSAGE_PROXY_URL", "http://variable:1")
    monkeypatch.delenv("DRESSAGE_PROXY_ADMIN_KEY", raising=False)
    access = ProxyAccessSettings.from_args(SimpleNamespace(dressage_proxy_url=""))
    assert (access.proxy_url, access.admin_key) == ("http://variable:1", None)
    monkeypatch.setenv("DRESSAGE_PROXY_ADMIN_KEY", "")  # a key set but empty: an error
    with pytest.raises(SettingsError, match="DRESSAGE_PROXY_ADMIN_KEY is set but empty"):
        ProxyAccessSettings.from_args(SimpleNamespace())
    given = SimpleNamespace(dressage_proxy_url="http://attr:2", dressage_proxy_admin_key="k" * 12)
    access = ProxyAccessSettings.from_args(given)
    assert (access.proxy_url, access.admin_key) == ("http://attr:2", "k" * 12)


# -- the launcher -----------------------------------------------------------------------------


def _layered(**flags: object) -> MopdRunSettings:
    given = {"mopd_config": EMBEDDED, "output_dir": "/tmp/out", **flags}
    return MopdRunSettings.layered(given, given_as={name: f"--{name}" for name in given})


def test_the_launchers_flag_over_variable_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    default = MopdRunConfig.model_fields["tp_size"].default
    assert _layered().tp_size == default
    monkeypatch.setenv("TP_SIZE", "")  # empty: unset
    assert _layered().tp_size == default
    monkeypatch.setenv("TP_SIZE", "4")
    monkeypatch.setenv("USE_WANDB", "1")
    assert (_layered().tp_size, _layered().use_wandb) == (4, True)
    assert (_layered(tp_size="2").tp_size, _layered(use_wandb=False).use_wandb) == (2, False)
    assert isinstance(_layered(), MopdRunConfig)  # what build_mopd_job takes


def test_the_launchers_variables_set_the_required_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", EMBEDDED)
    monkeypatch.setenv("OUTPUT_DIR", "/tmp/variable")
    run = MopdRunSettings.layered({"output_dir": None}, given_as={})
    assert (run.mopd_config, run.output_dir) == (EMBEDDED, "/tmp/variable")
    monkeypatch.delenv("OUTPUT_DIR")
    with pytest.raises(SettingsError) as caught:
        MopdRunSettings.layered({}, given_as={"output_dir": "--output-dir"})
    assert caught.value.sentences == ("--output-dir or OUTPUT_DIR is required",)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TP_SIZE", "abc", "TP_SIZE should be a valid integer"),
        ("NUM_ROLLOUT", "0", "NUM_ROLLOUT should be greater than or equal to 1, got '0'"),
        ("USE_WANDB", "maybe", "USE_WANDB should be a valid boolean"),
    ],
)
def test_a_bad_launcher_variable_is_one_sentence_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    said: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert launch(["--mopd-config", EMBEDDED, "--output-dir", "/tmp/never-written"]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and f"'{value}'" in err and len(err.splitlines()) == 1
    assert "pydantic" not in err and "validation error" not in err and "type=" not in err


def test_a_flag_beats_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEED", "abc")
    assert _layered(seed="3").seed == 3


def test_the_submit_address_flag_over_variable_over_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def address(flag: str | None) -> str:
        given = {"address": flag}
        return RaySubmitSettings.layered(given, given_as={"address": "--address"}).address

    assert address(None) == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_ADDRESS", "")
    assert address(None) == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert (address(None), address("http://flag:8265")) == ("http://head:8265", "http://flag:8265")


# -- dressage demo ----------------------------------------------------------------------------


def test_the_demo_steps_flag_over_variable_over_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo_args([]).steps == 100
    monkeypatch.setenv("DEMO_STEPS", "")
    assert demo_args([]).steps == 100
    monkeypatch.setenv("DEMO_STEPS", "7")
    assert (demo_args([]).steps, demo_args(["--steps", "3"]).steps) == (7, 3)
    monkeypatch.setenv("DEMO_STEPS", "lots")
    with pytest.raises(SystemExit) as exit_:
        demo_args([])
    assert exit_.value.code == 2
    assert "DEMO_STEPS should be a valid integer" in capsys.readouterr().err
