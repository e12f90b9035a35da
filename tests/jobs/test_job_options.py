"""RUN.json's ``advanced`` options reach the embedded trainer's slime-named ``args``."""

from __future__ import annotations

from pathlib import Path

import pytest

from dressage.config.job import JobOptions
from dressage.config.run import TrainRunConfig
from dressage.jobs.job_args import job_args
from dressage.jobs.train import main
from tests.helpers import REPO

pytestmark = pytest.mark.unit


def _run(tmp_path: Path, **advanced: object) -> TrainRunConfig:
    return TrainRunConfig(
        objective="mopd",
        mopd_config=str(REPO / "configs/mopd/embedded.json"),
        student="tiny:seed=0",
        engine_url="http://127.0.0.1:9",
        proxy_url="http://127.0.0.1:9",
        output_dir=str(tmp_path / "out"),
        num_steps=2,
        seed=1,
        rollout_batch_size=2,
        advanced=dict(advanced),
    )


@pytest.mark.parametrize("objective", ["sampled", "dense", "topk"])
def test_the_mopd_objective_reaches_the_trainer(tmp_path: Path, objective: str) -> None:
    run = _run(tmp_path, mopd_objective=objective)
    options = JobOptions.model_validate(run.advanced)
    args = job_args(run, options, student=tmp_path, admin_key=None)
    assert args.mopd_objective == objective


def test_the_default_objective_is_topk(tmp_path: Path) -> None:
    args = job_args(_run(tmp_path), JobOptions.model_validate({}), student=tmp_path, admin_key=None)
    assert args.mopd_objective == "topk" and args.mopd_topk is None  # K: DEFAULT_MOPD_TOPK


def test_the_top_k_reaches_the_trainer(tmp_path: Path) -> None:
    run = _run(tmp_path, mopd_objective="topk", mopd_topk=8, mopd_forward_kl_weight=0.5)
    args = job_args(run, JobOptions.model_validate(run.advanced), student=tmp_path, admin_key=None)
    assert (args.mopd_objective, args.mopd_topk, args.mopd_forward_kl_weight) == ("topk", 8, 0.5)


def _ray(run: TrainRunConfig) -> TrainRunConfig:
    return run.model_copy(update={"backend": "ray", "engine_url": None, "proxy_url": None})


def test_dense_on_the_ray_backend_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _ray(_run(tmp_path, mopd_objective="dense"))
    assert main(["--run-config", str(run.write(tmp_path / "run.json"))]) == 2
    err = capsys.readouterr().err
    assert "--mopd-objective dense is embedded-only: it keeps the teacher's full log-softmax" in err
    assert "about 8 GB a sample of 8k tokens" in err and "use --mopd-objective topk" in err
    assert not (tmp_path / "out").exists()


def test_topk_on_the_ray_backend_is_refused_only_beside_what_it_cannot_run_with(
    tmp_path: Path,
) -> None:
    from dressage.config.job import advanced_problems

    assert advanced_problems(_ray(_run(tmp_path, mopd_objective="topk", mopd_topk=8))) == []
    extra = ["--allgather-cp", "--rollout-top-p", "0.9"]
    cluster = {"extra_args": extra}
    refused = advanced_problems(_ray(_run(tmp_path, mopd_objective="topk", cluster=cluster)))
    assert [p.split(":", 1)[0] for p in refused] == [
        "--mopd-objective topk cannot run with --allgather-cp",
        "--mopd-objective topk cannot run with --rollout-top-p 0.9 (below 1)",
    ]
    sampled = _run(tmp_path, mopd_objective="sampled", cluster=cluster)
    assert advanced_problems(_ray(sampled)) == []  # sampled runs beside both
    embedded = _run(tmp_path, mopd_objective="topk", cluster=cluster)
    assert advanced_problems(embedded) == []  # cluster options are the ray backend's


def test_a_top_k_without_topk_or_below_one_is_refused_naming_the_option(tmp_path: Path) -> None:
    from dressage.config.job import advanced_problems

    (refused,) = advanced_problems(_run(tmp_path, mopd_objective="dense", mopd_topk=8))
    assert "mopd_topk 8 needs mopd_objective 'topk' (got 'dense')" in refused
    (refused,) = advanced_problems(_run(tmp_path, mopd_objective="topk", mopd_topk=0))
    assert refused == "advanced.mopd_topk should be greater than or equal to 1, got 0"


def test_max_tokens_per_gpu_turns_on_slimes_dynamic_batching(tmp_path: Path) -> None:
    run = _run(tmp_path, max_tokens_per_gpu=8192)
    args = job_args(run, JobOptions.model_validate(run.advanced), student=tmp_path, admin_key=None)
    assert args.use_dynamic_batch_size is True and args.max_tokens_per_gpu == 8192
    options = JobOptions.model_validate({})
    plain = job_args(_run(tmp_path), options, student=tmp_path, admin_key=None)
    assert plain.use_dynamic_batch_size is False and plain.micro_batch_size == 1


def test_a_zero_token_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens_per_gpu"):
        JobOptions.model_validate({"max_tokens_per_gpu": 0})


def test_the_forward_kl_share_reaches_the_trainer(tmp_path: Path) -> None:
    run = _run(tmp_path, mopd_objective="dense", mopd_forward_kl_weight=0.5)
    args = job_args(run, JobOptions.model_validate(run.advanced), student=tmp_path, admin_key=None)
    assert args.mopd_forward_kl_weight == 0.5


def test_grpos_kl_to_reference_and_entropy_terms_reach_the_trainer(tmp_path: Path) -> None:
    run = _run(tmp_path, kl_loss_coef=0.05, entropy_coef=0.001).model_copy(
        update={"objective": "grpo"}
    )
    args = job_args(run, JobOptions.model_validate(run.advanced), student=tmp_path, admin_key=None)
    assert args.use_kl_loss is True and args.kl_loss_coef == 0.05
    assert args.kl_loss_type == "low_var_kl" and args.entropy_coef == 0.001
    plain = _run(tmp_path).model_copy(update={"objective": "grpo"})
    args = job_args(plain, JobOptions.model_validate({}), student=tmp_path, admin_key=None)
    assert args.use_kl_loss is False and args.entropy_coef == 0.0  # no reference kept


@pytest.mark.parametrize("option", ["kl_loss_coef", "entropy_coef"])
def test_a_grpo_only_term_on_a_mopd_run_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    run = _run(tmp_path, **{option: 0.1})
    assert main(["--run-config", str(run.write(tmp_path / "run.json"))]) == 2
    assert f"advanced.{option} 0.1 is GRPO-only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_unknown_kl_estimator_is_refused() -> None:
    with pytest.raises(ValueError, match="kl_loss_type"):
        JobOptions.model_validate({"kl_loss_coef": 0.1, "kl_loss_type": "k4"})


def test_a_dynamic_sampling_filter_reaches_the_rollout_and_is_grpo_only(tmp_path: Path) -> None:
    path = "dressage.rollout.filters.nonzero_reward_std"
    run = _run(tmp_path, dynamic_sampling_filter=path).model_copy(update={"objective": "grpo"})
    args = job_args(run, JobOptions.model_validate(run.advanced), student=tmp_path, admin_key=None)
    assert args.dynamic_sampling_filter_path == path
    assert JobOptions.model_validate({"dynamic_sampling_filter": path}).objective_problems("mopd")


def test_steps_per_rollout_split_a_grpo_rollout_into_equal_optimizer_batches(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path, n_samples_per_prompt=8, num_steps_per_rollout=4).model_copy(
        update={"objective": "grpo"}
    )
    args = job_args(run, JobOptions.model_validate(run.advanced), student=tmp_path, admin_key=None)
    assert args.global_batch_size == 2 * 8 // 4  # 2 prompts x 8 samples in 4 steps
    assert (args.rollout_batch_size, args.n_samples_per_prompt) == (2, 8)


def test_steps_per_rollout_that_do_not_divide_the_rollout_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path, n_samples_per_prompt=3, num_steps_per_rollout=4).model_copy(
        update={"objective": "grpo"}
    )
    assert main(["--run-config", str(run.write(tmp_path / "run.json"))]) == 2
    err = capsys.readouterr().err
    assert "num_steps_per_rollout 4 does not divide a rollout's 6 trajectories" in err
    assert not (tmp_path / "out").exists()


def test_steps_per_rollout_on_a_mopd_run_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path, num_steps_per_rollout=2)
    assert main(["--run-config", str(run.write(tmp_path / "run.json"))]) == 2
    assert "advanced.num_steps_per_rollout 2 is GRPO-only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_advanced_problems_are_every_sentence_the_job_would_refuse_with(tmp_path: Path) -> None:
    from dressage.config.job import advanced_problems

    assert advanced_problems(_run(tmp_path)) == []
    bad = _run(tmp_path, num_steps_per_rollout=2, kl_loss_coef=0.1, temperature=0)
    (typed,) = advanced_problems(bad)  # a bad value first: nothing else can be judged
    assert typed == "advanced.temperature should be greater than 0, got 0"
    refused = advanced_problems(_run(tmp_path, num_steps_per_rollout=2, kl_loss_coef=0.1))
    assert [p.split(" ", 1)[0] for p in refused] == [
        "advanced.kl_loss_coef",
        "advanced.num_steps_per_rollout",
    ]


def test_the_embedded_job_refuses_a_top_k_beyond_the_students_vocabulary(tmp_path: Path) -> None:
    from dressage.jobs.train import JobConfigError, _check_topk_vocabulary

    student = tmp_path / "student"
    student.mkdir()
    (student / "config.json").write_text('{"model_type": "qwen3", "vocab_size": 12}')
    _check_topk_vocabulary(student, 12)
    with pytest.raises(JobConfigError, match=r"advanced\.mopd_topk: --mopd-topk 13 exceeds the "):
        _check_topk_vocabulary(student, 13)
    with pytest.raises(JobConfigError, match="--mopd-topk 16 exceeds the student's vocabulary"):
        _check_topk_vocabulary(student, None)  # the default K


def test_the_job_saves_every_save_interval_steps_and_loads_its_own_checkpoints(
    tmp_path: Path,
) -> None:
    checkpoints = str(tmp_path / "out" / "checkpoints")
    default = job_args(_run(tmp_path), JobOptions(), student=tmp_path, admin_key=None)
    assert (default.save, default.load, default.save_interval) == (checkpoints, checkpoints, 10)
    run = _run(tmp_path, save_interval=3)
    args = job_args(run, JobOptions.model_validate(run.advanced), student=tmp_path, admin_key=None)
    assert args.save_interval == 3 and args.start_rollout_id is None  # the checkpoint's, if any
    with pytest.raises(ValueError, match="save_interval"):
        JobOptions.model_validate({"save_interval": 0})


@pytest.mark.parametrize(
    ("key", "field", "flag"),
    [
        ("tensor_model_parallel_size", "tp_size", "--tensor-model-parallel-size"),
        ("context-parallel-size", "cp_size", "--context-parallel-size"),
        ("pipeline_model_parallel_size", "pp_size", "--pipeline-model-parallel-size"),
    ],
)
def test_slimes_spelling_of_a_cluster_key_names_the_key_to_use(
    tmp_path: Path, key: str, field: str, flag: str
) -> None:
    from dressage.config.job import advanced_problems

    (refused,) = advanced_problems(_ray(_run(tmp_path, cluster={key: 2})))
    assert refused == (
        f"advanced.cluster.{key} is not a known key (did you mean {field!r}, slime's {flag}?)"
    )
