"""The MOPD advantage and loss hooks called by slime's own loss path, at TP 1, TP 2 and CP 2.

Each layout spawns ``TP x CP`` CPU processes on gloo with megatron-core's parallel state
(``tests/real_slime/loss_rig.py``): slime's ``compute_advantages_and_returns`` calls
``compute_mopd_advantages`` and slime's ``loss_function`` calls ``mopd_policy_loss`` on the
vocab-parallel logits of the rank's context-parallel slice, exactly as inside slime's Megatron
actor. The loss, slime's reduced step metrics, the per-teacher metrics the actor logs, and the
gradient of the logits, added up over the ranks as Megatron's gradient reduction sees them,
must equal a single-process float64 full-vocabulary reference written from the MOPD formula.

``--mopd-objective topk`` runs in the same processes: each rank scores the teacher as the MOPD
actor's teacher pass does (its top-K support from the teacher's logits shard at the rank's CP
slice, reduced over the TP group), and the loss and gradient must equal the bucketed KL written
plainly over the whole vocabulary in float64, for K = 1, 8 and V, and with a forward-KL share.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_loss_path.py
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.real_slime import loss_rig

pytestmark = pytest.mark.integration

Layout = tuple[int, list[dict[str, Any]]]


@pytest.fixture(scope="module", params=[(1, 1), (2, 1), (1, 2)], ids=["tp1", "tp2", "cp2"])
def layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """``(cp, per-rank results of every case)``: one spawned run per layout."""
    tp, cp = request.param
    out = tmp_path_factory.mktemp(f"tp{tp}cp{cp}")
    return cp, loss_rig.run(str(out), tp=tp, cp=cp)


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return loss_rig.reference(loss_rig.batch_spec())


def _case(layout: Layout, name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cp, results = layout
    ranks = [r[name] for r in results]
    return ranks, loss_rig.combine(ranks, cp)


def test_loss_and_gradients_match_the_full_vocabulary_reference(
    layout: Layout, expected: dict[str, Any]
) -> None:
    results, step = _case(layout, "sampled")
    torch.testing.assert_close(step["grad"], expected["grad"], rtol=1e-4, atol=1e-6)
    assert step["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
    for r in results:  # every rank reports the same reduced step metrics
        assert r["metrics"]["mopd_loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert r["metrics"]["mopd_reverse_kl"] == pytest.approx(expected["reverse_kl"], rel=1e-5)
    (writer,) = [r for r in results if r["mopd"]]  # one rank logs the teachers' metrics
    for tid, kl in expected["teacher_kl"].items():
        key = f"rollout/mopd/opd_reverse_kl_train_aggregation_mean/{tid}"
        assert writer["mopd"][key] == pytest.approx(kl, rel=1e-5)


TOPK_CASES = [name for name, case in loss_rig.CASES.items() if case["mopd_objective"] == "topk"]


@pytest.mark.parametrize("name", TOPK_CASES)
def test_topk_loss_and_gradients_match_the_bucketed_float64_reference(
    layout: Layout, name: str
) -> None:
    case = loss_rig.CASES[name]
    want = loss_rig.topk_reference(
        loss_rig.batch_spec(), case["mopd_topk"], case.get("mopd_forward_kl_weight", 0.0)
    )
    results, step = _case(layout, name)
    assert want["loss"] > 1e-3  # the teacher and the student differ: a loss that can fail
    torch.testing.assert_close(step["grad"], want["grad"], rtol=1e-4, atol=1e-6)
    assert step["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
    for r in results:
        assert r["metrics"]["mopd_topk_kl"] == pytest.approx(want["loss"], rel=1e-5)
        assert r["metrics"]["mopd_loss"] == pytest.approx(want["loss"], rel=1e-5)
        # the teacher's sampled-token log-probs came from its own logits, through slime's path
        assert r["metrics"]["mopd_reverse_kl"] == pytest.approx(want["reverse_kl"], rel=1e-5)
