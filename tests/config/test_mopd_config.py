"""The MOPD config fails closed, naming the teacher, dataset or option at fault."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dressage.config.mopd import (
    MOPD_HOOKS,
    OBJECTIVE_SLIME_OPTIONS,
    MopdConfigError,
    load_mopd_config,
    mopd_args_defaults,
    slime_objective_problems,
    slime_options,
    validate_mopd_run,
)
from dressage.tiny.checkpoints import resolve_checkpoint
from tests.helpers import REPO

pytestmark = pytest.mark.unit

EXAMPLE = REPO / "configs/mopd/mopd_alfworld_hotpotqa.example.json"
EMBEDDED = REPO / "configs/mopd/embedded.json"
_modules = itertools.count()


def _config(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "teachers": {"math": {"load": "/ckpt/math"}, "code": {"load": "/ckpt/code"}},
        "datasets": [
            {
                "name": "gsm",
                "path": "gsm.jsonl",
                "teacher_id": "math",
                "weight": 1.0,
                "agent_mode": "blackbox",
            },
            {
                "name": "mbpp",
                "path": "mbpp.jsonl",
                "teacher_id": "code",
                "weight": 2.0,
                "agent_mode": "whitebox",
                "generate_function_path": "pkg.gen.generate",
            },
        ],
    }
    base.update(changes)
    return base


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(data))
    return path


def _load_error(tmp_path: Path, data: dict[str, Any]) -> str:
    with pytest.raises(MopdConfigError) as info:
        load_mopd_config(_write(tmp_path, data))
    return str(info.value)


def _dataset(**changes: Any) -> list[dict[str, Any]]:
    datasets = _config()["datasets"]
    datasets[1].update(changes)
    return datasets


# -- the shipped configs ----------------------------------------------------------------------


def test_example_config_loads_and_validates() -> None:
    config = load_mopd_config(EXAMPLE)
    assert sorted(config.teachers) == ["alfworld", "hotpotqa"]
    assert {d.agent_mode for d in config.datasets} == {"blackbox", "whitebox"}
    report = validate_mopd_run(
        config,
        mopd_args_defaults(),
        check_imports=False,
        check_paths=False,
        environ={"ALFWORLD_DATA": "/data/alfworld", "SEARCH_API_KEY": "k"},
    )
    assert report.ok, report.problems
    assert report.warnings == []


def test_embedded_config_validates_with_imports_and_paths() -> None:
    config = load_mopd_config(EMBEDDED)
    for ds in config.datasets:
        assert Path(ds.path).is_file() and Path(ds.path).is_absolute()
        assert ds.teacher_id in config.teachers
        rows = [json.loads(line) for line in Path(ds.path).read_text().splitlines()]
        assert len(rows) >= 20 and all(r["input"] and r["label"] for r in rows)
    report = validate_mopd_run(config, mopd_args_defaults(), check_imports=True, environ={})
    assert report.ok, report.problems


def test_embedded_config_feeds_the_data_source() -> None:
    from dressage.rollout.dataset_specs import dataset_specs

    specs = dataset_specs(SimpleNamespace(mopd_config=str(EMBEDDED)))
    assert {s.name: s.teacher_id for s in specs} == {"calculator": "calculator", "lookup": "lookup"}


def test_relative_paths_follow_the_config_and_env_placeholders_expand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_ROOT", "/mnt/ckpt")
    data = _config(teachers={"math": {"load": "${CKPT_ROOT}/math"}, "code": {"load": "code"}})
    config = load_mopd_config(_write(tmp_path, data))
    assert config.teachers["math"].load == "/mnt/ckpt/math"
    assert config.teachers["code"].load == str(tmp_path / "code")
    assert config.datasets[0].path == str(tmp_path / "gsm.jsonl")


def test_the_environment_variable_names_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", str(_write(tmp_path, _config())))
    assert sorted(load_mopd_config().teachers) == ["code", "math"]
    monkeypatch.delenv("DRESSAGE_MOPD_CONFIG")
    with pytest.raises(MopdConfigError, match="DRESSAGE_MOPD_CONFIG"):
        load_mopd_config()


def test_tiny_checkpoint_specs_resolve_to_asset_folders() -> None:
    from dressage.tiny import TinyModelSpec, tiny_model_dir

    assert resolve_checkpoint("tiny:seed=1") == tiny_model_dir(TinyModelSpec(seed=1))
    assert resolve_checkpoint("/x/y") == Path("/x/y")
    with pytest.raises(ValueError, match="colour"):
        resolve_checkpoint("tiny:colour=red")


# -- config problems, each naming its culprit -------------------------------------------------


def test_unknown_teacher_names_dataset_and_teacher(tmp_path: Path) -> None:
    message = _load_error(tmp_path, _config(datasets=_dataset(teacher_id="physics")))
    assert "dataset 'mbpp'" in message and "'physics'" in message
    assert "no default teacher" in message


def test_missing_teacher_id_is_refused_there_is_no_default(tmp_path: Path) -> None:
    datasets = _dataset()
    del datasets[1]["teacher_id"]
    message = _load_error(tmp_path, _config(datasets=datasets))
    assert "dataset 'mbpp' teacher_id" in message


@pytest.mark.parametrize("weight", [0, -1.5, float("nan")])
def test_weight_must_be_positive(tmp_path: Path, weight: float) -> None:
    data = json.loads(json.dumps(_config(datasets=_dataset(weight=weight))))
    message = _load_error(tmp_path, data)
    assert "dataset 'mbpp'" in message and "weight must be > 0" in message


def test_whitebox_needs_a_generate_function(tmp_path: Path) -> None:
    message = _load_error(tmp_path, _config(datasets=_dataset(generate_function_path=None)))
    assert "dataset 'mbpp': a whitebox dataset needs generate_function_path" in message


def test_generate_function_must_be_a_dotted_path(tmp_path: Path) -> None:
    data = _config(datasets=_dataset(generate_function_path="gen.py:generate"))
    assert "dataset 'mbpp': generate_function_path 'gen.py:generate'" in _load_error(tmp_path, data)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    datasets = _dataset(teacher_id="nope", weight=0, generate_function_path=None)
    datasets.append(dict(datasets[0]))  # a second dataset named "gsm"
    message = _load_error(tmp_path, _config(datasets=datasets))
    for fragment in ("'nope'", "weight must be > 0", "whitebox", "more than one dataset"):
        assert fragment in message


def test_unknown_fields_and_unset_placeholders_are_refused(tmp_path: Path) -> None:
    data = _config(teachers={"math": {"load": "/a", "lod": "/b"}, "code": {"load": "${NOPE_X}"}})
    message = _load_error(tmp_path, data)
    assert "teacher 'math' lod" in message
    data = _config(teachers={"math": {"load": "/a"}, "code": {"load": "${NOPE_UNSET_VAR}/c"}})
    message = _load_error(tmp_path, data)
    assert "teacher 'code' load" in message and "NOPE_UNSET_VAR" in message


def test_empty_teacher_table_is_refused(tmp_path: Path) -> None:
    message = _load_error(tmp_path, _config(teachers={}))
    assert "teachers: no teacher configured" in message


def test_unused_teacher_is_a_warning(tmp_path: Path) -> None:
    data = _config(teachers={**_config()["teachers"], "spare": {"load": "/ckpt/spare"}})
    report = validate_mopd_run(
        load_mopd_config(_write(tmp_path, data)),
        mopd_args_defaults(),
        check_imports=False,
        check_paths=False,
    )
    assert report.ok
    assert [str(w).split(":")[0] for w in report.warnings] == ["teacher 'spare'"]


# -- options that contradict the objective ----------------------------------------------------

CONTRADICTIONS = [
    ({"n_samples_per_prompt": 4}, "--n-samples-per-prompt"),
    ({"use_kl_loss": True}, "--use-kl-loss"),
    ({"kl_loss_coef": 0.01}, "--kl-loss-coef"),
    ({"kl_coef": 0.1}, "--kl-coef"),
    ({"entropy_coef": 0.001}, "--entropy-coef"),
    ({"rewards_normalization": True}, "--disable-rewards-normalization"),
    ({"normalize_advantages": True}, "--normalize-advantages"),
    ({"loss_type": "policy_loss"}, "--loss-type"),
    ({"custom_loss_function_path": "my.loss"}, "--custom-loss-function-path"),
    ({"custom_advantage_function_path": None}, "--custom-advantage-function-path"),
    ({"data_source_path": "slime.rollout.data_source.X"}, "--data-source-path"),
    ({"use_opd": True}, "--use-opd"),
    ({"advantage_estimator": "ppo"}, "--advantage-estimator"),
    ({"num_steps_per_rollout": 2}, "--num-steps-per-rollout"),
    ({"rollout_batch_size": 32, "global_batch_size": 16}, "--global-batch-size"),
    ({"compute_advantages_and_returns": False}, "--disable-compute-advantages-and-returns"),
    # the proxy records no routed experts: R3 would replay nothing
    ({"use_rollout_routing_replay": True}, "--use-rollout-routing-replay"),
]


@pytest.mark.parametrize(("overrides", "option"), CONTRADICTIONS)
def test_contradicting_option_is_named(
    tmp_path: Path, overrides: dict[str, Any], option: str
) -> None:
    config = load_mopd_config(_write(tmp_path, _config()))
    report = validate_mopd_run(
        config, mopd_args_defaults(**overrides), check_imports=False, check_paths=False
    )
    assert [p.subject for p in report.problems] == [f"option {option}"]
    with pytest.raises(MopdConfigError, match=option):
        report.raise_if_failed()


def test_slime_defaults_are_not_mopd(tmp_path: Path) -> None:
    config = load_mopd_config(_write(tmp_path, _config()))
    report = validate_mopd_run(config, SimpleNamespace(), check_imports=False, check_paths=False)
    subjects = {p.subject for p in report.problems}
    assert {"option --loss-type", "option --disable-rewards-normalization"} <= subjects
    assert all(f"option --{a.replace('_', '-')}" in subjects for a in list(MOPD_HOOKS)[:4])


def test_matching_batch_sizes_are_one_step(tmp_path: Path) -> None:
    config = load_mopd_config(_write(tmp_path, _config()))
    args = mopd_args_defaults(rollout_batch_size=32, global_batch_size=32)
    assert validate_mopd_run(config, args, check_imports=False, check_paths=False).ok


# -- the MOPD objective on slime --------------------------------------------------------------


def test_sampled_and_topk_are_slimes_objectives() -> None:
    assert slime_objective_problems(SimpleNamespace()) == []
    topk = SimpleNamespace(
        mopd_objective="topk",
        mopd_topk=16,
        mopd_forward_kl_weight=0.5,
        allgather_cp=False,
        rollout_top_p=1.0,
    )
    assert slime_objective_problems(topk) == []


OBJECTIVE_REFUSALS = [
    ({"mopd_objective": "dense"}, "--mopd-objective", "V x 4 bytes a token (about 8 GB a sample"),
    ({"mopd_objective": "topk", "mopd_topk": 0}, "--mopd-topk", "--mopd-topk 0 is below 1"),
    ({"mopd_topk": 8}, "--mopd-topk", "--mopd-topk 8 needs --mopd-objective topk"),
    (
        {"mopd_objective": "topk", "mopd_forward_kl_weight": 1.5},
        "--mopd-forward-kl-weight",
        "--mopd-forward-kl-weight 1.5 is outside [0, 1]",
    ),
    (
        {"mopd_forward_kl_weight": 0.5},
        "--mopd-forward-kl-weight",
        "--mopd-forward-kl-weight 0.5 needs --mopd-objective dense or topk",
    ),
    (
        {"mopd_objective": "topk", "allgather_cp": True},
        "--allgather-cp",
        "--mopd-objective topk cannot run with --allgather-cp",
    ),
    (
        {"mopd_objective": "topk", "rollout_top_p": 0.9},
        "--rollout-top-p",
        "--mopd-objective topk cannot run with --rollout-top-p 0.9 (below 1)",
    ),
]


@pytest.mark.parametrize(("values", "flag", "sentence"), OBJECTIVE_REFUSALS)
def test_what_slime_cannot_train_of_the_objective_is_one_sentence_naming_the_flag(
    values: dict[str, Any], flag: str, sentence: str
) -> None:
    (problem,) = slime_objective_problems(SimpleNamespace(**values))
    assert problem.subject == f"option {flag}"
    assert sentence in problem.message and problem.message.count(". ") == 0  # one sentence


def test_the_objective_check_reads_args_as_the_hooks_run_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One reading of slime's args (mopd_args): an args without mopd_objective (slime's parser
    without the MOPD flags) runs sampled in the hooks and is checked as sampled; mopd_train's
    parser always sets it, to the project's default (topk)."""
    import argparse

    import dressage.config.mopd as mopd_module
    from dressage.config.run import DEFAULT_MOPD_OBJECTIVE
    from dressage.slime.mopd_args import mopd_args
    from dressage.training.mopd_dense import mopd_objective
    from dressage.training.mopd_train import add_mopd_arguments

    read: list[object] = []
    monkeypatch.setattr(mopd_module, "mopd_args", lambda args: read.append(args) or mopd_args(args))
    plain = SimpleNamespace(mopd_topk=4)
    (problem,) = slime_objective_problems(plain)
    assert read == [plain]  # read through the typed view, not attribute by attribute
    assert "needs --mopd-objective topk (got 'sampled')" in problem.message
    assert mopd_objective(argparse.Namespace(**vars(plain))) == "sampled"  # what runs
    ours = add_mopd_arguments(argparse.ArgumentParser()).parse_args(["--mopd-topk", "4"])
    assert ours.mopd_objective == DEFAULT_MOPD_OBJECTIVE == "topk"
    assert slime_objective_problems(ours) == []


def test_dense_on_slime_names_its_memory_and_points_to_topk() -> None:
    (problem,) = slime_objective_problems(SimpleNamespace(mopd_objective="dense"))
    assert "embedded-only" in problem.message and "full log-softmax" in problem.message
    assert "248,320-entry vocabulary" in problem.message
    assert "use --mopd-objective topk" in problem.message


def test_top_p_and_allgather_cp_stop_only_topk() -> None:
    others = {"allgather_cp": True, "rollout_top_p": 0.9}
    assert slime_objective_problems(SimpleNamespace(mopd_objective="sampled", **others)) == []


def test_slime_options_reads_flags_as_slimes_parser_would() -> None:
    argv = ["--lr", "1e-6", "--rollout-top-p", "0.9", "--allgather-cp", "--rollout-top-p=0.8"]
    assert slime_options(argv, OBJECTIVE_SLIME_OPTIONS) == {
        "allgather_cp": True,
        "rollout_top_p": 0.8,  # the last of a repeated flag, as in argparse
    }
    assert slime_options(["--num-layers", "2"], OBJECTIVE_SLIME_OPTIONS) == {}


# -- imports, paths and the forwarded environment ---------------------------------------------


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    name = f"mopd_cfg_fixture_{next(_modules)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_imports_are_checked_and_errors_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = _module(
        tmp_path, monkeypatch, "async def generate(args, sample, sp):\n    return sample\n"
    )
    plain = _module(tmp_path, monkeypatch, "def generate(args, sample, sp):\n    return sample\n")
    broken = _module(tmp_path, monkeypatch, "raise RuntimeError('reward table missing')\n")
    datasets = _config()["datasets"]
    datasets[1]["generate_function_path"] = f"{good}.generate"
    datasets.append({**datasets[1], "name": "plain", "generate_function_path": f"{plain}.generate"})
    datasets.append({**datasets[1], "name": "gone", "generate_function_path": f"{good}.nothing"})
    data = _config(datasets=datasets, reward_modules=[good, broken, "no_such_mod_xyz"])
    report = validate_mopd_run(
        load_mopd_config(_write(tmp_path, data)),
        mopd_args_defaults(**{attr: f"{good}.generate" for attr in MOPD_HOOKS}),
        check_paths=False,
    )
    text = "\n".join(map(str, report.problems))
    assert f"dataset 'plain': {plain}.generate must be an async function" in text
    assert f"dataset 'gone': cannot import {good}.nothing" in text
    assert f"reward module '{broken}': RuntimeError: reward table missing" in text
    assert "reward module 'no_such_mod_xyz': ModuleNotFoundError" in text
    assert "dataset 'mbpp'" not in text


def test_missing_dataset_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "gsm.jsonl").write_text('{"input": "1+1", "label": "2"}\n')
    config = load_mopd_config(_write(tmp_path, _config()))
    report = validate_mopd_run(config, mopd_args_defaults(), check_imports=False)
    assert [str(p) for p in report.problems] == [
        f"dataset 'mbpp': path {tmp_path / 'mbpp.jsonl'} does not exist"
    ]


def test_eval_path_is_resolved_and_a_missing_one_is_named(tmp_path: Path) -> None:
    data = _config()
    data["datasets"][0]["eval_path"] = "gsm.eval.jsonl"
    for name in ("gsm.jsonl", "mbpp.jsonl"):
        (tmp_path / name).write_text('{"input": "1+1", "label": "2"}\n')
    config = load_mopd_config(_write(tmp_path, data))
    assert config.datasets[0].eval_path == str(tmp_path / "gsm.eval.jsonl")
    report = validate_mopd_run(config, mopd_args_defaults(), check_imports=False)
    assert [str(p) for p in report.problems] == [
        f"dataset 'gsm': eval_path {tmp_path / 'gsm.eval.jsonl'} does not exist"
    ]


def test_runtime_env_keys_must_be_present(tmp_path: Path) -> None:
    config = load_mopd_config(_write(tmp_path, _config(runtime_env_keys=["SEARCH_KEY", "HOME_X"])))
    kwargs: dict[str, Any] = {"check_imports": False, "check_paths": False}
    report = validate_mopd_run(config, mopd_args_defaults(), environ={"HOME_X": "1"}, **kwargs)
    assert [p.subject for p in report.problems] == ["runtime_env_keys 'SEARCH_KEY'"]
    full = {"HOME_X": "1", "SEARCH_KEY": "s"}
    assert validate_mopd_run(config, mopd_args_defaults(), environ=full, **kwargs).ok


@pytest.mark.usefixtures("embedded_checkpoints")
def test_dressage_mopd_check_checks_configs(capsys: pytest.CaptureFixture[str]) -> None:
    from dressage.cli import main

    assert main(["mopd", "check", str(EMBEDDED)]) == 0
    assert f"ok: {EMBEDDED}: 2 teacher(s), 2 dataset(s)" in capsys.readouterr().out
    assert main(["mopd", "check", str(EMBEDDED), str(EXAMPLE)]) == 1  # one of two fails
    out, err = capsys.readouterr()
    assert f"ok: {EMBEDDED}" in out and str(EXAMPLE) not in out
    # its data files, user modules and checkpoints do not exist here
    assert "dataset 'alfworld_train': path /mnt/data/mopd/alfworld_train.jsonl" in err
    assert "runtime_env_keys 'SEARCH_API_KEY'" in err
    assert main(["mopd", "check", str(EXAMPLE), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["config"] == str(EXAMPLE)


def test_dressage_mopd_check_errors_go_through_argparse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dressage.cli import main

    with pytest.raises(SystemExit) as info:
        main(["mopd", "check"])
    assert info.value.code == 2 and "CONFIG" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["mopd", "check", "--help"])
    assert info.value.code == 0 and "dressage mopd check" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "the file is empty; a MOPD config is a JSON object with teachers and datasets"),
        ('{"teachers": ', "is not valid JSON: expecting value at line 1, column 14"),
        ("[1, 2]", "must hold a JSON object with teachers and datasets, got a list"),
        (
            '{"teacher": {}, "datasets": []}',
            "teacher: is not a known key (did you mean 'teachers'?)",
        ),
        (
            '{"teachers": {"t": {"laod": "x"}}, "datasets": []}',
            "teacher 't' laod: is not a known key (did you mean 'load'?)",
        ),
    ],
)
def test_a_bad_file_is_one_sentence(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "mopd.json"
    path.write_text(text)
    with pytest.raises(MopdConfigError) as info:
        load_mopd_config(path)
    message = str(info.value)
    assert said in message
    for leak in ("MopdConfig", "Extra inputs", "pydantic", "Expecting value", "unreadable"):
        assert leak not in message


def test_an_infinite_weight_is_named_as_not_finite(tmp_path: Path) -> None:
    data = json.loads((REPO / "configs/mopd/embedded.json").read_text())
    data["datasets"][0]["weight"] = float("inf")
    for ds in data["datasets"]:
        ds["path"] = str(REPO / "configs/mopd" / ds["path"])
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MopdConfigError, match="weight must be > 0 and finite, got inf"):
        load_mopd_config(path)


def test_a_config_is_validated_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reader of one run's config (the job, the data source, the rewards, the actor's
    teachers) gets the one typed config the first read validated; a changed file, or a changed
    environment that its ``${VAR}`` placeholders read, is validated again."""
    import dressage.config.mopd as mopd

    parsed: list[Path] = []
    original = mopd._read_json
    monkeypatch.setattr(mopd, "_read_json", lambda p: parsed.append(p) or original(p))
    monkeypatch.setenv("CKPT_ROOT", "/mnt/a")
    data = _config(teachers={"math": {"load": "${CKPT_ROOT}/math"}, "code": {"load": "code"}})
    path = _write(tmp_path, data)
    first = load_mopd_config(path)
    assert load_mopd_config(str(path)) is first and len(parsed) == 1
    monkeypatch.setenv("CKPT_ROOT", "/mnt/b")
    assert load_mopd_config(path).teachers["math"].load == "/mnt/b/math" and len(parsed) == 2
    data["reward_modules"] = ["dressage.reward.builtin"]
    _write(tmp_path, data)
    assert load_mopd_config(path).reward_modules == ["dressage.reward.builtin"]
    assert len(parsed) == 3
