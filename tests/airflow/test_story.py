"""What a run tells: notes that fit the metadata column, markdown that shows text as written,
failures whose reason comes first and whose note lists the problems."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from dressage.airflow.story import NOTE_KEY, NOTE_LIMIT, curves_path, fail, fit_note, md_escape

pytestmark = pytest.mark.unit


class _Ti:
    task_id = "validate"

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_notes_fit_the_column_cut_at_a_line_end() -> None:
    long = "\n".join(f"| row {i} | {'x' * 40} |" for i in range(60))
    cut = fit_note(long)
    assert len(cut) <= NOTE_LIMIT and cut.endswith("\n…")
    assert long.startswith(cut.removesuffix("\n…"))
    assert fit_note("short") == "short"


def test_markdown_shows_paths_and_symbols_as_written() -> None:
    assert md_escape("does_not_exist.json *x* [a]") == r"does\_not\_exist.json \*x\* \[a\]"


def test_curves_path_is_relative_and_quoted() -> None:
    path = curves_path("dressage_mopd", "manual__2026-01-01T00:00:00+00:00")
    assert path == (
        "/dressage/curves?dag_id=dressage_mopd&run_id=manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    )


def test_fail_logs_the_reason_first_short_lines_and_notes_the_problems(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    ti = _Ti()
    message = (
        "configs/x.json (mopd): 2 problem(s)\n"
        "  - teacher 'lookup': " + "does not exist " * 12 + "\n"
        "  - dataset 'calc': weight must be > 0"
    )
    with pytest.raises(AirflowFailException) as raised:
        fail({"ti": ti}, message)  # type: ignore[arg-type]
    assert str(raised.value) == "configs/x.json (mopd): 2 problem(s)"  # one line
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "configs/x.json (mopd): 2 problem(s)"
    assert all(len(line) <= 110 for line in lines)  # wrapped, not cut at the right
    assert all(r.levelname == "ERROR" for r in caplog.records)
    note = ti.pushed[NOTE_KEY]
    assert note.splitlines()[0] == "**validate failed**: configs/x.json (mopd): 2 problem(s)"
    assert "- dataset 'calc': weight must be > 0" in note.replace("\\", "")


def test_the_train_summary_names_every_teacher_even_unsampled(tmp_path: Any) -> None:
    from dressage.airflow.story import output_summary

    kl = "rollout/mopd/opd_reverse_kl_train_aggregation_mean/calculator"
    record = {"step": 0, "time": 0.0, "metrics": {kl: 1.25}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    told = output_summary(tmp_path, objective="mopd", teachers=["calculator", "lookup"])
    assert "teachers: 2" in told.text and "lookup" in told.text
    assert told.markdown.startswith("**MOPD, 1 step(s), 2 teacher(s)**")
