"""The MOPD advantage and loss hooks called by slime's own loss path, at TP 1, TP 2 and CP 2.

Each case spawns ``TP x CP`` CPU processes on gloo with megatron-core's parallel state
(``tests/real_slime/loss_rig.py``): slime's ``compute_advantages_and_returns`` calls
``compute_mopd_advantages`` and slime's ``loss_function`` calls ``mopd_policy_loss`` on the
vocab-parallel logits of the rank's context-parallel slice, exactly as inside slime's Megatron
actor. The loss, slime's reduced step metrics, the per-teacher metrics the actor logs, and the
gradient of the logits, added up over the ranks as Megatron's gradient reduction sees them,
must equal a single-process float64 full-vocabulary reference written from the MOPD formula.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_loss_path.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.real_slime import loss_rig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def expected() -> dict:  # type: ignore[type-arg]
    return loss_rig.reference(loss_rig.batch_spec())


@pytest.mark.parametrize(("tp", "cp"), [(1, 1), (2, 1), (1, 2)], ids=["tp1", "tp2", "cp2"])
def test_loss_and_gradients_match_the_full_vocabulary_reference(
    tp: int,
    cp: int,
    expected: dict,
    tmp_path: Path,  # type: ignore[type-arg]
) -> None:
    results = loss_rig.run(str(tmp_path), tp=tp, cp=cp)
    step = loss_rig.combine(results, cp)
    torch.testing.assert_close(step["grad"], expected["grad"], rtol=1e-4, atol=1e-6)
    assert step["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
    for r in results:  # every rank reports the same reduced step metrics
        assert r["metrics"]["mopd_loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert r["metrics"]["mopd_reverse_kl"] == pytest.approx(expected["reverse_kl"], rel=1e-5)
    (writer,) = [r for r in results if r["mopd"]]  # one rank logs the teachers' metrics
    for tid, kl in expected["teacher_kl"].items():
        key = f"rollout/mopd/opd_reverse_kl_train_aggregation_mean/{tid}"
        assert writer["mopd"][key] == pytest.approx(kl, rel=1e-5)
