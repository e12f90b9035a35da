"""The async driver: its slime contract, its loop, its pause policy, and the same loop end to end
on the embedded trainer, engine and proxy (generation overlapping training, agents paused at a
token boundary and continued with the new weights)."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from dressage.proxy.tito import create_tito_tokenizer
from dressage.training import train_async_with_rollout_pause as driver
from dressage.training.proxy_pause_client import (
    RolloutPause,
    RolloutPauseError,
    update_weights_with_pause,
)
from tests.helpers import REPO, free_port
from tests.training.slime_contract import check_slime_imports, contract, methods

DRIVER = REPO / "dressage/training/train_async_with_rollout_pause.py"


# -- the slime contract -------------------------------------------------------------------------


@pytest.mark.unit
def test_slime_imports_are_lazy_and_in_the_contract() -> None:
    check_slime_imports(DRIVER)


def _owner(node: ast.expr) -> str | None:
    """``actor_model`` for ``actor_model.x`` and ``self.actor_model.x``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr if node.value.id == "self" else None
    return None


@pytest.mark.unit
def test_driver_calls_only_slimes_actor_group_and_rollout_manager_methods() -> None:
    tree = ast.parse(DRIVER.read_text())
    group_methods = set(methods("train_group"))
    manager_methods = set(methods("rollout_manager"))
    on_group, on_manager = set(), set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        func = node.func
        if _owner(func.value) in {"actor_model", "critic_model"}:
            on_group.add(func.attr)
        if func.attr == "remote" and isinstance(func.value, ast.Attribute):
            if _owner(func.value.value) == "rollout_manager":
                on_manager.add(func.value.attr)
    assert {"async_train", "update_weights", "save_model"} <= on_group <= group_methods
    assert {"generate", "save", "eval", "dispose"} <= on_manager <= manager_methods
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    (create,) = [c for c in calls if getattr(c.func, "id", "") == "create_training_models"]
    assert len(create.args) == 3 and not create.keywords
    (parse,) = [c for c in calls if getattr(c.func, "id", "") == "parse_args"]
    assert [k.arg for k in parse.keywords] == contract()["parse_args"]["keywords"]


@pytest.mark.unit
def test_every_weight_update_of_the_loop_goes_through_the_pause() -> None:
    tree = ast.parse(DRIVER.read_text())
    loop = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "train_async"
    )
    wrapped = [
        c
        for c in ast.walk(loop)
        if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "update_weights_with_pause"
    ]
    assert len(wrapped) == 2, "the initial push and the in-loop update (slime §6.2)"
    for call in wrapped:
        assert ast.unparse(call.args[1]) == "backend.update_weights"
    direct = [
        c
        for c in ast.walk(loop)
        if isinstance(c, ast.Call) and ast.unparse(c.func).endswith("update_weights")
    ]
    assert not direct, "no weight update may bypass the pause"


@pytest.mark.unit
def test_driver_imports_without_slime_and_adds_its_flags() -> None:
    code = (
        "import sys, argparse, dressage.training.train_async_with_rollout_pause as d\n"
        "assert not [m for m in sys.modules if m == 'slime' or m.startswith('slime.')]\n"
        "a = d.add_rollout_pause_arguments(argparse.ArgumentParser()).parse_args(\n"
        "    ['--dressage-max-staleness', '2', '--dressage-stale-policy', 'mask',\n"
        "     '--dressage-async-max-groups-ahead', '16'])\n"
        "assert (a.dressage_max_staleness, a.dressage_stale_policy) == (2, 'mask')\n"
        "assert a.dressage_async_max_groups_ahead == 16\n"
        "assert a.dressage_pause_mode == 'abort' and a.dressage_proxy_url is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


# -- the loop -------------------------------------------------------------------------------------


class _Recorder:
    """A backend and a pause that write what they are asked into one log."""

    releases_train = False
    num_rollout_per_epoch = None

    def __init__(self) -> None:
        self.log: list[str] = []
        self.version = 0

    def generate(self, rollout_id: int) -> int:
        self.log.append(f"generate {rollout_id}")
        return rollout_id

    def wait(self, handle: int) -> str:
        self.log.append(f"wait {handle}")
        return f"data {handle}"

    def train(self, rollout_id: int, rollout_data: Any) -> None:
        self.log.append(f"train {rollout_id} on {rollout_data}")

    def create(self) -> None:
        self.log.append("create")

    def save(self, rollout_id: int, *, force_sync: bool) -> None:
        self.log.append(f"save {rollout_id}" + (" (sync)" if force_sync else ""))

    def update_weights(self) -> int:
        self.version += 1
        self.log.append(f"update -> {self.version}")
        return self.version

    def evaluate(self, rollout_id: int) -> None:
        self.log.append(f"eval {rollout_id}")

    def dispose(self) -> None:
        self.log.append("dispose")


class _RecordingPause(RolloutPause):
    def __init__(self, log: list[str]) -> None:
        super().__init__(proxy_url="http://unused")
        self.log = log

    def pause(self, reason: str) -> dict[str, Any] | None:
        self.log.append(f"pause ({reason})")
        return {"paused": True}

    def resume(self, version: int | None, reason: str) -> dict[str, Any] | None:
        self.log.append(f"resume {version}")
        return {"resumed": True}


@pytest.mark.unit
def test_the_loop_is_slimes_train_async() -> None:
    backend = _Recorder()
    args = SimpleNamespace(
        num_rollout=4, update_weights_interval=2, save_interval=3, eval_interval=2
    )
    driver.train_async(args, backend, _RecordingPause(backend.log))
    assert backend.log == [
        "pause (initial weights)", "update -> 1", "resume 1",
        "generate 0",
        "wait 0", "generate 1", "train 0 on data 0",
        "wait 1", "generate 2", "train 1 on data 1",
        "wait 2", "pause (rollout 1)", "update -> 2", "resume 2", "eval 1",
        "generate 3", "train 2 on data 2", "save 2",
        "wait 3", "train 3 on data 3", "save 3 (sync)",
        "pause (rollout 3)", "update -> 3", "resume 3", "eval 3",
        "dispose",
    ]  # fmt: skip


# -- the pause policy against a real proxy ---------------------------------------------------------


@pytest.fixture
def proxy(qwen35_tokenizer: Any, tmp_path: Path) -> Iterator[str]:
    from dressage.proxy.testing import EngineReply, ScriptedEngine
    from tests.proxy.conftest import running_proxy

    tito = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
    engine = ScriptedEngine(lambda body: EngineReply([1, 2]), weight_version="3")
    with (
        engine.running() as engine_url,
        running_proxy(engine_url, tmp_path / "store", tito, admin_key="k" * 12) as url,
    ):
        yield url


def _state(url: str) -> dict[str, Any]:
    response = httpx.get(
        f"{url}/v1/rollout/pause_state", headers={"authorization": "Bearer " + "k" * 12}
    )
    return dict(response.json())


@pytest.mark.integration
def test_pause_update_resume_against_the_proxy(proxy: str) -> None:
    pause = RolloutPause(proxy_url=proxy, admin_key="k" * 12, required=True, timeout_s=30)
    seen: list[dict[str, Any]] = []
    version = update_weights_with_pause(pause, lambda: seen.append(_state(proxy)) or 4, reason="u1")
    assert version == 4 and seen[0]["paused"] and seen[0]["reason"] == "u1"
    state = _state(proxy)
    assert not state["paused"] and state["weight_version"] == 4 and state["pauses"] == 1
    event = pause.events[-1]
    assert event["paused"] and event["resume"]["released_calls"] == 0 and event["version"] == 4

    def failing() -> int:
        raise RuntimeError("update failed")

    with pytest.raises(RuntimeError, match="update failed"):
        update_weights_with_pause(pause, failing, reason="u2")
    assert not _state(proxy)["paused"], "a failed update still resumes"
    assert _state(proxy)["weight_version"] == 4, "the engine says 3: the version never goes back"


@pytest.mark.integration
def test_pause_failures_follow_pause_required(
    proxy: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    updates: list[int] = []
    required = RolloutPause(proxy_url=down, required=True)
    with pytest.raises(RolloutPauseError, match=f"pause of the proxy at {down} for 'u'"):
        update_weights_with_pause(required, lambda: updates.append(1) or 1, reason="u")
    assert updates == [], "a required pause that fails stops the update"

    caplog.set_level(logging.WARNING, logger="dressage.training.proxy_pause_client")
    lenient = RolloutPause(proxy_url=down, required=False)
    assert update_weights_with_pause(lenient, lambda: 7, reason="u") == 7
    assert "goes on unpaused" in caplog.text
    assert lenient.events[-1]["paused"] is False

    monkeypatch.setenv("DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE", "0")
    monkeypatch.setenv("DRESSAGE_PROXY_PAUSE_REQUIRED", "1")
    monkeypatch.setenv("DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC", "12")
    off = RolloutPause.from_env(proxy_url=proxy, admin_key="k" * 12)
    assert (off.enabled, off.required, off.timeout_s) == (False, True, 12.0)
    assert update_weights_with_pause(off, lambda: 5, reason="u") == 5
    assert _state(proxy)["pauses"] == 0, "switched off: the proxy is not paused"
    monkeypatch.delenv("DRESSAGE_PROXY_URL", raising=False)
    with pytest.raises(RolloutPauseError, match="no proxy URL"):
        monkeypatch.setenv("DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE", "1")
        update_weights_with_pause(RolloutPause.from_env(), lambda: 1, reason="u")


@pytest.mark.unit
def test_rollout_routing_replay_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GRPO driver's entry: slime's parser stands in (it needs SGLang), the refusal names the
    flag and no backend is built."""
    parsed = SimpleNamespace(use_rollout_routing_replay=True)
    fake = type(sys)("slime.utils.arguments")
    fake.parse_args = lambda add_custom_arguments: parsed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slime.utils.arguments", fake)
    monkeypatch.setattr(driver, "SlimeBackend", lambda args: pytest.fail("a backend was built"))
    assert driver.main([]) == 2
    assert "--use-rollout-routing-replay" in capsys.readouterr().err
