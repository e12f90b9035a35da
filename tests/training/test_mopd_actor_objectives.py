"""Which MOPD objectives slime's actor trains, refused at ``init`` before slime builds anything,
and the top-k teacher pass's post-forward function off Megatron (one rank, the whole vocabulary).

slime cannot run here: a stand-in base class records whether slime's ``init`` was reached. The
pass inside slime's own actor is tested in tests/real_slime/test_mopd_actor.py, under TP and CP
in tests/real_slime/test_loss_path.py.
"""

from __future__ import annotations

import sys
import types
from argparse import Namespace
from typing import Any

import pytest
import torch

from dressage.training.mopd_topk import support_of
from dressage.training.topk_teacher_pass import SUPPORT_KEYS, response_supports, with_supports

pytestmark = pytest.mark.unit


def _actor(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    from dressage.training.mopd_actor import make_mopd_actor_cls

    reached: list[str] = []

    class MegatronTrainRayActor:
        def init(self, args: Any, role: str, **_: Any) -> int:
            reached.append(role)
            return 0

    module = types.ModuleType("slime.backends.megatron_utils.actor")
    module.MegatronTrainRayActor = MegatronTrainRayActor  # type: ignore[attr-defined]
    for name in ("slime", "slime.backends", "slime.backends.megatron_utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return make_mopd_actor_cls.__wrapped__()(), reached


def test_dense_is_refused_with_the_memory_it_would_need(monkeypatch: pytest.MonkeyPatch) -> None:
    actor, reached = _actor(monkeypatch)
    with pytest.raises(ValueError, match=r"full log-softmax at every response token, V x 4 bytes"):
        actor.init(Namespace(mopd_objective="dense"), "actor")
    assert reached == []


@pytest.mark.parametrize(
    "options",
    [{"allgather_cp": True}, {"rollout_top_p": 0.9}, {"allgather_cp": True, "rollout_top_p": 0.5}],
    ids=["allgather-cp", "top-p", "both"],
)
def test_topk_is_refused_with_allgather_cp_or_top_p_naming_both(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    actor, reached = _actor(monkeypatch)
    args = Namespace(mopd_objective="topk", allgather_cp=False, rollout_top_p=1.0)
    vars(args).update(options)
    with pytest.raises(ValueError) as caught:
        actor.init(args, "actor")
    message = str(caught.value)
    assert "--allgather-cp" in message and "--rollout-top-p" in message
    assert message.count(". ") == 0  # one sentence
    assert reached == []


def test_topk_with_a_k_below_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    actor, reached = _actor(monkeypatch)
    with pytest.raises(ValueError, match="--mopd-topk must be at least 1"):
        actor.init(Namespace(mopd_objective="topk", mopd_topk=0), "actor")
    assert reached == []


@pytest.mark.parametrize("objective", ["sampled", "topk"])
def test_sampled_and_topk_reach_slimes_init(
    monkeypatch: pytest.MonkeyPatch, objective: str
) -> None:
    actor, reached = _actor(monkeypatch)
    args = Namespace(mopd_objective=objective, allgather_cp=False, rollout_top_p=1.0)
    actor.init(args, "critic")  # not the actor role: no teachers to load, no hooks to wrap
    assert reached == ["critic"]


V = 11


def test_the_pass_keeps_each_samples_top_k_at_its_response_rows() -> None:
    g = torch.Generator().manual_seed(3)
    totals, resps, k, temperature = [6, 4, 7], [3, 1, 4], 3, 0.7
    tokens = [torch.randint(0, V, (n,), generator=g) for n in totals]
    logits = torch.randn(1, sum(totals), V, generator=g) * 2
    args = Namespace(mopd_topk=k, rollout_temperature=temperature, log_probs_chunk_size=2)
    supports, sampled = response_supports(
        logits, args=args, unconcat_tokens=tokens, total_lengths=totals, response_lengths=resps
    )
    base = 0
    for support, lp, tok, total, resp in zip(supports, sampled, tokens, totals, resps, strict=True):
        rows = torch.arange(base + total - resp - 1, base + total - 1)
        log_p = torch.log_softmax(logits[0, rows].double() / temperature, -1)
        top = log_p.topk(k, -1)
        assert torch.equal(support.ids.long(), top.indices)
        torch.testing.assert_close(support.log_probs.double(), top.values, rtol=1e-5, atol=1e-6)
        outside = torch.ones_like(log_p, dtype=torch.bool)
        outside.scatter_(-1, top.indices, False)
        outside.scatter_(-1, tok[total - resp :, None], False)  # the sampled token is no tail
        tail = torch.logsumexp(log_p.masked_fill(~outside, float("-inf")), -1)
        torch.testing.assert_close(support.tail.double(), tail, rtol=1e-5, atol=1e-6)
        picked = log_p.gather(-1, tok[total - resp :, None]).squeeze(-1)
        torch.testing.assert_close(lp.double(), picked, rtol=1e-5, atol=1e-6)
        base += total


def test_stored_supports_ride_on_their_samples_teacher_log_probs() -> None:
    values = [torch.zeros(2), torch.zeros(3)]
    stored: dict[str, Any] = {
        "teacher_log_probs": values,
        "teacher_topk_ids": [torch.zeros(2, 1, dtype=torch.int32), torch.ones(3, 1).int()],
        "teacher_topk_log_probs": [torch.zeros(2, 1), torch.zeros(3, 1)],
        "teacher_topk_tail": [torch.zeros(2), torch.zeros(3)],
    }
    out = with_supports(stored, "teacher_")
    assert out is not None and [t is v for t, v in zip(out, values, strict=True)] == [True, True]
    second = support_of(out[1])
    assert second is not None and second.ids.tolist() == [[1], [1], [1]]
    assert with_supports({}, "teacher_") is None  # off the last pipeline stage
    del stored["teacher_" + SUPPORT_KEYS[2]]
    with pytest.raises(ValueError, match="teacher_topk_tail"):
        with_supports(stored, "teacher_")
