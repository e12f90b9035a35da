"""The learning curves of a run as one PNG: reverse KL and reward per teacher, held-out
accuracy per task, over the steps (step -1: before training).

    python -m dressage.reporting.curves runs/x/output/metrics.jsonl runs/x/output/curves.png

Each teacher gets one hue: its raw step values as a thin light line, a centred rolling mean as
a thick dark one. Rendered with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dressage.commands import command_parser
from dressage.reporting.metrics import (
    ACCURACY,
    REVERSE_KL,
    REWARD,
    Family,
    read_metrics,
    series,
)

__all__ = ["plot_curves", "rolling_mean"]


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average; near the ends it averages the neighbours that exist."""
    half = max(window, 1) // 2
    out = []
    for i in range(len(values)):
        part = values[max(0, i - half) : i + half + 1]
        out.append(sum(part) / len(part))
    return out


def _window(n: int) -> int:
    return max(3, (n // 8) | 1)  # odd, about an eighth of the run


def plot_curves(
    records: Sequence[dict[str, Any]],
    out: str | Path,
    *,
    families: Sequence[Family] = (REVERSE_KL, REWARD),
    title: str | None = None,
) -> Path:
    """Write the PNG to ``out``; a family without data gets a panel that says so."""
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6 * len(families)), layout="constrained")
    axes = fig.subplots(len(families), 1, squeeze=False)[:, 0]
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    found_by_family = [series(records, family) for family in families]
    names = sorted({n for found in found_by_family for n in found} - {"all"})
    colours = {n: palette[i % len(palette)] for i, n in enumerate(names)} | {"all": "dimgray"}
    for ax, family, found in zip(axes, families, found_by_family, strict=True):
        for teacher, points in sorted(found.items()):  # a teacher keeps its colour in every panel
            steps = [s for s, _ in points]
            values = [v for _, v in points]
            colour = to_rgb(colours[teacher])
            dark = tuple(0.7 * c for c in colour)
            ax.plot(steps, values, color=colour, alpha=0.35, linewidth=1)
            smooth = rolling_mean(values, _window(len(values)))
            marker = "o" if len(steps) < 5 else None  # a line of one point draws nothing
            ax.plot(steps, smooth, color=dark, linewidth=2.2, marker=marker, label=teacher)
        if family is ACCURACY:  # a share: the whole range, so 0 -> 0.1 does not look steep
            ax.set_ylim(-0.03, 1.03)
        if found:
            ax.legend(title="task" if family is ACCURACY else "teacher", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(family.title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dressage.reporting.curves METRICS_JSONL OUT_PNG``: plot, print the PNG's path."""
    parser = command_parser(
        "python -m dressage.reporting.curves", description="Plot a run's learning curves."
    )
    parser.add_argument("metrics", help="the run's metrics.jsonl")
    parser.add_argument("out", help="the PNG to write")
    args = parser.parse_args(argv)
    print(plot_curves(read_metrics(args.metrics), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
