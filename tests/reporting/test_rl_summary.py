"""dressage_rl's own summary: reward, pass rate per task, advantages; and the MOPD note table."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.reporting.metrics import mopd_markdown, summarize
from dressage.reporting.rl import (
    advantage_stats,
    format_rl_summary,
    rl_markdown,
    summarize_rl,
)

pytestmark = pytest.mark.unit


def _records(rewards: list[dict[str, float]]) -> list[dict[str, Any]]:
    out = []
    for step, per_task in enumerate(rewards):
        metrics: dict[str, Any] = {f"rollout/reward/dataset/{t}": r for t, r in per_task.items()}
        metrics["rollout/raw_reward"] = sum(per_task.values()) / len(per_task)
        metrics["train/pg_loss"] = 0.1 * (step + 1)
        metrics["rollout/reverse_kl"] = 9.0  # no MOPD key: nothing of the MOPD table shows
        out.append({"step": step, "time": float(step), "metrics": metrics})
    return out


def test_pass_rate_per_task_reward_and_advantages() -> None:
    records = _records([{"calculator": 0.25, "lookup": 0.0}, {"calculator": 0.75, "lookup": 0.5}])
    summary = summarize_rl(records, advantages=[0.5, -0.5, 0.0, 0.0], url="file:///a")
    assert summary.steps == 2
    assert summary.pass_rate == {"calculator": (0.25, 0.75), "lookup": (0.0, 0.5)}
    assert summary.reward == (0.125, 0.625)
    assert summary.advantages is not None and summary.advantages.zero_fraction == 0.5
    text = format_rl_summary(summary)
    assert "calculator  25% -> 75%" in text and "lookup      0% -> 50%" in text
    assert "reward (first -> last): 0.1250 -> 0.6250" in text
    assert "4 trajectories" in text and "zero for 50%" in text
    assert "teacher" not in text and "reverse KL" not in text
    assert "nothing was learnt" not in text
    markdown = rl_markdown(summary)
    assert "| calculator | 25% → 75% |" in markdown


def test_all_zero_advantages_say_that_nothing_was_learnt() -> None:
    summary = summarize_rl(_records([{"lookup": 0.0}] * 2), advantages=[0.0] * 8)
    assert summary.no_signal
    assert "the policy gradient was 0" in format_rl_summary(summary)
    assert "the policy gradient was 0" in rl_markdown(summary)


def test_advantage_stats_ignore_nan_and_need_data() -> None:
    assert advantage_stats([]) is None
    stats = advantage_stats([1.0, -1.0, float("nan")])
    assert stats is not None and stats.count == 2 and stats.std == 1.0 and stats.mean == 0.0


def test_mopd_note_is_a_markdown_table_per_teacher() -> None:
    kl = "rollout/mopd/opd_reverse_kl_train_aggregation_mean/"
    records = [
        {"step": s, "metrics": {f"{kl}lookup": 1.0 - 0.1 * s, f"{kl}calculator": 2.0}}
        for s in range(3)
    ]
    markdown = mopd_markdown(summarize(records))
    lines = markdown.splitlines()
    headline = "reverse KL 1.500 → 1.400 (mean over teachers)"
    assert lines[0] == f"**MOPD, 3 step(s), 2 teacher(s)**: {headline}"
    assert "| lookup | 1.000 → 0.800 | - |" in lines
    assert lines[5] == "|---|---|---|"
