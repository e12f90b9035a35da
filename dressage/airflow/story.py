"""What a run tells the person who opens it in the Airflow UI: its note, its summary, its failure.

- **The run's note.** A task pushes markdown under the XCom key :data:`NOTE_KEY` (:func:`tell`);
  when the run ends, the listener of :mod:`dressage.airflow.plugin` writes the latest one as
  the run's note, which the UI shows on the run's page (markdown: tables, links, images). Notes
  hold at most :data:`NOTE_LIMIT` characters (the metadata column's size).
- **The summary.** :func:`output_summary` (the job's output folder, read by the train task)
  and :func:`staged_summary` (the staged artifacts, read by publish) give one :class:`Told`:
  the table for the log, the markdown for the note, and a small dict for XCom. MOPD and GRPO
  runs have their own (:mod:`dressage.reporting.metrics`, :mod:`dressage.reporting.rl`).
- **Failures.** :func:`fail` logs the message first, line by line, short enough to read
  without wrapping, puts its first line (and the problems it lists) in the note, and raises
  :class:`AirflowFailException` with that one line, so the traceback Airflow prints after it
  is headed by the sentence that matters.
- **The curves.** :func:`curves_path` is the UI-relative address at which the plugin serves a
  run's ``curves.png`` (a ``file://`` URL cannot be opened from a browser).
"""

from __future__ import annotations

import json
import logging
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlencode

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

__all__ = [
    "CURVES_ROUTE",
    "NOTE_KEY",
    "NOTE_LIMIT",
    "Told",
    "curves_path",
    "fail",
    "fit_note",
    "guard",
    "log_lines",
    "md_escape",
    "output_summary",
    "staged_summary",
    "tell",
]

T = TypeVar("T")
NOTE_KEY = "dressage_note"
NOTE_LIMIT = 1000
CURVES_ROUTE = "/dressage/curves"
LINE_WIDTH = 100
log = logging.getLogger(__name__)


def curves_path(dag_id: str, run_id: str) -> str:
    """Where the UI opens a run's curves (served by :mod:`dressage.airflow.plugin`)."""
    return f"{CURVES_ROUTE}?{urlencode({'dag_id': dag_id, 'run_id': run_id})}"


def md_escape(text: str) -> str:
    """Plain text that markdown shows as written (paths with ``_``, lists with ``*``)."""
    return re.sub(r"([\\`*_\[\]<>|#])", r"\\\1", text)


def fit_note(markdown: str, limit: int = NOTE_LIMIT) -> str:
    """``markdown`` cut at a line end to fit a note, with an ellipsis line when cut."""
    if len(markdown) <= limit:
        return markdown
    cut = markdown.rfind("\n", 0, limit - 2)
    return markdown[: cut if cut > 0 else limit - 2].rstrip() + "\n…"


def tell(context: Context, markdown: str) -> None:
    """Offer ``markdown`` as the run's note (the latest offer wins when the run ends)."""
    context["ti"].xcom_push(key=NOTE_KEY, value=fit_note(markdown.strip()))


def log_lines(level: int, text: str, *, wrap: bool = True) -> None:
    """Log ``text`` one line per record, wrapped at word boundaries near 100 characters (a
    table is logged with ``wrap=False``: its rows keep their columns)."""
    for line in text.splitlines() or [""]:
        if not wrap:
            log.log(level, "%s", line)
            continue
        indent = line[: len(line) - len(line.lstrip())] + "    "
        pieces = textwrap.wrap(
            line,
            LINE_WIDTH,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        for piece in pieces or [""]:
            log.log(level, "%s", piece)


def _failure_note(task_id: str, lines: list[str]) -> str:
    listed = [ln.strip()[2:] for ln in lines[1:] if ln.strip().startswith("- ")]
    out = [f"**{task_id} failed**: {md_escape(lines[0])}"]
    if listed:
        out += [""] + [f"- {md_escape(item)}" for item in listed[:8]]
    elif len(lines) > 1 and lines[-1].strip():
        out += ["", f"Last line: {md_escape(lines[-1].strip())}"]
    return "\n".join(out)


def fail(context: Context, message: str) -> NoReturn:
    """Fail the task without retries: the message first in the log, its gist in the note."""
    lines = [ln for ln in message.strip().splitlines()] or ["failed"]
    log_lines(logging.ERROR, "\n".join(lines))
    tell(context, _failure_note(context["ti"].task_id, lines))
    raise AirflowFailException(lines[0]) from None


def guard(context: Context | dict[str, Any], work: Callable[[], T]) -> T:
    """``work()``; an :class:`AirflowFailException` from it is told first (:func:`fail`)."""
    try:
        return work()
    except AirflowFailException as exc:
        fail(context, str(exc))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Told:
    """A run's summary three ways: ``text`` for the log, ``markdown`` for the note, ``data``."""

    text: str
    markdown: str
    data: dict[str, Any]


def _links(url: str | None, curves: str | None, started: str = "") -> str:
    parts = [started] if started else []
    if curves:
        parts.append(f"[![curves]({curves})]({curves}) [open the curves]({curves})")
    if url:
        parts.append(f"Artifacts: `{url}`")
    return "\n\n".join(parts)


def _summary(
    metrics_text: str,
    job_summary: dict[str, Any],
    advantages: Callable[[], Iterable[float]],
    *,
    objective: str,
    teachers: Iterable[str] = (),
    url: str | None = None,
    curves: str | None = None,
    curves_link: str | None = None,
    started: str = "",
) -> Told:
    from dressage.reporting.metrics import format_summary, mopd_markdown, parse_metrics, summarize
    from dressage.reporting.rl import format_rl_summary, rl_markdown, summarize_rl

    records = parse_metrics(metrics_text)
    links = _links(url, curves_link, started)
    if objective == "grpo":
        rl = summarize_rl(records, advantages=list(advantages()), url=url, curves=curves)
        markdown = fit_note(rl_markdown(rl), NOTE_LIMIT - len(links) - 2)
        return Told(format_rl_summary(rl), f"{markdown}\n\n{links}".strip(), rl.to_dict())
    mopd = summarize(
        records,
        teachers=teachers,
        heldout_initial=job_summary.get("heldout_reverse_kl_initial"),
        teacher_accuracy=job_summary.get("teacher_accuracy"),
        url=url,
        curves=curves,
    )
    markdown = fit_note(mopd_markdown(mopd), NOTE_LIMIT - len(links) - 2)
    return Told(format_summary(mopd), f"{markdown}\n\n{links}".strip(), mopd.to_dict())


def _train_data_rewards(urls: Iterable[str]) -> list[float]:
    """The ``rewards`` column (GRPO's per-trajectory advantages) of each artifact's train_data."""
    from dressage.staging import ArtifactError, open_artifact

    out: list[float] = []
    for url in urls:
        try:
            table = open_artifact(url).read_table("train_data")
        except (ArtifactError, KeyError, OSError) as exc:
            log.warning("no train_data in %s: %s", url, exc)
            continue
        out += [float(v) for v in table.column("rewards").to_pylist() if v is not None]
    return out


def output_summary(output_dir: Path, *, objective: str, teachers: Iterable[str] = ()) -> Told:
    """The summary of a finished job from its output folder (the train task's view); every
    teacher in ``teachers`` gets a row, sampled in this run or not."""
    metrics = output_dir / "metrics.jsonl"
    job = output_dir / "summary.json"
    rollouts = sorted((output_dir / "artifacts").glob("rollout-*"))
    return _summary(
        metrics.read_text() if metrics.is_file() else "",
        json.loads(job.read_text()) if job.is_file() else {},
        lambda: _train_data_rewards(p.resolve().as_uri() for p in rollouts),
        objective=objective,
        teachers=teachers,
    )


def staged_summary(url: str, *, objective: str, curves_link: str | None, started: str = "") -> Told:
    """The summary of a staged run, with what it started from (``started``, a sentence), its
    artifact URL and the link to its curves."""
    from dressage.staging import open_artifact

    run = open_artifact(url)
    blobs = run.manifest.blobs
    metrics = run.read_blob("metrics.jsonl").decode() if "metrics.jsonl" in blobs else ""
    job = json.loads(run.read_blob("summary.json")) if "summary.json" in blobs else {}
    rollouts = list(run.manifest.metadata.get("rollouts", []))
    return _summary(
        metrics,
        job,
        lambda: _train_data_rewards(f"{url}/{name}" for name in rollouts),
        objective=objective,
        teachers=run.manifest.metadata.get("teachers", []),
        url=url,
        curves=f"{url}/{blobs['curves.png'].path}" if "curves.png" in blobs else None,
        curves_link=curves_link if "curves.png" in blobs else None,
        started=started,
    )
