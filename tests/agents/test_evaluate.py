"""Task accuracy through the agent loop: proxy, tools and reward, against a scripted engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from dressage.agents.evaluate import EvalItem, items_from_jsonl, measure_accuracy
from dressage.proxy.tito import TITOTokenizer
from tests.helpers import REPO
from tests.proxy.conftest import Script, scripted_proxy

KEY = "eval-admin-key"


def _call(function: str, parameter: str, value: str) -> str:
    return (
        f"<tool_call>\n<function={function}>\n<parameter={parameter}>\n{value}\n"
        "</parameter>\n</function>\n</tool_call>"
    )


def test_items_are_scored_by_the_task_reward_after_real_tool_calls(
    tmp_path: Path, tito: TITOTokenizer
) -> None:
    items = [
        EvalItem("calculator", "Compute 45 + 5. Reply with the number only.", "50"),
        EvalItem("calculator", "Compute 6 * 7. Reply with the number only.", "42"),
        EvalItem(
            "lookup",
            "Table: fig=3, pear=78. What is the value of pear? Reply with the number only.",
            "78",
        ),
    ]
    replies = Script(
        tito,
        _call("calculator", "expression", "45 + 5"), "50",  # right
        _call("calculator", "expression", "6 * 7"), "41",  # wrong answer after a right call
        _call("lookup", "key", "pear"), "78",  # right
    )  # fmt: skip
    with scripted_proxy(replies, tmp_path / "store", replies.tito, admin_key=KEY) as (url, _):
        report = measure_accuracy(url, items, admin_key=KEY, concurrency=1, max_tokens=48)
        stats = httpx.get(f"{url}/v1/stats", headers={"authorization": f"Bearer {KEY}"}).json()
    assert report.accuracy == {"calculator": 0.5, "lookup": 1.0}, report.first_errors
    assert report.count == {"calculator": 2, "lookup": 1}
    assert report.errors == {"calculator": 0, "lookup": 0}
    # the tool answered between the calls: the second call's prompt carries its result
    assert len(replies.bodies) == 6
    assert all(b["sampling_params"].get("top_k") == 1 for b in replies.bodies)  # greedy
    assert all(b["sampling_params"].get("max_new_tokens") == 48 for b in replies.bodies)
    assert "50" in replies.tito.decode(replies.bodies[1]["input_ids"][-20:])
    sessions: dict[str, Any] = stats["sessions"]
    assert (sessions["open"], sessions["discarded"]) == (0, 3), stats  # nothing left to train


def test_an_agent_that_cannot_run_scores_zero_and_is_counted(tmp_path: Path) -> None:
    items = [EvalItem("calculator", "Compute 1 + 1. Reply with the number only.", "2")]
    report = measure_accuracy("http://127.0.0.1:9", items, timeout_s=5)  # nothing listens
    assert report.accuracy == {"calculator": 0.0}
    assert report.errors == {"calculator": 1}


def test_rows_of_the_shipped_eval_files_become_items() -> None:
    items = items_from_jsonl(REPO / "configs/mopd/data/calculator.eval.jsonl")
    assert items and all(i.task == "calculator" and i.label for i in items)


def test_a_row_without_a_label_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"input": "x", "label": "1", "metadata": {"task": "lookup"}}\n{"input": "y"}\n'
    )
    try:
        items_from_jsonl(path)
    except ValueError as exc:
        assert f"{path}:2" in str(exc)
    else:
        raise AssertionError("a row without a label was accepted")
