"""A damaged store costs at most the damaged record's own session, from that record on.

The store's damage contract (dressage.proxy.store's docstring): a record that does not read
back is skipped and charged to its session (named by the record after it, or by its own
identity), and that session's segment from the lost step on is marked no-grad with the reason;
no other session changes. The exhaustive test flips one byte at every offset of a small store
(one copy per offset, replayed in process) and checks exactly that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from dressage.proxy.client import SyncProxyClient, Trajectory
from dressage.proxy.store import LOG_NAME, TrajectoryStore
from dressage.proxy.tito import TITOTokenizer
from dressage.schemas import validate_table
from dressage.slime.sample_meta import NO_GRAD_REASON
from dressage.trajectory import StepRecord
from tests.proxy.conftest import Script, scripted_proxy

FLAGS = {"record_token_versions": True}
FLIPS = (0xFF, 0x01, 0x20)
"""XOR masks, in turn per offset: every bit; the low bit (a digit stays a digit: a plausible
wrong value, e.g. another session's id); the case bit (a hex digit of a checksum keeps its
value)."""


def _step(
    session: str, index: int, segment: int, prefix: int, *, boundary: str | None = None
) -> StepRecord:
    extra: dict[str, Any] = {"weight_version": "3"}
    if prefix == 0:
        extra["segment"] = {"flags": FLAGS, "tools": None, "chat_template_kwargs": {}}
    return StepRecord(
        session_id=session,
        step_index=index,
        segment_index=segment,
        prefix_length=prefix,
        prompt_delta_ids=[10 + index, 11 + index],
        output_ids=[70 + index, 71 + index],
        output_logprobs=[-0.5, -0.25],
        output_versions=[3, 3],
        finish_reason="tool_calls" if index % 2 == 0 else "stop",
        messages=[{"role": "user", "content": f"q{index}"}],
        started_at=1.0,
        ended_at=2.0,
        boundary_reason=boundary,
        request_id=f"r{index}",
        extra=extra,
    )


async def _fill(store: TrajectoryStore) -> None:
    """Four sessions, interleaved: a finalized one of two segments (and an options record), a
    finalized no-grad one, an open one, a discarded one; the log ends with a finalize."""
    await store.set_partial_rollout("alpha", True)
    await store.append_step(_step("alpha", 0, 0, 0))
    await store.append_step(_step("beta", 0, 0, 0))
    await store.append_step(_step("alpha", 1, 0, 4))
    await store.append_step(_step("gamma", 0, 0, 0))
    await store.append_step(_step("beta", 1, 0, 4))
    await store.append_step(_step("alpha", 2, 0, 8))
    await store.append_step(_step("alpha", 3, 1, 0, boundary="messages_removed"))
    await store.append_step(_step("delta", 0, 0, 0))
    await store.append_step(_step("alpha", 4, 1, 4))
    await store.discard("delta")
    await store.mark_no_grad("beta", "spanned 3 pauses")
    await store.finalize("alpha")
    await store.append_step(_step("gamma", 1, 0, 4))
    await store.finalize("beta")


def _export(
    store: TrajectoryStore, run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
) -> dict[str, dict[str, Any]]:
    """Everything the store exports, per session: the trajectory view, the rows of
    ``segments_table()``, then what finalizing every open session returns."""
    rows = store.segments_table().to_pylist()
    out: dict[str, dict[str, Any]] = {
        sid: {"trajectory": store.trajectory(sid), "rows": []} for sid in store.sessions
    }
    for row in rows:
        row["extra_info"] = json.loads(row.pop("extra_info_json"))
        row["messages"] = json.loads(row.pop("messages_json"))
        out[row["session_id"]]["rows"].append(row)

    async def finalize_open() -> None:
        for sid, record in store.sessions.items():
            if record.status != "discarded":
                out[sid]["final"] = [s.to_dict() for s in await store.finalize(sid)]

    run(finalize_open())
    return out


def _marked(segment: dict[str, Any]) -> bool:
    info = segment["extra_info"]
    return "store_damage" in info and bool(info.get(NO_GRAD_REASON))


def _intact(segment: dict[str, Any], before: dict[str, Any]) -> bool:
    """The same tokens, masks, log-probs, versions, messages and finish reason (the boundary
    reason may be unknown when the next segment's first step was lost)."""
    keys = ["tokens", "full_loss_mask", "full_logprobs", "full_versions", "prompt_length"]
    keys += ["messages", "finish_reason", "segment_index"]
    return all(segment[k] == before[k] for k in keys)


def _check_own(own: dict[str, Any], before: dict[str, Any]) -> None:
    """The damaged session: it says so, keeps its status, and what it still exports is what it
    had, or marked."""
    trajectory, was = own["trajectory"], before["trajectory"]
    assert trajectory["damage"], "a session charged with damage must say so"
    assert all(d["reason"] and d["record"] for d in trajectory["damage"])
    assert trajectory["status"] == was["status"]
    assert all(step in was["steps"] for step in trajectory["steps"])  # no step it did not have
    views = [(trajectory["segments"], was["segments"])]
    views += [(own.get(k, []), before.get(k, [])) for k in ("final", "rows")]
    for segments, old in views:
        by_index = {s["segment_index"]: s for s in old}
        for segment in segments:
            assert _marked(segment) or _intact(segment, by_index[segment["segment_index"]])


def _line_sessions(data: bytes) -> list[tuple[int, int, str]]:
    """(start, end, session id) of every line of an undamaged log."""
    out, start = [], 0
    for line in data.splitlines(keepends=True):
        out.append((start, start + len(line), json.loads(line[9:])["session_id"]))
        start += len(line)
    return out


@pytest.mark.unit
def test_a_flipped_byte_in_a_middle_step_costs_only_its_own_segment(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(_fill(store))
    store.close()
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    store = TrajectoryStore.open(tmp_path)
    before = _export(store)  # finalizes gamma: written after the bytes above were read
    store.close()
    start = data.index(b'"session_id":"alpha","step_index":1')  # in the middle of segment 0
    data[data.index(b'"extra":', start) + 12] ^= 0xFF
    log.write_bytes(bytes(data))

    store = TrajectoryStore.open(tmp_path)
    after = _export(store)  # no exception: each session exports on its own
    assert store.report.skipped_corrupt == 1 and store.report.unattributed == 0
    for sid in ("beta", "gamma", "delta"):
        assert after[sid] == before[sid]
    alpha = after["alpha"]
    (damage,) = alpha["trajectory"]["damage"]
    assert damage["record"] == "step" and damage["step_index"] == 1
    assert damage["segment_index"] == 0 and "does not read back" in damage["reason"]
    first, second = alpha["final"]
    assert _marked(first) and first["extra_info"][NO_GRAD_REASON].startswith("store_damaged")
    assert first["tokens"] == before["alpha"]["final"][0]["tokens"][:4]  # step 0 is kept
    assert first["extra_info"]["store_damage"]["first_lost_step"] == 1
    assert second == before["alpha"]["final"][1]  # the next segment is whole
    assert validate_table("segments", store.segments_table()).ok
    store.close()


@pytest.mark.unit
def test_a_lost_first_step_leaves_an_empty_marked_segment_that_validates(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(_fill(store))
    store.close()
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    data[data.index(b'"session_id":"alpha","step_index":3') + 45] ^= 0xFF  # segment 1's head
    log.write_bytes(bytes(data))
    store = TrajectoryStore.open(tmp_path)
    first, second = store.segments("alpha")
    assert "store_damage" not in first.extra_info and first.extra_info["num_steps"] == 3
    assert first.extra_info["boundary_reason"] == "unknown"  # the lost step said why
    assert second.tokens == [] and second.finish_reason == "abort"
    assert second.extra_info["store_damage"]["steps_kept"] == 0
    assert validate_table("segments", store.segments_table()).ok
    store.close()


@pytest.mark.unit
def test_a_log_without_identity_fields_still_charges_a_step_gap(tmp_path: Path) -> None:
    """Logs written before the identity fields: a damaged line names no session, but the step
    it held is missing from its session's steps, which is enough to mark its segment."""
    lines = []
    for step in (
        _step("a", 0, 0, 0),
        _step("a", 1, 0, 4),
        _step("a", 2, 0, 8),
        _step("b", 0, 0, 0),
    ):
        payload = json.dumps({"t": "step", **step.to_dict()}, separators=(",", ":")).encode()
        lines.append(b"%08x " % zlib.crc32(payload) + payload + b"\n")
    lines.append(
        b'%08x {"t":"finalized","session_id":"a"}\n'
        % zlib.crc32(b'{"t":"finalized","session_id":"a"}')
    )
    lines[1] = lines[1].replace(b'"q1"', b'"qX"')
    (tmp_path / LOG_NAME).write_bytes(b"".join(lines))
    store = TrajectoryStore.open(tmp_path)
    assert store.report.unattributed == 1 and store.report.records == 4
    (damage,) = store.sessions["a"].damage or []
    assert (damage.step_index, damage.known_from) == (1, "step_gap")
    (segment,) = store.segments("a")
    assert segment.tokens == _step("a", 0, 0, 0).prompt_delta_ids + [70, 71]
    assert segment.extra_info["store_damage"]["first_lost_step"] == 1
    assert store.sessions["b"].damage is None
    store.close()


@pytest.mark.unit
def test_a_record_that_stops_reading_back_while_open_is_charged(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(_fill(store))
    data = bytearray((tmp_path / LOG_NAME).read_bytes())
    at = data.index(b'"session_id":"beta","step_index":1')
    with open(tmp_path / LOG_NAME, "r+b") as f:  # damaged under the running store
        f.seek(at + 60)
        f.write(bytes([data[at + 60] ^ 0xFF]))
    view = store.trajectory("beta")
    assert [s["step_index"] for s in view["steps"]] == [0]
    (damage,) = view["damage"]
    assert (damage["step_index"], damage["known_from"]) == (1, "read_back")
    (segment,) = view["segments"]
    assert segment["extra_info"]["store_damage"]["first_lost_step"] == 1
    assert segment["extra_info"][NO_GRAD_REASON] == "spanned 3 pauses"  # the session's own
    store.close()


@pytest.mark.unit
def test_the_torn_tail_warning_says_only_what_is_known(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = TrajectoryStore.open(tmp_path)
    asyncio.run(store.append_step(_step("s1", 0, 0, 0)))
    asyncio.run(store.finalize("s1"))  # acknowledged: the finalize returned
    store.close()
    log = tmp_path / LOG_NAME
    log.write_bytes(log.read_bytes()[:-6])  # its record torn short
    caplog.set_level(logging.WARNING, logger="dressage.proxy.store")
    store = TrajectoryStore.open(tmp_path)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "never acknowledged" not in text
    assert "finalized record of session s1" in text and "not known" in text
    assert store.sessions["s1"].status == "finalized"  # what is known of it is kept
    store.close()

    log.write_bytes(log.read_bytes().rsplit(b"\n", 2)[0] + b"\n" + b"\x00" * 20)  # garbage
    caplog.clear()
    store = TrajectoryStore.open(tmp_path)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "never acknowledged" not in text and "name no session" in text
    assert store.report.torn_tail_bytes > 0
    store.close()


@pytest.mark.unit
def test_one_flipped_byte_at_every_offset_costs_at_most_its_own_session(tmp_path: Path) -> None:
    started, wall = time.process_time(), time.perf_counter()
    store = TrajectoryStore.open(tmp_path / "clean")
    asyncio.run(_fill(store))
    store.close()
    clean = (tmp_path / "clean" / LOG_NAME).read_bytes()
    copy = TrajectoryStore.open(tmp_path / "clean")
    baseline = _export(copy)  # finalizing gamma appends to this log, after `clean` was read
    copy.close()
    lines = _line_sessions(clean)
    work = tmp_path / "damaged"
    work.mkdir()
    damaged_max = charged = whole = 0
    loop = asyncio.new_event_loop()
    for offset in range(len(clean)):
        data = bytearray(clean)
        data[offset] ^= FLIPS[offset % len(FLIPS)]
        (work / LOG_NAME).unlink(missing_ok=True)  # a new file: cheaper than truncating one
        (work / LOG_NAME).write_bytes(bytes(data))
        own = next(sid for start, end, sid in lines if start <= offset < end)
        store = TrajectoryStore.open(work)
        try:
            after = _export(store, loop.run_until_complete)
            damaged = {sid for sid, r in store.sessions.items() if r.damage}
            report = store.report
        finally:
            store.close()
        assert damaged <= {own}, (offset, damaged)
        assert report.unattributed == 0 and report.torn_tail_bytes == 0, (offset, report)
        damaged_max = max(damaged_max, len(damaged))
        for sid, view in baseline.items():
            if sid != own:
                assert after[sid] == view, (offset, sid)
        if damaged:
            charged += 1
            _check_own(after[own], baseline[own])
        else:  # a damaged line end (or a hex digit's case): the records read back whole
            assert after[own] == baseline[own], offset
            whole += 1
    loop.close()
    cpu, wall = time.process_time() - started, time.perf_counter() - wall
    print(
        f"\nstore {len(clean)} bytes, {len(lines)} records; offsets tried {len(clean)}; "
        f"charged to their own session {charged}; read back whole {whole}; damaged "
        f"sessions per offset max {damaged_max}; exceptions 0; cpu {cpu:.1f} s, wall {wall:.1f} s"
    )
    assert damaged_max == 1 and charged + whole == len(clean)


# ------------------------------------------------------------------------------ over HTTP
ADMIN = "damage-admin-key"


@pytest.fixture
def damaged_store(tmp_path: Path, qwen35_tito: TITOTokenizer) -> Iterator[tuple[Path, Trajectory]]:
    """A store two agents wrote through the proxy (three calls of "long", two of "short"),
    with one byte of long's middle step flipped; yields it and short's trajectory before."""
    script = Script(qwen35_tito, "a\n</think>\n\nOne.<|im_end|>")
    with (
        scripted_proxy(script, tmp_path, qwen35_tito, admin_key=ADMIN) as (url, _),
        SyncProxyClient(url, admin_key=ADMIN) as client,
    ):
        for session, calls in (("long", 3), ("short", 2)):
            messages: list[dict[str, Any]] = []
            for k in range(calls):
                messages.append({"role": "user", "content": f"Question {k}?"})
                answer = client.chat_completions(session, messages, max_tokens=16)
                messages.append(answer["choices"][0]["message"])
        short = client.read_trajectory("short")
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    start = data.index(b'"session_id":"long","step_index":1')
    data[data.index(b'"output_ids":[', start) + 15] ^= 0xFF  # a token id of long#1
    log.write_bytes(bytes(data))
    yield tmp_path, short


@pytest.mark.integration
def test_a_damaged_store_answers_200_and_reports_the_damage(
    damaged_store: tuple[Path, Trajectory], qwen35_tito: TITOTokenizer
) -> None:
    store, short_before = damaged_store
    script = Script(qwen35_tito, "b\n</think>\n\nTwo.<|im_end|>")
    with (
        scripted_proxy(script, store, qwen35_tito, admin_key=ADMIN) as (url, _),
        SyncProxyClient(url, admin_key=ADMIN) as client,
    ):
        (segment,) = client.finalize_session("long")  # a 500 raises ProxyClientError
        assert segment.extra_info["store_damage"]["first_lost_step"] == 1
        assert segment.extra_info[NO_GRAD_REASON].startswith("store_damaged")
        assert segment.finish_reason == "abort"  # its end is lost with step 1
        long = client.read_trajectory("long")
        (damage,) = long.damage
        assert (damage["record"], damage["step_index"]) == ("step", 1)
        assert [s.step_index for s in long.steps] == [0, 2]
        assert long.status == "finalized" and long.segments == [segment]
        assert client.read_trajectory("short") == short_before
        assert len(client.finalize_session("short")) == 1
        stats = client.stats()["store"]
        assert stats["skipped_corrupt"] == 1 and stats["damaged_sessions"] == 1
