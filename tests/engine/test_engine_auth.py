"""Who may call what on the embedded engine (issue 15, item 2).

Every control route x every way of sending a key, for each key setup SGLang knows (admin key
only, API key only, both), against a real engine; the data routes as the server's docstring
documents them; weight-update errors that do not tell which paths exist; and the start-up
refusals of ``dressage engine serve``, through the real command line in this process.
The header cases are in tests/auth_cases.py (the proxy's matrix uses the same).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dressage.cli import main as dressage_main
from tests.auth_cases import accepted, call, refused
from tests.helpers import report_auth

ADMIN = "engine-admin-key-0123"
API = "engine-api-key-0123"
UNAUTHORIZED = (401, {"error": "Unauthorized"})

CONTROL: list[tuple[str, str, dict[str, Any] | None, int]] = [
    ("POST", "/abort_request", {"rid": "no-such-request"}, 200),
    ("POST", "/abort_request", {"abort_all": True}, 200),
    ("POST", "/pause_generation", {"mode": "abort"}, 200),
    ("POST", "/continue_generation", {}, 200),
    ("POST", "/update_weight_version", {"new_version": "matrix"}, 200),
    ("GET", "/flush_cache", None, 200),
    ("POST", "/flush_cache", None, 200),
    ("POST", "/update_weights_from_disk", {"model_path": "/no/such/folder"}, 400),
    ("POST", "/update_weights_from_disk", {"model_path": 5}, 400),  # a bad body: 400, not 401
    ("POST", "/no_such_route", {}, 404),  # an unknown path is a control path
]
"""(method, path, body, status once the key is right)."""

DATA: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}),
    ("GET", "/model_info", None),
    ("GET", "/get_model_info", None),
    ("GET", "/server_info", None),
    ("GET", "/get_server_info", None),
    ("GET", "/v1/loads", None),
    ("GET", "/get_load", None),
]
OPEN = [("GET", "/health", None), ("GET", "/health_generate", None)]


# ------------------------------------------------------------------------------ the matrix
KEYS = {"admin key only": (None, ADMIN), "API key only": (API, None), "both keys": (API, ADMIN)}


@pytest.fixture(scope="module", params=list(KEYS))
def keyed(request: pytest.FixtureRequest, tiny_model_path: Path) -> Iterator[tuple[str, str]]:
    from dressage.engine.testing import serve_engine

    api_key, admin_key = KEYS[request.param]
    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, context_length=256,
        api_key=api_key, admin_api_key=admin_key,
    ) as url:  # fmt: skip
        yield request.param, url


@pytest.mark.integration
def test_control_routes_need_the_control_key(keyed: tuple[str, str]) -> None:
    setup, url = keyed
    api_key, admin_key = KEYS[setup]
    control_key = admin_key or api_key
    assert control_key is not None
    other = api_key if admin_key else None
    wrong = []
    for name, header in refused(control_key, other).items():
        for method, path, body, _ in CONTROL:
            got = call(url, method, path, header, body)
            if got != UNAUTHORIZED:
                wrong.append((name, method, path, got))
    attempts = len(refused(control_key, other)) * len(CONTROL)
    report_auth(f"engine control routes ({setup})", attempts, attempts - len(wrong))
    assert not wrong, f"{setup}: answered without the control key: {wrong}"
    api_header = f"Bearer {api_key}" if api_key else None
    info = call(url, "GET", "/model_info", api_header)[1]
    loads = call(url, "GET", "/v1/loads", api_header)[1]["loads"][0]
    assert info["weight_version"] == "default"  # nothing happened
    assert loads["paused"] is None and not loads["gate_closed"]
    for name, header in accepted(control_key).items():
        for method, path, body, status in CONTROL:
            got = call(url, method, path, header, body)
            if got[0] != status:
                wrong.append((name, method, path, got))
    assert not wrong, f"{setup}: the control key was refused or misanswered: {wrong}"
    assert call(url, "GET", "/model_info", api_header)[1]["weight_version"] == "matrix"


@pytest.mark.integration
def test_data_routes_need_the_api_key_only_when_there_is_one(keyed: tuple[str, str]) -> None:
    setup, url = keyed
    api_key, admin_key = KEYS[setup]
    wrong = []
    if api_key is None:  # open, whatever the header says
        headers: dict[str, str | None] = {"none": None, "garbage": "Bearer nonsense"}
        for name, header in (headers | {"admin": f"Bearer {admin_key}"}).items():
            for method, path, body in DATA:
                if (got := call(url, method, path, header, body))[0] != 200:
                    wrong.append((name, path, got))
    else:
        for name, header in refused(api_key, admin_key).items():
            for method, path, body in DATA:
                if (got := call(url, method, path, header, body)) != UNAUTHORIZED:
                    wrong.append((name, path, got))
        attempts = len(refused(api_key, admin_key)) * len(DATA)
        report_auth(f"engine data routes ({setup})", attempts, attempts - len(wrong))
        for name, header in accepted(api_key).items():
            for method, path, body in DATA:
                if (got := call(url, method, path, header, body))[0] != 200:
                    wrong.append((name, path, got))
    for method, path, body in OPEN:  # health never asks for a key
        for header in (None, "Bearer wrong-key-0123456"):
            if (got := call(url, method, path, header, body))[0] != 200:
                wrong.append((header, path, got))
    assert not wrong, f"{setup}: {wrong}"


@pytest.mark.integration
def test_the_explicit_opt_out_serves_control_routes_without_a_key(engine_url: str) -> None:
    """The shared test engine runs with ``open_control_routes`` (loopback only)."""
    assert call(engine_url, "POST", "/abort_request", None, {"rid": "nothing"})[0] == 200
    assert call(engine_url, "POST", "/no_such_route", None, {})[0] == 404


@pytest.mark.integration
def test_weight_update_errors_do_not_tell_which_paths_exist(
    keyed: tuple[str, str], tiny_model_path: Path, tmp_path: Path
) -> None:
    setup, url = keyed
    api_key, admin_key = KEYS[setup]
    key = admin_key or api_key
    (tmp_path / "file").write_text("not a model")
    paths = ["/no/such/folder", str(tmp_path), str(tmp_path / "file"), "/etc", "/root"]
    keyless = [
        call(url, "POST", "/update_weights_from_disk", header, {"model_path": p})
        for header in (None, "Bearer wrong-key-0123456")
        for p in paths
    ]
    report_auth(f"engine weight updates ({setup})", len(keyless), keyless.count(UNAUTHORIZED))
    assert keyless == [UNAUTHORIZED] * len(keyless)
    answers = [
        call(url, "POST", "/update_weights_from_disk", f"Bearer {key}", {"model_path": p})
        for p in paths
    ]
    assert len({json.dumps(a) for a in answers}) == 1, answers  # the same, whatever the path
    status, body = answers[0]
    assert status == 400 and body["success"] is False and "model_path" in body["message"]
    assert not any(p in body["message"] for p in paths)


# ------------------------------------------------------------------------------ start-up
@pytest.fixture
def no_engine_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("DRESSAGE_ENGINE_ADMIN_KEY", "DRESSAGE_ENGINE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def serve(argv: list[str], port: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``dressage engine serve`` in this process; the model does not exist, so it must stop
    before it loads anything."""
    base = ["engine", "serve", "--model", "/no/such/model", "--device", "cpu"]
    code = dressage_main([*base, "--port", str(port), *argv])
    return code, capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [
        ({"DRESSAGE_ENGINE_ADMIN_KEY": ""}, [], "DRESSAGE_ENGINE_ADMIN_KEY is set but empty"),
        (
            {"DRESSAGE_ENGINE_ADMIN_KEY": ADMIN, "DRESSAGE_ENGINE_API_KEY": ""},
            [],
            "DRESSAGE_ENGINE_API_KEY is set but empty",
        ),
        ({}, [], "need a key: set DRESSAGE_ENGINE_ADMIN_KEY"),
        ({}, ["--host", "0.0.0.0"], "'0.0.0.0' is not a loopback address"),
        ({}, ["--host", "0.0.0.0", "--open-control-routes"], "is not a loopback address"),
        ({}, ["--host", "::", "--open-control-routes"], "is not a loopback address"),
        ({}, ["--admin-api-key", ""], "--admin-api-key is empty: an empty key is not"),
        ({"DRESSAGE_ENGINE_ADMIN_KEY": "two words"}, [], "printable ASCII without spaces"),
        ({"DRESSAGE_ENGINE_ADMIN_KEY": ADMIN}, ["--open-control-routes"], "pick one"),
    ],
)
def test_the_command_line_refuses_to_start_open(
    env: dict[str, str],
    argv: list[str],
    expected: str,
    busy_port: int,
    no_engine_keys: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        no_engine_keys.setenv(name, value)
    code, err = serve(argv, busy_port, capsys)
    assert code == 2 and expected in err, err
    assert "two words" not in err  # a refused key is never printed


@pytest.mark.unit
def test_keys_come_from_the_environment(no_engine_keys: pytest.MonkeyPatch) -> None:
    from dressage.engine.cli import config_from_args

    no_engine_keys.setenv("DRESSAGE_ENGINE_ADMIN_KEY", ADMIN)
    no_engine_keys.setenv("DRESSAGE_ENGINE_API_KEY", API)
    config, _ = config_from_args(["--model", "/m"])
    assert (config.admin_api_key, config.api_key, config.control_key) == (ADMIN, API, ADMIN)
    config, _ = config_from_args(["--model", "/m", "--admin-api-key", "flag-key-01"])
    assert config.admin_api_key == "flag-key-01"  # SGLang's flag wins over the variable
    no_engine_keys.delenv("DRESSAGE_ENGINE_ADMIN_KEY")
    no_engine_keys.delenv("DRESSAGE_ENGINE_API_KEY")
    config, _ = config_from_args(["--model", "/m", "--open-control-routes"])
    assert config.control_key is None and config.open_control_routes
