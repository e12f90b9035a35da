"""The MOPD actor run by slime's own ``MegatronTrainRayActor`` control flow.

Each case starts ``tests/real_slime/actor_rig.py`` in a process of its own: slime's real ``init``,
``sleep``/``wake_up``, ``train`` and ``train_actor``, its ``forward_only`` over a tiny real
model, its advantage computation and its train-side rollout logging, with stand-ins only for
Megatron-LM compute, checkpoints and the GPU-only packages (see the rig's docstring). The batch
is real slime Samples through the project's expansion and converter and slime's DP split.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_mopd_actor.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, slime_root

pytestmark = pytest.mark.integration


def run_rig(tmp_path: Path, steps: int = 1, streamed: bool = False, **args: Any) -> dict[str, Any]:
    out = tmp_path / "report.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(slime_root()), str(REPO)])
    scenario = json.dumps({"args": args, "steps": steps, "streamed": streamed})
    proc = subprocess.run(
        [sys.executable, "-m", "tests.real_slime.actor_rig", scenario, str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def _teacher_passes(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in report["forward_passes"] if p["prefix"] == "teacher_"]


def _check_scores_and_logging(report: dict[str, Any]) -> None:
    got, want = report["teacher_log_probs"], report["expected_teacher_log_probs"]
    assert [len(x) for x in got] == [len(x) for x in want]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-5, abs=1e-6)  # each sample by its own teacher
    # what slime's train-side logging was fed: no string slot left, and it logged the step
    assert "prompt" not in report["left_in_rollout_data"]
    rollout = next(m for m in report["logged"] if "rollout/teacher_log_probs" in m)
    assert "rollout/advantages" in rollout
    (line,) = report["teachers_jsonl"]
    assert set(line["metrics"]) >= {
        "rollout/mopd/opd_reverse_kl_train_aggregation_mean/calc",
        "rollout/mopd/opd_reverse_kl_train_aggregation_mean/look",
    }
    assert report["trained"] and report["trained"][0]["advantages"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_rig(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def colocated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # --colocate makes slime force --offload-train: init ends with the actor asleep
    return run_rig(tmp_path_factory.mktemp("colocate"), colocate=True, offload_train=True)


def test_teachers_are_loaded_under_their_tags_with_their_steps(plain: dict[str, Any]) -> None:
    init = plain["init"]
    assert init["tags"] == ["actor", "teacher:calc", "teacher:look"]  # no stray "teacher" tag
    assert init["teacher_tags_hold"] == {"calc": True, "look": True}
    assert [(x["load"], x["ckpt_step"]) for x in init["loads"]] == [
        ("/ckpt/calc", None),
        ("/ckpt/look", 7),  # the pinned step reached the load
    ]
    assert init["ckpt_step_after"] is None  # and was put back
    assert init["active"] == "actor" and init["live_is_actor"]
    assert not init["asleep"]


def test_under_colocate_teachers_load_awake_and_init_ends_asleep(
    colocated: dict[str, Any],
) -> None:
    init = colocated["init"]
    assert init["loads"] and not any(x["asleep"] for x in init["loads"])
    assert init["asleep"], "slime's init must still end with the actor asleep"
    assert init["teacher_tags_hold"] == {"calc": True, "look": True}
    assert init["active"] == "actor" and init["live_is_actor"]
    events = colocated["events"]
    assert events[events.index("train") :][:2] == ["train", "resume"]  # woken to train
    assert colocated["after_train"] == {"asleep": True, "active": "actor"}
    _check_scores_and_logging(colocated)


def test_each_pass_runs_on_its_models_weights_and_a_step_restores_each_model_once(
    tmp_path: Path, colocated: dict[str, Any]
) -> None:
    """slime's step switches to the student before its passes, right after the last step backed
    the student up: the actor skips that restore. Every pass still runs on exactly its tag's
    backup, the student's passes on the weights the last step trained (the rig's train moves
    them)."""
    report = run_rig(tmp_path, steps=2)
    teachers = ["teacher:calc", "teacher:look", "actor"]
    assert report["restores"] == teachers * 2
    assert [(p["tag"], p["on_its_weights"]) for p in report["forward_passes"]] == [
        (tag, True) for tag in teachers
    ] * 2
    assert report["live_is_trained_actor"]
    assert len(report["trained"]) == 2 and report["trained"][1]["advantages"]
    # asleep between steps: waking restores the student (its weights were offloaded), once
    assert colocated["restores"] == ["actor", *teachers]
    assert all(p["on_its_weights"] for p in colocated["forward_passes"])


def test_streamed_switches_leave_each_pass_on_its_models_weights_and_no_hook(
    tmp_path: Path,
) -> None:
    """--mopd-restore streamed, its copies made inline (on CUDA they run on a side stream): the
    scoring's switches go through the layer streamer instead of slime's restore, every pass
    still runs on exactly its tag's backup, the scores are each sample's own teacher's, and
    the streamer's hooks are gone after the step."""
    report = run_rig(tmp_path, steps=2, streamed=True)
    assert report["restores"] == []  # the skip and the streamer: slime's restore never ran
    teachers = ["teacher:calc", "teacher:look", "actor"]
    assert [(p["tag"], p["on_its_weights"]) for p in report["forward_passes"]] == [
        (tag, True) for tag in teachers
    ] * 2
    assert report["live_is_trained_actor"] and report["hooks_left"] == 0
    got, want = report["teacher_log_probs"], report["expected_teacher_log_probs"]
    assert [len(x) for x in got] == [len(x) for x in want]
    for g, w in zip(got, want, strict=True):  # the second step's, each by its own teacher
        assert g == pytest.approx(w, rel=1e-5, abs=1e-6)


def test_each_teacher_scores_only_its_samples_in_micro_batches_of_its_own(
    plain: dict[str, Any],
) -> None:
    _check_scores_and_logging(plain)
    teacher_of = plain["teacher_of_sample"]
    passes = _teacher_passes(plain)
    assert [p["tag"] for p in passes] == ["teacher:calc", "teacher:look"]
    scored = []
    for p in passes:
        tid = p["tag"].removeprefix("teacher:")
        samples = [s for mb in p["micro_batches"] for s in mb]
        assert {teacher_of[str(s)] for s in samples} == {tid}
        scored += samples
    assert sorted(scored) == sorted(int(k) for k in teacher_of)  # K teachers, one batch of work
    actor = [p for p in plain["forward_passes"] if p["prefix"] == ""]
    assert len(actor) == 1 and actor[0]["tag"] == "actor"


def test_dynamic_batches_are_packed_per_teacher_and_scores_land_in_order(
    tmp_path: Path,
) -> None:
    report = run_rig(tmp_path, use_dynamic_batch_size=True, max_tokens_per_gpu=20)
    _check_scores_and_logging(report)
    look = next(p for p in _teacher_passes(report) if p["tag"] == "teacher:look")
    assert len(look["micro_batches"]) < 3  # first-fit packed, not one sample each


TOPK = {"mopd_objective": "topk", "mopd_topk": 8}


def _check_supports(report: dict[str, Any]) -> None:
    """Every sample's stored support is its own teacher's top-8, in the samples' order."""
    got, want = report["teacher_supports"], report["expected_teacher_supports"]
    assert len(got) == len(want) == len(report["teacher_log_probs"])
    for g, w in zip(got, want, strict=True):
        assert g is not None, "a sample reached train_actor without its teacher's support"
        assert g["ids"] == w["ids"]
        for key in ("log_probs", "tail"):
            assert len(g[key]) == len(w[key])
            for a, b in zip(g[key], w[key], strict=True):
                assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"colocate": True, "offload_train": True},
        {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 20},
    ],
    ids=["plain", "colocate-offload", "dynamic"],
)
def test_topk_teacher_passes_store_each_samples_support_in_order(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    report = run_rig(tmp_path, **TOPK, **options)
    _check_scores_and_logging(report)
    _check_supports(report)
    # the support rode on teacher_log_probs: its own keys never entered rollout_data
    assert not any(k.startswith("teacher_topk") for k in report["left_in_rollout_data"])
    passes = _teacher_passes(report)
    assert [p["tag"] for p in passes] == ["teacher:calc", "teacher:look"]
    if options.get("use_dynamic_batch_size"):
        look = next(p for p in passes if p["tag"] == "teacher:look")
        assert len(look["micro_batches"]) < 3


def test_users_postprocess_hook_runs_and_sees_the_teacher_ids(tmp_path: Path) -> None:
    report = run_rig(
        tmp_path,
        rollout_data_postprocess_path="tests.real_slime.actor_rig.user_postprocess",
        use_routing_replay=True,
    )
    _check_scores_and_logging(report)
    (saw,) = report["user_postprocess_saw"]
    assert "prompt" in saw and "advantages" in saw
    stages = {p["prefix"]: p["replay_stage"] for p in report["forward_passes"]}
    assert stages == {"teacher_": "fallthrough", "": "record"}  # as slime's ref/teacher passes


def test_the_actor_class_pickles_by_reference() -> None:
    import pickle

    from dressage.training import mopd_actor

    cls = mopd_actor.make_mopd_actor_cls()
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    assert issubclass(cls, MegatronTrainRayActor)
    assert cls.__module__ == "dressage.training.mopd_actor"
    assert mopd_actor.MopdMegatronActor is cls
    assert pickle.loads(pickle.dumps(cls)) is cls
