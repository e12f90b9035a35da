"""``dressage mopd check`` with a MOPD objective: what each backend accepts of it.

The config's checkpoints are small real ones (``tiny:seed=N``, Qwen3.5's vocabulary); the
check is the command's own ``main``.
"""

from __future__ import annotations

import json

import pytest

from dressage.launch.preflight import main, objective_problems
from tests.helpers import REPO

pytestmark = pytest.mark.unit

QWEN35_ROWS = 248320


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> str:
    data = {
        "student": {"hf_checkpoint": "tiny:seed=0"},
        "teachers": {"calc": {"load": "tiny:seed=1"}},
        "datasets": [
            {
                "name": "calc",
                "path": str(REPO / "configs/mopd/data/calculator.jsonl"),
                "teacher_id": "calc",
                "weight": 1,
                "agent_mode": "blackbox",
            }
        ],
    }
    path = tmp_path_factory.mktemp("check") / "mopd.json"
    path.write_text(json.dumps(data))
    return str(path)


def _check(config: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    code = main([config, *flags])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_ray_accepts_topk_and_refuses_dense_naming_its_memory(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = _check(config, capsys, "--backend", "ray", "--mopd-objective", "topk")
    assert code == 0, text
    code, text = _check(config, capsys, "--backend", "ray", "--mopd-objective", "dense")
    assert code == 1
    assert "--mopd-objective dense is embedded-only" in text and "about 8 GB a sample" in text


def test_the_embedded_backend_runs_dense(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _check(config, capsys, "--mopd-objective", "dense")
    assert code == 0, text


@pytest.mark.parametrize(
    ("k", "says"),
    [
        ("0", "--mopd-topk 0 is below 1"),
        (str(QWEN35_ROWS + 1), f"--mopd-topk {QWEN35_ROWS + 1} exceeds the student's vocabulary"),
    ],
    ids=["below-one", "beyond-the-vocabulary"],
)
def test_a_bad_k_is_refused_naming_the_flag(
    config: str, capsys: pytest.CaptureFixture[str], k: str, says: str
) -> None:
    code, text = _check(
        config, capsys, "--backend", "ray", "--mopd-objective", "topk", "--mopd-topk", k
    )
    assert code == 1 and says in text


def test_topk_beside_an_option_it_cannot_honour_names_both() -> None:
    (problem,) = objective_problems(
        backend="ray",
        mopd_objective="topk",
        mopd_topk=8,
        extra_args=["--rollout-top-p", "0.9"],
    )
    assert "--mopd-objective topk" in problem.message and "--rollout-top-p 0.9" in problem.message
    assert objective_problems(backend="embedded", mopd_objective="dense") == []


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--mopd-topk", "0"], "--mopd-topk 0 is below 1"),
        (["--mopd-forward-kl-weight", "7"], "--mopd-forward-kl-weight 7.0 is outside [0, 1]"),
        (["--mopd-objective", "sampled", "--mopd-topk", "4"], "needs --mopd-objective topk"),
    ],
    ids=["topk-below-one", "weight-beyond-one", "topk-beside-sampled"],
)
def test_the_objectives_settings_are_checked_against_the_jobs_default_objective(
    config: str, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    """Without --mopd-objective the settings are checked against the objective the launcher
    runs by default (topk), as the launcher checks them."""
    code, text = _check(config, capsys, *flags)
    assert code == 1 and says in text, text
    code, text = _check(config, capsys, "--mopd-topk", "4", "--mopd-forward-kl-weight", "0.5")
    assert code == 0, text


def test_config_falls_back_to_the_variable_and_its_absence_is_one_sentence(
    config: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", config)
    assert main([]) == 0
    assert f"ok: {config}:" in capsys.readouterr().out
    monkeypatch.delenv("DRESSAGE_MOPD_CONFIG")
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("error: no MOPD config given: name CONFIG or set DRESSAGE_MOPD_CONFIG")
