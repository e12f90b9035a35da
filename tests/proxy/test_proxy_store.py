"""Unit tests of the durable trajectory store: appends, replay, torn and damaged records, the
single-writer lock, fsync group commit, segment rebuilding and Arrow export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from dressage.proxy.store import LOG_NAME, StoreError, TrajectoryStore
from dressage.schemas import validate_table
from dressage.trajectory import Segment, StepRecord

pytestmark = pytest.mark.unit

FLAGS = {"record_token_versions": True, "tito_model": "qwen3.5"}


def _step(
    session: str,
    index: int,
    segment: int,
    prefix: int,
    *,
    delta: int = 3,
    out: int = 2,
    finish: str = "tool_calls",
    boundary: str | None = None,
) -> StepRecord:
    extra: dict[str, Any] = {"weight_version": "1"}
    if prefix == 0:
        extra["segment"] = {"flags": FLAGS, "tools": None, "chat_template_kwargs": {}}
    return StepRecord(
        session_id=session,
        step_index=index,
        segment_index=segment,
        prefix_length=prefix,
        prompt_delta_ids=list(range(100 + index * 10, 100 + index * 10 + delta)),
        output_ids=list(range(500 + index * 10, 500 + index * 10 + out)),
        output_logprobs=[-0.5 - 0.125 * k for k in range(out)],
        output_versions=[1] * out,
        finish_reason=finish,
        messages=[
            {"role": "user", "content": f"turn {index}"},
            {"role": "assistant", "content": "ok"},
        ],
        started_at=1.0 + index,
        ended_at=1.5 + index,
        boundary_reason=boundary,
        request_id=f"req-{index}",
        extra=extra,
    )


async def _two_segments(store: TrajectoryStore, session: str = "s1") -> list[StepRecord]:
    steps = [
        _step(session, 0, 0, 0),
        _step(session, 1, 0, 5),
        _step(session, 2, 1, 0, boundary="messages_removed", finish="stop"),
    ]
    for step in steps:
        await store.append_step(step)
    return steps


def test_steps_and_segments_read_back_before_and_after_reopen(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    steps = asyncio.run(_two_segments(store))
    assert store.read_steps("s1") == steps
    closed = store.segments("s1")  # the open segment is not returned yet
    assert [s.segment_index for s in closed] == [0]
    assert closed[0].finish_reason == "segment_boundary"
    assert closed[0].extra_info["boundary_reason"] == "messages_removed"
    assert closed[0].extra_info["last_finish_reason"] == "tool_calls"
    segments = asyncio.run(store.finalize("s1"))
    assert [s.finish_reason for s in segments] == ["segment_boundary", "stop"]
    first = segments[0]
    assert first.tokens == steps[0].prompt_delta_ids + steps[0].output_ids + (
        steps[1].prompt_delta_ids + steps[1].output_ids
    )
    assert first.full_loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert first.full_versions == [-1, -1, -1, 1, 1, -1, -1, -1, 1, 1]
    assert first.prompt_length == 3
    assert first.messages == steps[0].messages + steps[1].messages
    store.close()

    again = TrajectoryStore.open(tmp_path)
    assert again.report.records == 4 and again.report.skipped_corrupt == 0
    assert again.sessions["s1"].status == "finalized"
    assert [s.to_dict() for s in again.segments("s1")] == [s.to_dict() for s in segments]
    assert asyncio.run(again.finalize("s1")) == segments  # idempotent, nothing appended
    assert again.report.records == 4
    again.close()


def test_a_torn_last_record_is_cut_and_appends_continue(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(store.append_step(_step("s1", 0, 0, 0)))
    store.close()
    log = tmp_path / LOG_NAME
    whole = log.read_bytes()
    half = json.dumps({"t": "step", "session_id": "s1"}).encode()
    log.write_bytes(whole + b"0badcafe " + half[: len(half) // 2])  # a crash mid-write

    store = TrajectoryStore.open(tmp_path)
    assert store.report.torn_tail_bytes > 0 and store.report.records == 1
    assert log.read_bytes() == whole
    asyncio.run(store.append_step(_step("s1", 1, 0, 5)))
    store.close()
    store = TrajectoryStore.open(tmp_path)
    assert [s.step_index for s in store.read_steps("s1")] == [0, 1]
    store.close()


def test_a_damaged_record_in_the_middle_is_skipped_counted_and_charged(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(store.append_step(_step("a", 0, 0, 0)))
    asyncio.run(store.append_step(_step("b", 0, 0, 0)))
    store.close()
    log = tmp_path / LOG_NAME
    lines = log.read_bytes().splitlines(keepends=True)
    damaged = lines[0].replace(b'"turn 0"', b'"turn X"')  # same length, checksum now wrong
    log.write_bytes(damaged + lines[1])
    store = TrajectoryStore.open(tmp_path)
    assert store.report.skipped_corrupt == 1 and store.report.records == 1
    assert store.sessions["a"].num_steps == 0 and store.sessions["b"].num_steps == 1
    (damage,) = store.sessions["a"].damage or []  # charged: the record after it names it
    assert (damage.record, damage.step_index, damage.known_from) == ("step", 0, "next_record")
    assert store.sessions["b"].damage is None
    store.close()


def test_a_trailing_damaged_record_is_a_torn_tail(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(store.append_step(_step("a", 0, 0, 0)))
    store.close()
    log = tmp_path / LOG_NAME
    good = log.read_bytes()
    log.write_bytes(good + b"\x00" * 40 + b"\n")  # garbage a power loss can leave
    store = TrajectoryStore.open(tmp_path)
    assert store.report.torn_tail_bytes == 41 and store.report.skipped_corrupt == 0
    assert log.read_bytes() == good
    store.close()


def test_one_process_at_a_time(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    with pytest.raises(StoreError, match="in use by another process"):
        TrajectoryStore.open(tmp_path)
    store.close()
    TrajectoryStore.open(tmp_path).close()


def test_the_partial_rollout_flag_of_a_session_survives_a_reopen(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(store.set_partial_rollout("s1", False))  # the default: nothing to write
    assert "s1" not in store.sessions and store.size_bytes == 0
    asyncio.run(store.set_partial_rollout("s1", True))
    asyncio.run(store.set_partial_rollout("s1", True))  # unchanged: written once
    asyncio.run(store.append_step(_step("s1", 0, 0, 0)))
    store.close()
    lines = (tmp_path / LOG_NAME).read_bytes().splitlines()
    assert [json.loads(line[9:])["t"] for line in lines] == ["options", "step"]
    store = TrajectoryStore.open(tmp_path)
    assert store.sessions["s1"].partial_rollout and store.report.skipped_corrupt == 0
    assert store.sessions["s1"].num_steps == 1
    asyncio.run(store.finalize("s1"))
    with pytest.raises(StoreError, match="session s1 is finalized; its options are final"):
        asyncio.run(store.set_partial_rollout("s1", False))
    store.close()


def test_fsync_mode_group_commits_concurrent_appends(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path, fsync=True)

    async def many() -> None:
        await asyncio.gather(*(store.append_step(_step(f"s{i}", 0, 0, 0)) for i in range(40)))

    asyncio.run(many())
    assert store._synced == store._written == 40
    store.close()
    assert len(TrajectoryStore.open(tmp_path).sessions) == 40


def test_discarded_and_finalized_sessions_refuse_more(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(store.append_step(_step("d", 0, 0, 0)))
    asyncio.run(store.discard("d"))
    with pytest.raises(StoreError, match="discarded"):
        asyncio.run(store.append_step(_step("d", 1, 0, 5)))
    with pytest.raises(StoreError, match="discarded"):
        asyncio.run(store.finalize("d"))
    asyncio.run(store.append_step(_step("f", 0, 0, 0)))
    asyncio.run(store.finalize("f"))
    with pytest.raises(StoreError, match="finalized"):
        asyncio.run(store.append_step(_step("f", 1, 0, 5)))
    store.close()


def test_arrow_export_validates_and_skips_discarded(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(_two_segments(store, "keep"))
    asyncio.run(_two_segments(store, "drop"))
    asyncio.run(store.finalize("keep"))
    asyncio.run(store.discard("drop"))
    steps, segments = store.steps_table(), store.segments_table()
    assert steps.num_rows == 3 and segments.num_rows == 2
    assert set(steps.column("session_id").to_pylist()) == {"keep"}
    assert validate_table("steps", steps).ok
    assert validate_table("segments", segments).ok
    store.close()


def test_versions_are_left_out_when_the_segment_did_not_record_them(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    step = _step("v", 0, 0, 0)
    step.extra["segment"]["flags"] = {"record_token_versions": False}
    asyncio.run(store.append_step(step))
    (segment,) = asyncio.run(store.finalize("v"))
    assert isinstance(segment, Segment) and segment.full_versions is None
    assert segment.extra_info["weight_versions"] == [1]
    store.close()
