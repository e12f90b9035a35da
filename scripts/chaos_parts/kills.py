"""Parts 1 and 2: ``kill -9`` of the proxy under live sessions, then damage in a store copy.

Part 1: agents on the real ``openai`` SDK (one thread each, multi-turn, every third call
streamed) talk to one proxy while it is killed and restarted on the same port and store, round
after round. A call counts as answered once the SDK returned it (for a stream: its finish
reason came); its completion id is the ``request_id`` of the step the proxy stored before it
answered. After each restart every answered id must be among the stored steps exactly once,
and every session must be answered again (it goes on after the restart). A failed call is made
again with the same messages, as an agent retrying would.

Part 2: a copy of part 1's store gets one flipped byte (a digit of an output id of a step in
the middle of a segment: the first such step, in session order) and a torn tail (the last
record cut in half, as a crash mid-write leaves it); a proxy started on the copy must report
both, answer 200 on every session's trajectory and finalize, charge the flipped step to its
own session only, and give every other session the segments it had.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai

from dressage.proxy.store import LOG_NAME

from .services import Service, Services

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


class StreamCut(Exception):
    """A stream that ended without a finish reason and without an error."""


ERRORS = (openai.APIError, httpx.HTTPError, StreamCut)
"""What a call may raise: the SDK's errors, httpx's from inside a stream being read, or a stream
that just stopped."""


def error_kind(exc: BaseException) -> str:
    """``HTTP 503``, ``timeout``, or the transport error's class (``ReadError``, ...)."""
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError) and exc.__cause__ is not None:
        return type(exc.__cause__).__name__
    return type(exc).__name__


class Agent:
    """One session's agent thread; what it was answered, and when."""

    def __init__(self, url: str, session: str) -> None:
        self.session = session
        self.client = openai.OpenAI(
            base_url=f"{url}/sessions/{session}/v1", api_key="unused", max_retries=0, timeout=60
        )
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": f"Hi, {session}."}]
        self.calls = 0
        self.refused = 0  # connections refused: the proxy was down, no call was made
        self.answered: list[str] = []
        self.answered_at: list[float] = []
        self.errors: Counter[str] = Counter()
        self.busy = False
        self.rng = random.Random(session)

    def run(self, stop: threading.Event, deadline: float) -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            self.calls += 1
            self.busy = True
            try:
                message, completion_id = self._call(stream=self.calls % 3 == 0)
            except ERRORS as exc:  # the proxy is down or just died: the same call, a bit later
                kind = error_kind(exc)
                if kind == "ConnectError":
                    self.calls, self.refused = self.calls - 1, self.refused + 1
                else:
                    self.errors[kind] += 1
                stop.wait(0.2)
                continue
            finally:
                self.busy = False
            self.answered.append(completion_id)
            self.answered_at.append(time.monotonic())
            self.messages += [message, {"role": "user", "content": f"Go on ({self.calls})."}]
        self.client.close()

    def _call(self, *, stream: bool) -> tuple[dict[str, Any], str]:
        options: dict[str, Any] = {
            "model": "dressage",
            "messages": self.messages,
            "max_tokens": self.rng.randint(4, 12),
            "extra_body": NO_THINK,
        }
        if not stream:
            answer = self.client.chat.completions.create(**options)
            return answer.choices[0].message.model_dump(exclude_none=True), answer.id
        text, completion_id, finish = [], "", None
        for chunk in self.client.chat.completions.create(stream=True, **options):
            completion_id = chunk.id
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        if finish is None:
            raise StreamCut(f"session {self.session}: the stream ended without a finish reason")
        return {"role": "assistant", "content": "".join(text)}, completion_id


def check_store(services: Services, url: str, agents: list[Agent]) -> dict[str, Any]:
    """Every answered call's step stored exactly once (the answers are read first: anything
    answered is stored by then). ``unanswered_steps``: stored steps no agent saw answered (while
    agents run, also calls answered after their answers were read)."""
    answered = {cid for agent in agents for cid in list(agent.answered)}
    stored: Counter[str] = Counter()
    same_index = 0
    boundaries: Counter[str] = Counter()
    for agent in agents:
        response = services.admin(url, "GET", f"/v1/sessions/{agent.session}/trajectory")
        if response.status_code == 404:
            continue  # nothing stored yet
        response.raise_for_status()
        steps = response.json()["steps"]
        indexes = Counter(step["step_index"] for step in steps)
        same_index += sum(n - 1 for n in indexes.values())
        stored.update(step["request_id"] for step in steps)
        boundaries.update(str(step["boundary_reason"]) for step in steps if step["boundary_reason"])
    return {
        "answered": len(answered),
        "steps_stored": sum(stored.values()),
        "lost": sum(1 for cid in answered if stored[cid] == 0),
        "duplicated": sum(n - 1 for n in stored.values()) + same_index,
        "unanswered_steps": sum(1 for cid in stored if cid not in answered),
        "segment_starts": dict(boundaries),
    }


def _wait_all_answered_since(
    agents: list[Agent], since: float, least_s: float, *, times: int = 1
) -> int:
    """Until every agent was answered ``times`` times after ``since`` (and ``least_s``
    passed); bounded. Returns how many agents were answered at least once since."""

    def answered(agent: Agent) -> int:
        return sum(at > since for at in agent.answered_at[-times:])

    deadline = since + least_s + 90
    while time.monotonic() < deadline:
        if time.monotonic() >= since + least_s and all(answered(a) == times for a in agents):
            break
        time.sleep(0.05)
    return sum(answered(agent) > 0 for agent in agents)


def kill_rounds(
    services: Services, proxy: Service, *, sessions: int, rounds: int, round_s: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Part 1 on a started ``proxy`` (left running, on the same store). Returns the figures
    and each session's finalized segments."""
    agents = [Agent(proxy.url, f"kill-{i:02d}") for i in range(sessions)]
    stop = threading.Event()
    threads = [threading.Thread(target=a.run, args=(stop, time.monotonic() + 900)) for a in agents]
    figures: list[dict[str, Any]] = []
    try:
        for thread in threads:
            thread.start()
        since = time.monotonic()
        for _ in range(rounds):
            continued = _wait_all_answered_since(agents, since, round_s)
            check = check_store(services, proxy.url, agents)
            in_flight = sum(agent.busy for agent in agents)
            proxy.kill9()
            restart_s = proxy.start()
            since = time.monotonic()
            figures.append(
                {
                    "sessions_answered_before_kill": continued,
                    "in_flight": in_flight,
                    "restart_s": round(restart_s, 2),
                    **check,
                }
            )
        # three answers each: every session ends with a segment that has a middle (part 2)
        continued = _wait_all_answered_since(agents, since, round_s, times=3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    final = check_store(services, proxy.url, agents)
    segments = {a.session: _finalize(services, proxy.url, a.session) for a in agents}
    errors: Counter[str] = sum((a.errors for a in agents), Counter())
    return (
        {
            "sessions": sessions,
            "rounds": rounds,
            "calls": sum(a.calls for a in agents),
            "answered": final["answered"],
            "failed_calls": dict(errors),
            "connections_refused_while_down": sum(a.refused for a in agents),
            "steps_stored": final["steps_stored"],
            # the worst check: a lost or doubled record stays so in an append-only log
            "lost": max(r["lost"] for r in [*figures, final]),
            "duplicated": max(r["duplicated"] for r in [*figures, final]),
            "unanswered_steps": final["unanswered_steps"],
            "segment_starts": final["segment_starts"],
            "sessions_continued_after_last_restart": continued,
            "finalized_200": sum(1 for s in segments.values() if s is not None),
            "per_round": figures,
        },
        segments,
    )


def _finalize(services: Services, url: str, session: str) -> Any:
    response = services.admin(url, "POST", f"/v1/sessions/{session}/finalize")
    return response.json()["segments"] if response.status_code == 200 else None


def _middle_step(log: bytes) -> tuple[str, int, int, int]:
    """(session, step index, segment index, byte offset) of the first step record, in session
    order, with a step of its segment before it and one after it."""
    steps: dict[str, list[tuple[int, int, int]]] = {}
    offset = 0
    for line in log.splitlines(keepends=True):
        record = json.loads(line[9:])
        if record["t"] == "step":
            steps.setdefault(record["session_id"], []).append(
                (record["step_index"], record["segment_index"], offset)
            )
        offset += len(line)
    for session, records in sorted(steps.items()):
        triples = zip(records, records[1:], records[2:], strict=False)
        for before, (index, segment, at), after in triples:
            if before[1] == segment == after[1]:
                return session, index, segment, at
    raise RuntimeError("no session has a segment of three steps to damage in the middle")


def damage_copy(store: Path, copy: Path) -> dict[str, Any]:
    """Part 2, first half: flip one byte and tear the tail in a copy of ``store``; says where."""
    shutil.copytree(store, copy)
    log = copy / LOG_NAME
    data = bytearray(log.read_bytes())
    victim, step, segment, start = _middle_step(bytes(data))
    offset = data.index(b'"output_ids":[', start) + len(b'"output_ids":[') + 1
    data[offset] ^= 0x01  # a digit stays a digit: valid JSON, a wrong token id, a bad checksum
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    torn = json.loads(last[9:])
    cut = len(last) // 2 + 1
    log.write_bytes(bytes(data[:-cut]))
    return {
        "flipped": {"session": victim, "step_index": step, "segment_index": segment,
                    "byte": offset},
        "torn": {"record": torn.get("t"), "session": torn.get("session_id"), "bytes_cut": cut},
    }  # fmt: skip


def check_damaged(
    services: Services, proxy: Service, damage: dict[str, Any], before: dict[str, Any]
) -> dict[str, Any]:
    """Part 2, second half: ``proxy`` (launched on the damaged copy) starts, reports the damage,
    exports every session with 200, and every session but the flipped one as ``before``."""
    victim, step = damage["flipped"]["session"], damage["flipped"]["step_index"]
    start_s = proxy.wait_ready()
    stats = services.admin(proxy.url, "GET", "/v1/stats").json()["store"]
    statuses: Counter[int] = Counter()
    intact, others, own = 0, 0, None
    for session, segments in sorted(before.items()):
        trajectory = services.admin(proxy.url, "GET", f"/v1/sessions/{session}/trajectory")
        final = services.admin(proxy.url, "POST", f"/v1/sessions/{session}/finalize")
        statuses.update((trajectory.status_code, final.status_code))
        after = final.json().get("segments") if final.status_code == 200 else None
        if session == victim:
            own = {
                "damage": trajectory.json().get("damage"),
                "marked_segments": [
                    s["segment_index"] for s in after or [] if "store_damage" in s["extra_info"]
                ],
            }
        else:
            others += 1
            intact += after == segments
    warnings = [line for line in proxy.log_text().splitlines() if "dressage.proxy.store" in line]
    torn_named = f"session {damage['torn']['session']}"
    return {
        **damage,
        "proxy_started": True,
        "proxy_start_s": round(start_s, 2),
        "store_report": {
            k: stats[k]
            for k in ("skipped_corrupt", "torn_tail_bytes", "damaged_sessions", "unattributed")
        },
        "exports": sum(statuses.values()),
        "exports_200": statuses[200],
        "torn_reported": stats["torn_tail_bytes"] > 0
        or any(torn_named in w and "last record" in w for w in warnings),
        "flipped_charged": bool(own and any(d["step_index"] == step for d in own["damage"] or [])),
        "other_sessions": others,
        "other_sessions_intact": intact,
        "damaged_session": own,
        "warnings": [w.split("dressage.proxy.store ", 1)[-1][:400] for w in warnings],
    }
