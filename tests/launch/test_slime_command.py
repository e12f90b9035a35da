"""The MOPD command builder, its CLI and the shell launcher that wraps it."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dressage.config.mopd import (
    MOPD_HOOKS,
    MopdConfigError,
    load_mopd_config,
)
from dressage.config.run import MopdRunConfig, MopdRunSettings
from dressage.launch.slime_command import (
    build_mopd_command,
    build_mopd_job,
    main,
    submit_argv,
    write_job_files,
)
from dressage.tiny.checkpoints import resolve_checkpoint
from tests.helpers import REPO

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("embedded_checkpoints")]

EMBEDDED = str(REPO / "configs/mopd/embedded.json")
LAUNCHER = REPO / "scripts/run_mopd_qwen3.5_sync.sh"


def _run(tmp_path: Path, **changes: Any) -> MopdRunConfig:
    values: dict[str, Any] = {
        "mopd_config": EMBEDDED,
        "output_dir": str(tmp_path / "run"),
        "check_imports": False,
    }
    values.update(changes)
    return MopdRunConfig.model_validate(values)


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, flag
    return argv[argv.index(flag) + 1]


def _problems(tmp_path: Path, environ: dict[str, str] | None = None, **changes: Any) -> str:
    with pytest.raises(MopdConfigError) as info:
        build_mopd_job(_run(tmp_path, **changes), environ=environ or {})
    return str(info.value)


def test_the_command_carries_every_mopd_flag(tmp_path: Path) -> None:
    run = _run(
        tmp_path, tp_size=4, cp_size=2, rollout_batch_size=16, seed=7, rollout_seed=9, num_rollout=3
    )
    argv = build_mopd_command(run, environ={})
    assert argv[:3] == ["python3", "-m", "dressage.training.mopd_train"]
    out = tmp_path / "run"
    expected = {
        "--mopd-config": str(out / "mopd_config.resolved.json"),
        "--mopd-metrics-dir": str(out / "metrics"),
        "--hf-checkpoint": _checkpoint("student"),
        "--tensor-model-parallel-size": "4",
        "--context-parallel-size": "2",
        "--rollout-batch-size": "16",
        "--n-samples-per-prompt": "1",
        "--global-batch-size": "16",
        "--num-rollout": "3",
        "--seed": "7",
        "--rollout-seed": "9",
        "--loss-type": "custom_loss",
        "--custom-rollout-log-function-path": "dressage.training.metrics_sink.log_rollout_metrics",
        "--save": str(out / "checkpoints"),
    }
    for flag, value in expected.items():
        assert _value(argv, flag) == value
    for attr, path in MOPD_HOOKS.items():
        assert _value(argv, "--" + attr.replace("_", "-")) == path
    assert "--disable-rewards-normalization" in argv and "--colocate" in argv
    assert not [a for a in argv if "wandb" in a]
    assert "--ref-load" not in argv  # the embedded student is an HF folder only


def test_the_objective_and_its_settings_reach_the_driver(tmp_path: Path) -> None:
    argv = build_mopd_command(_run(tmp_path), environ={})
    assert _value(argv, "--mopd-objective") == "topk"  # the default
    assert "--mopd-topk" not in argv and "--mopd-forward-kl-weight" not in argv
    run = _run(tmp_path, mopd_objective="topk", mopd_topk=8, mopd_forward_kl_weight=0.25)
    argv = build_mopd_command(run, environ={})
    assert _value(argv, "--mopd-objective") == "topk"
    assert _value(argv, "--mopd-topk") == "8"
    assert _value(argv, "--mopd-forward-kl-weight") == "0.25"
    argv = build_mopd_command(_run(tmp_path, mopd_objective="topk"), environ={})
    assert "--mopd-topk" not in argv  # the driver's default K


def test_wandb_flags_only_when_enabled_and_the_key_stays_off_argv(tmp_path: Path) -> None:
    env = {"WANDB_API_KEY": "wb-secret-123"}
    run = _run(tmp_path, use_wandb=True, wandb_project="proj", wandb_group="grp")
    job = build_mopd_job(run, environ=env)
    start = job.argv.index("--use-wandb")
    assert job.argv[start : start + 5] == [
        "--use-wandb",
        "--wandb-project",
        "proj",
        "--wandb-group",
        "grp",
    ]
    assert len([a for a in job.argv if a.startswith("--wandb")]) == 2
    assert "wb-secret-123" not in job.entrypoint and "wb-secret-123" not in repr(job)
    assert job.runtime_env["env_vars"]["WANDB_API_KEY"] == "wb-secret-123"
    assert "WANDB_API_KEY" in _problems(tmp_path, use_wandb=True, wandb_project="p")


def test_job_identity_and_files(tmp_path: Path) -> None:
    job = build_mopd_job(_run(tmp_path), environ={})
    assert job.submission_id == build_mopd_job(_run(tmp_path), environ={}).submission_id
    assert job.submission_id != build_mopd_job(_run(tmp_path, seed=5), environ={}).submission_id
    assert job.entrypoint == shlex.join(job.argv)
    write_job_files(job)
    mode = stat.S_IMODE(os.stat(job.runtime_env_file).st_mode)
    assert mode == 0o600
    resolved_path = str(job.resolved_config)  # both spellings, for an older dressage on a worker
    assert json.loads(job.runtime_env_file.read_text()) == {
        "env_vars": {
            "DRESSAGE_MOPD_CONFIG": resolved_path,
            "DRESSAGE_MOPD_TEACHER_CONFIG": resolved_path,
        }
    }
    resolved = load_mopd_config(job.resolved_config)
    assert resolved.teachers["calculator"].load == _checkpoint("calculator")
    assert job.metrics_dir.is_dir()
    submit = submit_argv(job, "http://head:8265")
    assert submit[:3] == ["ray", "job", "submit"]
    assert submit[submit.index("--runtime-env") + 1] == str(job.runtime_env_file)
    assert submit[submit.index("--") + 1 :] == job.argv


def _checkpoint(name: str) -> str:
    """The folder the shipped embedded config's spec for the student or a teacher builds."""
    config = load_mopd_config(EMBEDDED)
    assert config.student is not None
    spec = config.student.hf_checkpoint if name == "student" else config.teachers[name].load
    assert spec.startswith(("tiny:", "tiny-sft:")), spec
    return str(resolve_checkpoint(spec))


# -- fail closed ------------------------------------------------------------------------------


def test_more_than_one_sample_per_prompt_is_refused(tmp_path: Path) -> None:
    message = _problems(tmp_path, n_samples_per_prompt=8)
    assert "option --n-samples-per-prompt: MOPD takes one sample per prompt" in message


def test_more_than_one_step_per_rollout_is_refused(tmp_path: Path) -> None:
    message = _problems(tmp_path, rollout_batch_size=32, global_batch_size=8)
    assert "option --global-batch-size: 8 != rollout_batch_size" in message


def test_missing_checkpoints_are_named(tmp_path: Path) -> None:
    message = _problems(tmp_path, hf_checkpoint=str(tmp_path / "student"))
    assert f"student hf_checkpoint: {tmp_path / 'student'} does not exist" in message
    config = json.loads(Path(EMBEDDED).read_text())
    config["teachers"]["lookup"]["load"] = str(tmp_path / "gone")
    for ds in config["datasets"]:
        ds["path"] = str(REPO / "configs/mopd" / ds["path"])
        ds["eval_path"] = str(REPO / "configs/mopd" / ds["eval_path"])
    (tmp_path / "mopd.json").write_text(json.dumps(config))
    message = _problems(tmp_path, mopd_config=str(tmp_path / "mopd.json"))
    assert f"teacher 'lookup': {tmp_path / 'gone'} does not exist" in message


def test_mismatched_teacher_vocabulary_is_named(tmp_path: Path) -> None:
    config = json.loads(Path(EMBEDDED).read_text())
    config["teachers"]["lookup"]["load"] = "tiny:vocab=qwen3"
    for ds in config["datasets"]:
        ds["path"] = str(REPO / "configs/mopd" / ds["path"])
        ds["eval_path"] = str(REPO / "configs/mopd" / ds["eval_path"])
    (tmp_path / "mopd.json").write_text(json.dumps(config))
    message = _problems(tmp_path, mopd_config=str(tmp_path / "mopd.json"))
    assert "teacher 'lookup': tokenizer differs from the student's" in message


def test_extra_args_may_not_override_or_contradict_or_carry_secrets(tmp_path: Path) -> None:
    extra = ["--n-samples-per-prompt", "1", "--use-kl-loss", "--entropy-coef", "0.01"]
    extra += ["--wandb-key", "abc", "--lr", "1e-6"]
    message = _problems(tmp_path, extra_args=extra)
    assert "option --n-samples-per-prompt: set by the launcher; give --n-samples-per" in message
    assert "option --use-kl-loss:" in message
    assert "option --entropy-coef:" in message
    assert "option --wandb-key: credentials never go on the command line" in message
    assert "--lr" not in message


def test_dense_is_refused_naming_its_memory_and_topk(tmp_path: Path) -> None:
    message = _problems(tmp_path, mopd_objective="dense")
    assert "option --mopd-objective: --mopd-objective dense is embedded-only" in message
    assert "V x 4 bytes a token (about 8 GB a sample of 8k tokens" in message
    assert "use --mopd-objective topk" in message


def test_a_topk_below_one_is_refused_naming_the_flag(tmp_path: Path) -> None:
    message = _problems(tmp_path, mopd_objective="topk", mopd_topk=0)
    assert "option --mopd-topk: --mopd-topk 0 is below 1" in message


def test_a_topk_beyond_the_students_vocabulary_is_refused_naming_the_flag(tmp_path: Path) -> None:
    config = json.loads((Path(_checkpoint("student")) / "config.json").read_text())
    size = config.get("text_config", config)["vocab_size"]
    build_mopd_job(_run(tmp_path, mopd_objective="topk", mopd_topk=size), environ={})
    message = _problems(tmp_path, mopd_objective="topk", mopd_topk=size + 1)
    assert (
        f"option --mopd-topk: --mopd-topk {size + 1} exceeds the student's vocabulary of {size} "
        "tokens"
    ) in message


def test_topk_is_refused_beside_allgather_cp_and_a_rollout_top_p_below_one(
    tmp_path: Path,
) -> None:
    extra = ["--allgather-cp", "--rollout-top-p", "0.95"]
    message = _problems(tmp_path, mopd_objective="topk", extra_args=extra)
    assert "option --allgather-cp: --mopd-objective topk cannot run with --allgather-cp" in message
    assert (
        "option --rollout-top-p: --mopd-objective topk cannot run with --rollout-top-p 0.95"
    ) in message
    sampled = _run(tmp_path, mopd_objective="sampled", extra_args=extra)
    build_mopd_job(sampled, environ={})  # sampled runs with both


def test_the_objective_flags_come_from_the_run_config_not_extra_args(tmp_path: Path) -> None:
    message = _problems(tmp_path, extra_args=["--mopd-topk", "4", "--mopd-objective", "topk"])
    assert "option --mopd-topk: set by the launcher; give --mopd-topk before --" in message
    assert "option --mopd-objective: set by the launcher; give --mopd-objective" in message
    message = _problems(tmp_path, mopd_objective="sampled", mopd_topk=4)
    assert "option --mopd-topk: --mopd-topk 4 needs --mopd-objective topk" in message


def test_runtime_env_keys_are_forwarded_not_printed(tmp_path: Path) -> None:
    config = json.loads(Path(EMBEDDED).read_text())
    config["runtime_env_keys"] = ["SEARCH_API_KEY"]
    for ds in config["datasets"]:
        ds["path"] = str(REPO / "configs/mopd" / ds["path"])
        ds["eval_path"] = str(REPO / "configs/mopd" / ds["eval_path"])
    (tmp_path / "mopd.json").write_text(json.dumps(config))
    run = _run(tmp_path, mopd_config=str(tmp_path / "mopd.json"))
    assert "runtime_env_keys 'SEARCH_API_KEY'" in _problems(
        tmp_path, mopd_config=str(tmp_path / "mopd.json")
    )
    job = build_mopd_job(run, environ={"SEARCH_API_KEY": "s3cr3t"})
    assert job.env["SEARCH_API_KEY"] == "s3cr3t" and "s3cr3t" not in job.entrypoint


# -- run settings from the environment, the CLI and the shell launcher ------------------------


def test_run_config_from_launcher_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "DRESSAGE_MOPD_CONFIG": EMBEDDED,
        "OUTPUT_DIR": str(tmp_path),
        "TP_SIZE": "8",
        "CP_SIZE": "2",
        "ROLLOUT_BATCH_SIZE": "64",
        "N_SAMPLES_PER_PROMPT": "1",
        "GLOBAL_BATCH_SIZE": "64",
        "USE_WANDB": "1",
        "WANDB_PROJECT": "p",
        "SEED": "3",
        "ROLLOUT_SEED": "4",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NUM_GPUS", "")  # empty: unset, the field's default
    run = MopdRunSettings.layered({"tp_size": 2}, given_as={"tp_size": "--tp-size"})
    assert (
        run.actor_num_gpus_per_node == MopdRunConfig.model_fields["actor_num_gpus_per_node"].default
    )
    assert (run.tp_size, run.cp_size, run.rollout_batch_size, run.global_batch_size) == (
        2,
        2,
        64,
        64,
    )
    assert (run.use_wandb, run.wandb_project, run.seed, run.rollout_seed) == (True, "p", 3, 4)


def _command(printed: str) -> list[str]:
    """The printed command's words (it is printed one flag a line, each ending in a backslash)."""
    return shlex.split(printed.replace("\\\n", " "))


def test_cli_dry_run_prints_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DRESSAGE_MOPD_CONFIG", raising=False)
    argv = ["--mopd-config", EMBEDDED, "--output-dir", str(tmp_path), "--no-check-imports"]
    assert main([*argv, "--seed", "11", "--dry-run", "--", "--lr", "2e-6"]) == 0
    printed = _command(capsys.readouterr().out)
    assert _value(printed, "--seed") == "11" and printed[-2:] == ["--lr", "2e-6"]
    assert not (tmp_path / "runtime_env.json").exists()  # a dry run writes no secrets
    resolved = _value(printed, "--mopd-config")  # but the config its command reads
    assert resolved == str(tmp_path / "mopd_config.resolved.json") and Path(resolved).is_file()
    assert main([*argv, "--n-samples-per-prompt", "2"]) == 1
    assert "--n-samples-per-prompt" in capsys.readouterr().err
    topk = ["--mopd-objective", "topk", "--mopd-topk", "4", "--mopd-forward-kl-weight", "0.5"]
    assert main([*argv, *topk, "--dry-run"]) == 0
    printed = _command(capsys.readouterr().out)
    assert _value(printed, "--mopd-topk") == "4"
    assert _value(printed, "--mopd-forward-kl-weight") == "0.5"
    assert main([*argv, "--mopd-objective", "topk", "--mopd-topk", "0"]) == 1
    assert "option --mopd-topk: --mopd-topk 0 is below 1" in capsys.readouterr().err


def _launcher(tmp_path: Path, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "HF_HUB_OFFLINE": "1",
        "DRY_RUN": "1",
        "CHECK_IMPORTS": "0",
        "DRESSAGE_MOPD_CONFIG": EMBEDDED,
        "OUTPUT_DIR": str(tmp_path / "run"),
    }
    if "DRESSAGE_CACHE_DIR" in os.environ:
        base["DRESSAGE_CACHE_DIR"] = os.environ["DRESSAGE_CACHE_DIR"]
    return subprocess.run(
        ["bash", str(LAUNCHER), *flags, "--", "--lr", "1e-6"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_shell_launcher_dry_run_uses_the_builder(tmp_path: Path) -> None:
    result = _launcher(
        tmp_path,
        TP_SIZE="4",
        CP_SIZE="2",
        ROLLOUT_BATCH_SIZE="8",
        SEED="21",
        ROLLOUT_SEED="22",
        USE_WANDB="1",
        WANDB_PROJECT="proj",
        WANDB_GROUP="grp",
        WANDB_API_KEY="wb-secret-xyz",
        MODEL_ARGS="--num-layers 2 --hidden-size 64",
    )
    assert result.returncode == 0, result.stderr
    argv = _command(result.stdout)
    assert argv[:3] == ["python3", "-m", "dressage.training.mopd_train"]
    for flag, value in {
        "--tensor-model-parallel-size": "4",
        "--context-parallel-size": "2",
        "--rollout-batch-size": "8",
        "--global-batch-size": "8",
        "--n-samples-per-prompt": "1",
        "--seed": "21",
        "--rollout-seed": "22",
        "--wandb-project": "proj",
        "--wandb-group": "grp",
    }.items():
        assert _value(argv, flag) == value
    assert argv[-6:] == ["--num-layers", "2", "--hidden-size", "64", "--lr", "1e-6"]
    assert "wb-secret-xyz" not in result.stdout + result.stderr
    assert "WANDB_API_KEY" in result.stderr  # named as forwarded, value hidden


def test_shell_launcher_layers_as_the_launcher_does(tmp_path: Path) -> None:
    """The script has no defaults of its own: the launcher's, under the variables, under the
    launcher's flags (given before --)."""
    defaults = MopdRunConfig.model_fields
    argv = _command(_launcher(tmp_path).stdout)
    assert _value(argv, "--tensor-model-parallel-size") == str(defaults["tp_size"].default)
    assert _value(argv, "--num-rollout") == str(defaults["num_rollout"].default)
    assert _value(argv, "--rollout-batch-size") == str(defaults["rollout_batch_size"].default)
    assert "--max-tokens-per-gpu" not in argv and "--use-wandb" not in argv
    result = _launcher(tmp_path, "--num-rollout", "7", "--tp-size", "2", NUM_ROLLOUT="5")
    assert result.returncode == 0, result.stderr
    argv = _command(result.stdout)
    assert (
        _value(argv, "--num-rollout") == "7" and _value(argv, "--tensor-model-parallel-size") == "2"
    )
    assert argv[-2:] == ["--lr", "1e-6"]
    import re

    body = LAUNCHER.read_text().split("set -euo pipefail", 1)[1]
    defaulted = set(re.findall(r"\$\{(\w+):-", body))  # ${NAME:-default}: the script's own
    assert defaulted == {"PYTHON", "CHECK_IMPORTS", "DRY_RUN", "LAUNCH", "MODEL_ARGS", "1"}
    assert not defaulted & set(MopdRunSettings.ENV.values())


def test_shell_launcher_refuses_several_samples_per_prompt(tmp_path: Path) -> None:
    result = _launcher(tmp_path, N_SAMPLES_PER_PROMPT="4")
    assert result.returncode == 1 and result.stdout == ""
    assert "option --n-samples-per-prompt: MOPD takes one sample per prompt" in result.stderr


def _recorder(tmp_path: Path, name: str) -> Path:
    """An executable that writes its argv and two variables to <name>.out."""
    script = tmp_path / "bin" / name
    script.parent.mkdir(exist_ok=True)
    out = tmp_path / f"{name}.out"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$@" > {out}\n'
        f'echo "CONFIG=$DRESSAGE_MOPD_CONFIG SECRET=${{SEARCH_API_KEY:-}}" >> {out}\n'
    )
    script.chmod(0o755)
    return out


def test_cli_submit_hands_ray_a_runtime_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _recorder(tmp_path, "ray")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("WANDB_API_KEY", "wb-secret-777")
    monkeypatch.delenv("DRESSAGE_MOPD_CONFIG", raising=False)
    run_dir = tmp_path / "run"
    argv = ["--mopd-config", EMBEDDED, "--output-dir", str(run_dir), "--no-check-imports"]
    argv += ["--use-wandb", "--wandb-project", "p", "--submit", "--address", "http://head:8265"]
    assert main(argv) == 0
    recorded = out.read_text().splitlines()
    assert recorded[:4] == ["job", "submit", "--address", "http://head:8265"]
    assert recorded[recorded.index("--runtime-env") + 1] == str(run_dir / "runtime_env.json")
    assert "wb-secret-777" not in out.read_text()
    env_vars = json.loads((run_dir / "runtime_env.json").read_text())["env_vars"]
    assert env_vars["WANDB_API_KEY"] == "wb-secret-777"
    assert load_mopd_config(run_dir / "mopd_config.resolved.json").teachers.keys() == {
        "calculator",
        "lookup",
    }


def test_cli_exec_runs_the_command_with_the_forwarded_environment(tmp_path: Path) -> None:
    out = _recorder(tmp_path, "fakepython")
    config = json.loads(Path(EMBEDDED).read_text())
    config["runtime_env_keys"] = ["SEARCH_API_KEY"]
    for ds in config["datasets"]:
        ds["path"] = str(REPO / "configs/mopd" / ds["path"])
        ds["eval_path"] = str(REPO / "configs/mopd" / ds["eval_path"])
    (tmp_path / "mopd.json").write_text(json.dumps(config))
    cmd = ["-m", "dressage.launch.slime_command", "--mopd-config", str(tmp_path / "mopd.json")]
    cmd += ["--output-dir", str(tmp_path / "run"), "--no-check-imports", "--exec"]
    cmd += ["--python", str(tmp_path / "bin" / "fakepython")]
    env = {k: v for k, v in os.environ.items() if k != "DRESSAGE_MOPD_CONFIG"}
    env["SEARCH_API_KEY"] = "s-42"
    result = subprocess.run(
        [sys.executable, *cmd], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    recorded = out.read_text().splitlines()
    assert recorded[:2] == ["-m", "dressage.training.mopd_train"]
    resolved = tmp_path / "run" / "mopd_config.resolved.json"
    assert recorded[-1] == f"CONFIG={resolved} SECRET=s-42"
    assert "s-42" not in " ".join(recorded[:-1])


def test_the_printed_command_is_one_flag_a_line_and_runs_as_a_shell_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--mopd-config", EMBEDDED, "--output-dir", str(tmp_path), "--no-check-imports"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0] == "python3 -m dressage.training.mopd_train \\"
    assert all(line.startswith("    --") for line in lines[1:])
    assert max(len(line) for line in lines) < 120
    echoed = subprocess.run(  # the shell reads it as one command with these words
        ["bash", "-c", 'printf "%s\\n" ' + out.split(" ", 1)[1]],
        capture_output=True,
        text=True,
        check=True,
    )
    assert echoed.stdout.splitlines() == _command(out)[1:]


def test_slimes_own_spellings_of_the_layout_are_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--mopd-config", EMBEDDED, "--output-dir", str(tmp_path), "--no-check-imports"]
    slime = ["--tensor-model-parallel-size", "4", "--context-parallel-size", "2"]
    assert main([*argv, *slime, "--dry-run"]) == 0
    printed = _command(capsys.readouterr().out)
    assert _value(printed, "--tensor-model-parallel-size") == "4"
    assert _value(printed, "--context-parallel-size") == "2"


@pytest.mark.parametrize(
    ("slime", "said"),
    [
        ("--tensor-model-parallel-size", "give --tp-size before -- (the run config's tp_size)"),
        ("--pipeline-model-parallel-size", "give --pp-size before -- (the run config's pp_size)"),
        ("--mopd-metrics-dir", "give --output-dir before -- (the run config's output_dir)"),
        ("--use-dynamic-batch-size", "give --max-tokens-per-gpu before --"),
        ("--num-rollout", "give --num-rollout before -- (the run config's num_rollout)"),
        ("--loss-type", "set by the launcher to what MOPD needs; it cannot be changed"),
    ],
)
def test_a_flag_the_launcher_sets_after_dash_dash_names_the_flag_to_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slime: str, said: str
) -> None:
    argv = ["--mopd-config", EMBEDDED, "--output-dir", str(tmp_path), "--no-check-imports"]
    argv += ["--max-tokens-per-gpu", "4096"]  # the launcher then sets --use-dynamic-batch-size
    assert main([*argv, "--dry-run", "--", slime, "2"]) == 1
    assert f"option {slime}: {said}" in capsys.readouterr().err.replace("set by the launcher; ", "")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--tp-sise", "2"], "unrecognized option --tp-sise (did you mean '--tp-size'?)"),
        (["--rollout-batch-size", "0"], "--rollout-batch-size should be greater than or equal"),
        (["--seed", "x"], "--seed should be a valid integer"),
    ],
)
def test_a_bad_flag_is_one_sentence_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], said: str
) -> None:
    argv = ["--mopd-config", EMBEDDED, "--output-dir", str(tmp_path), *extra]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert said in err
    assert "pydantic" not in err and "validation error" not in err and "type=" not in err


def test_the_required_flags_are_shown_required(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DRESSAGE_MOPD_CONFIG", raising=False)
    monkeypatch.delenv("OUTPUT_DIR", raising=False)
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: --mopd-config, --output-dir" in err
    assert "[--mopd-config" not in err  # the usage line does not show them as optional


def test_a_fresh_clone_is_told_to_build_the_tiny_checkpoints_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A teacher never built (as on a fresh clone): one problem, naming the command."""
    config = json.loads(Path(EMBEDDED).read_text())
    config["teachers"]["lookup"]["load"] = UNBUILT_TEACHER
    path = tmp_path / "mopd.json"
    for ds in config["datasets"]:
        ds["path"] = str(REPO / "configs/mopd" / ds["path"])
        ds["eval_path"] = str(REPO / "configs/mopd" / ds["eval_path"])
    path.write_text(json.dumps(config))
    argv = ["--mopd-config", str(path), "--output-dir", str(tmp_path / "out"), "--dry-run"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"run `dressage assets --config {path}` first" in err
    assert err.count("not built yet") == 1
    assert not (tmp_path / "out").exists()


UNBUILT_TEACHER = "tiny-sft:task=lookup,base=generalist,steps=7,batch_size=3,examples=977"


def test_the_cluster_dry_run_from_an_empty_cache_says_to_build_the_assets(tmp_path: Path) -> None:
    """The README's dry run on a machine that never ran `dressage assets`: exit 1, one sentence
    naming the command that builds what is missing, and nothing written."""
    env = {k: v for k, v in os.environ.items() if k not in ("DRESSAGE_MOPD_CONFIG",)}
    env["DRESSAGE_CACHE_DIR"] = str(tmp_path / "cache")  # empty: nothing built yet
    out = tmp_path / "out"
    argv = ["--mopd-config", "configs/mopd/embedded.json", "--output-dir", str(out), "--dry-run"]
    done = subprocess.run(
        [sys.executable, "-m", "dressage.launch.slime_command", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "run `dressage assets --config configs/mopd/embedded.json` first" in done.stderr
    assert done.stdout == "" and not out.exists()


def test_the_readme_builds_the_assets_before_the_cluster_dry_run() -> None:
    from tests.helpers import bash_commands

    commands = bash_commands(REPO / "README.md")
    assets = commands.index(".venv/bin/dressage assets --config configs/mopd/embedded.json")
    launch = next(
        i
        for i, command in enumerate(commands)
        if command.startswith(".venv/bin/dressage mopd launch --mopd-config configs/mopd/embedded")
        and command.endswith("--dry-run")
    )
    assert assets < launch


def test_every_flags_help_is_plain_text_and_shows_its_default() -> None:
    """The help is read in a terminal: no Sphinx roles or literals; a None default that stands
    for a value (--mopd-topk's K) shows that value."""
    import re

    from dressage.config.run import DEFAULT_MOPD_TOPK
    from dressage.launch.slime_command import _parser

    helps = {a.option_strings[0]: a.help or "" for a in _parser({})._actions}
    assert len(helps) > 30
    for flag, text in helps.items():
        assert "`" not in text and not re.search(r":[a-z]+:", text), (flag, text)
    assert helps["--mopd-topk"].endswith(f"(default: {DEFAULT_MOPD_TOPK})")
    assert "None" not in helps["--mopd-topk"] and "DEFAULT_MOPD_TOPK" not in helps["--mopd-topk"]
    assert helps["--mopd-objective"].endswith("(default: topk)")


def test_a_config_that_does_not_load_still_has_its_checkpoints_checked_as_mopd_check_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelled dataset key does not hide an unbuilt teacher: the launcher lists both, as
    `dressage mopd check` does, and exits as it does."""
    from dressage.launch.preflight import main as mopd_check

    config = json.loads(Path(EMBEDDED).read_text())
    config["teachers"]["lookup"]["load"] = UNBUILT_TEACHER
    config["datasets"][0]["wieght"] = config["datasets"][0].pop("weight")
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(config))
    argv = ["--mopd-config", str(path), "--output-dir", str(tmp_path / "out"), "--dry-run"]
    launched = main(argv)
    launcher = capsys.readouterr().err
    checked = mopd_check([str(path)])
    check = capsys.readouterr().err
    assert launched == checked == 1
    for err in (launcher, check):
        assert "wieght: is not a known key (did you mean 'weight'?)" in err, err
        assert f"run `dressage assets --config {path}` first" in err, err
        assert err.count("not built yet") == 1, err
    said = sorted(line for line in launcher.splitlines() if line.startswith("  - "))
    assert said == sorted(line for line in check.splitlines() if line.startswith("  - "))
    assert len(said) == 3  # the unknown key, the weight it leaves missing, the unbuilt teacher
