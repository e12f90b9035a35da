"""The embedded trainer's advantage computation against slime's own, on the same rollout data.

``dressage.training.embedded.advantages.compute_advantages_and_returns`` stands in for slime's
``compute_advantages_and_returns`` on one machine; here both run on copies of one batch (one
gloo process with megatron-core's parallel state, so slime's code runs as it does in its actor)
for every estimator the embedded trainer supports, with and without the KL term, OPD shaping and
whitening, and must agree on ``kl``, ``advantages`` and ``returns``.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_embedded_parity.py
"""

from __future__ import annotations

import copy
from argparse import Namespace
from typing import Any

import pytest
import torch

from dressage.training.embedded.advantages import compute_advantages_and_returns as embedded

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("megatron_world")]


def _rollout_data(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    resp = [5, 3, 7, 4]
    masks = [(torch.rand(n, generator=g) > 0.3).int() for n in resp]
    for m in masks:
        m[0] = 1
    return {
        "log_probs": [-torch.rand(n, generator=g) for n in resp],
        "ref_log_probs": [-torch.rand(n, generator=g) for n in resp],
        "teacher_log_probs": [-torch.rand(n, generator=g) for n in resp],
        "rewards": [0.5, -1.0, 1.5, 0.0],
        "loss_masks": masks,
        "response_lengths": resp,
        "total_lengths": [n + 3 for n in resp],
    }


def _args(estimator: str, **over: Any) -> Namespace:
    values = dict(
        advantage_estimator=estimator,
        custom_advantage_function_path=None,
        kl_coef=0.0,
        kl_loss_type="k1",
        use_rollout_logprobs=False,
        use_opd=False,
        opd_type="megatron",
        opd_kl_coef=1.0,
        normalize_advantages=estimator.startswith("reinforce_plus_plus"),
        gamma=0.9,
    )
    values.update(over)
    return Namespace(**values)


ESTIMATORS = ["grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
OPTIONS: list[dict[str, Any]] = [
    {},
    {"kl_coef": 0.1},
    {"use_opd": True, "opd_kl_coef": 0.5},
    {"kl_loss_type": "k3", "kl_coef": 0.2},
]
CASES = [(e, o) for e in ESTIMATORS for o in OPTIONS] + [
    ("grpo", {"normalize_advantages": True}),
    ("grpo", {"normalize_advantages": True, "kl_coef": 0.1}),
]


@pytest.mark.parametrize(("estimator", "over"), CASES, ids=lambda x: str(x))
def test_embedded_advantages_equal_slimes(estimator: str, over: dict[str, Any]) -> None:
    from slime.backends.megatron_utils.loss import compute_advantages_and_returns as slimes

    args = _args(estimator, **over)
    ours, theirs = _rollout_data(), _rollout_data()
    slimes(args, theirs)
    embedded(copy.copy(args), ours)
    for key in ("kl", "advantages", "returns"):
        for i, (a, b) in enumerate(zip(ours[key], theirs[key], strict=True)):
            torch.testing.assert_close(a.float(), b.float(), msg=f"{key}[{i}]")


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_both_refuse_reinforce_plus_plus_without_whitening(estimator: str) -> None:
    with pytest.raises(ValueError, match="normalize-advantages"):
        embedded(_args(estimator, normalize_advantages=False), _rollout_data())
