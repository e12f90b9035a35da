"""The end-of-run summary of a GRPO run (``dressage_rl``): reward, pass rate per task, advantages.

    records = read_metrics("runs/x/output/metrics.jsonl")
    summary = summarize_rl(records, advantages=[0.0, 0.5, -0.5, ...], url="file:///...")
    print(format_rl_summary(summary))

From ``metrics.jsonl``: the mean reward (``rollout/raw_reward``, else ``rollout/reward_mean``)
and, per task (dataset), the mean reward of its trajectories (``rollout/reward/dataset/<task>``);
the built-in rewards score 1 for a right final answer and 0 otherwise, so that mean is the
task's pass rate. The policy-gradient loss is ``train/pg_loss``. Advantages are the per
trajectory values GRPO trains on (the ``rewards`` column of the staged ``train_data``: each
reward minus its group's mean): a group whose trajectories all scored the same gives zeros, and
a step whose advantages are all zero moves nothing, which the summary says in words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dressage.reporting.metrics import Family, series

__all__ = [
    "RL_REWARD",
    "TASK_REWARD_PREFIX",
    "AdvantageStats",
    "RlSummary",
    "advantage_stats",
    "format_rl_summary",
    "rl_markdown",
    "summarize_rl",
]

TASK_REWARD_PREFIX = "rollout/reward/dataset/"
RL_REWARD = Family("reward", per_teacher=(), overall=("rollout/raw_reward", "rollout/reward_mean"))
PG_LOSS = Family("policy-gradient loss", per_teacher=(), overall=("train/pg_loss",))
PASS_RATE = Family("pass rate per task", per_teacher=(TASK_REWARD_PREFIX,), overall=())


@dataclass(frozen=True)
class AdvantageStats:
    """Per-trajectory advantages over the whole run."""

    count: int
    mean: float
    std: float
    mean_abs: float
    zero_fraction: float
    """Share of trajectories with advantage 0 (their group all scored the same)."""


def advantage_stats(values: Sequence[float]) -> AdvantageStats | None:
    """Statistics of the run's advantages; None without any."""
    finite = [float(v) for v in values if math.isfinite(float(v))]
    if not finite:
        return None
    n = len(finite)
    mean = sum(finite) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / n)
    zeros = sum(1 for v in finite if abs(v) < 1e-12)
    return AdvantageStats(n, mean, std, sum(abs(v) for v in finite) / n, zeros / n)


@dataclass
class RlSummary:
    steps: int
    reward: tuple[float, float] | None = None
    """(first step, last step) mean reward."""
    pg_loss: tuple[float, float] | None = None
    pass_rate: dict[str, tuple[float, float]] = field(default_factory=dict)
    """task -> (first step, last step) share of right answers."""
    advantages: AdvantageStats | None = None
    url: str | None = None
    curves: str | None = None

    def to_dict(self) -> dict[str, Any]:
        adv = self.advantages
        return {
            "objective": "grpo",
            "steps": self.steps,
            "reward": list(self.reward) if self.reward else None,
            "pg_loss": list(self.pg_loss) if self.pg_loss else None,
            "pass_rate": {task: list(ends) for task, ends in self.pass_rate.items()},
            "advantages": None if adv is None else vars(adv),
            "url": self.url,
            "curves": self.curves,
        }

    @property
    def no_signal(self) -> bool:
        """Every advantage was zero: the policy gradient had nothing to push on."""
        return self.advantages is not None and self.advantages.zero_fraction == 1.0


def _ends(points: list[tuple[int, float]] | None) -> tuple[float, float] | None:
    return (points[0][1], points[-1][1]) if points else None


def summarize_rl(
    records: Sequence[dict[str, Any]],
    *,
    advantages: Sequence[float] = (),
    url: str | None = None,
    curves: str | None = None,
) -> RlSummary:
    """First and last step of reward, loss and pass rate per task; the run's advantages."""
    rates = series(records, PASS_RATE)
    return RlSummary(
        steps=len({int(r["step"]) for r in records}),
        reward=_ends(series(records, RL_REWARD).get("all")),
        pg_loss=_ends(series(records, PG_LOSS).get("all")),
        pass_rate={task: ends for task, pts in sorted(rates.items()) if (ends := _ends(pts))},
        advantages=advantage_stats(advantages),
        url=url,
        curves=curves,
    )


def _pair(values: tuple[float, float] | None, fmt: str = ".4f", arrow: str = "->") -> str:
    return "-" if values is None else f"{values[0]:{fmt}} {arrow} {values[1]:{fmt}}"


def _percent(values: tuple[float, float], arrow: str = "->") -> str:
    return f"{values[0]:.0%} {arrow} {values[1]:.0%}"


def _verdict(summary: RlSummary) -> str | None:
    if summary.no_signal:
        return (
            "every advantage was 0 (each group's trajectories scored alike), so the policy "
            "gradient was 0: nothing was learnt from these rewards"
        )
    return None


def format_rl_summary(summary: RlSummary) -> str:
    """The end-of-run table for a log: steps, reward, loss, pass rate per task, advantages."""
    lines = [
        f"steps: {summary.steps}   reward (first -> last): {_pair(summary.reward)}",
        f"policy-gradient loss (first -> last): {_pair(summary.pg_loss)}",
    ]
    if summary.pass_rate:
        width = max(len("task"), *(len(t) for t in summary.pass_rate))
        lines.append(f"  {'task':<{width}}  pass rate (first -> last step)")
        lines += [f"  {t:<{width}}  {_percent(e)}" for t, e in summary.pass_rate.items()]
    adv = summary.advantages
    if adv is not None:
        lines.append(
            f"advantages: {adv.count} trajectories, mean {adv.mean:+.4f}, std {adv.std:.4f}, "
            f"mean |A| {adv.mean_abs:.4f}, zero for {adv.zero_fraction:.0%}"
        )
    if verdict := _verdict(summary):
        lines.append(f"note: {verdict}")
    if summary.url:
        lines.append(f"artifacts: {summary.url}")
    if summary.curves:
        lines.append(f"curves:    {summary.curves}")
    return "\n".join(lines)


def rl_markdown(summary: RlSummary) -> str:
    """The same summary as a markdown table, for the run's note in the Airflow UI."""
    out = [
        f"**GRPO, {summary.steps} step(s)**: reward {_pair(summary.reward, '.3f', '→')}, "
        f"policy-gradient loss {_pair(summary.pg_loss, '.3f', '→')}",
        "",
    ]
    if summary.pass_rate:
        out += ["| task | pass rate (first → last step) |", "|---|---|"]
        out += [f"| {t} | {_percent(e, '→')} |" for t, e in summary.pass_rate.items()]
        out.append("")
    adv = summary.advantages
    if adv is not None:
        out.append(
            f"Advantages: {adv.count} trajectories, std {adv.std:.3f}, mean absolute "
            f"{adv.mean_abs:.3f}, zero for {adv.zero_fraction:.0%}."
        )
    if verdict := _verdict(summary):
        out.append(f"Note: {verdict}.")
    return "\n".join(out).strip()
