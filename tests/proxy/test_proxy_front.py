"""``dressage-proxy --workers N``: the front routes sessions to one worker each, fans control out.

The unit tests check the hash, the store-layout refusal, the combining rules and where a request
finds its session. The integration tests start the scripted engine and a front with 2 workers as
processes (as a user runs them): a session's records land in one worker's store, streamed answers
pass through, pause reaches both workers, control routes still need the admin key, a worker
killed with ``kill -9`` comes back with its records while the other worker's sessions go on, and
``kill -9`` of the front leaves no worker behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dressage.proxy.front import session_of
from dressage.proxy.front_combine import combine
from dressage.proxy.front_http import BadRequest, parse_request
from dressage.proxy.server import READY_PREFIX
from dressage.proxy.workers import store_layout_error, worker_of
from tests.helpers import REPO, stop

ADMIN = "front-admin-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8}


# ------------------------------------------------------------------------------------ units
def test_the_hash_is_stable_and_spreads() -> None:
    assert [worker_of(f"s{i}", 4) for i in range(8)] == [worker_of(f"s{i}", 4) for i in range(8)]
    counts = [sum(worker_of(f"session-{i}", 4) == k for i in range(4000)) for k in range(4)]
    assert min(counts) > 800, counts


def test_a_store_written_with_another_count_is_refused(tmp_path: Path) -> None:
    assert store_layout_error(tmp_path, 3) is None  # a new folder takes any count
    (tmp_path / "workers.json").write_text('{"workers": 2}')
    assert store_layout_error(tmp_path, 2) is None
    refusal = store_layout_error(tmp_path, 3)
    assert refusal is not None and "--workers 2" in refusal
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "trajectory.log").write_text("")
    assert "--workers 1" in (store_layout_error(lone, 2) or "")


def test_combined_answers_pause_only_when_every_worker_is() -> None:
    a = {"paused": True, "in_flight": 2, "weight_version": 3, "latency_s": 0.1, "reason": "r"}
    b = {"paused": False, "in_flight": 1, "weight_version": 3, "latency_s": 0.3, "reason": "r"}
    merged = combine([a, b])
    assert merged["paused"] is False and merged["in_flight"] == 3
    assert merged["weight_version"] == 3 and merged["latency_s"] == 0.3
    assert merged["reason"] == "r" and merged["workers"] == [a, b]
    assert combine([a, {**b, "paused": True}])["paused"] is True


@pytest.mark.parametrize(
    ("head", "session"),
    [
        (b"POST /sessions/abc/v1/chat/completions HTTP/1.1\r\n\r\n", "abc"),
        (b"POST /sessions/a%20b/v1/chat/completions HTTP/1.1\r\nx-session-id: z\r\n\r\n", "a b"),
        (b"POST /v1/sessions/xyz/finalize HTTP/1.1\r\n\r\n", "xyz"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nX-Dressage-Session-Id: h\r\n\r\n", "h"),
        (b"GET /v1/models HTTP/1.1\r\n\r\n", None),
    ],
)
def test_the_session_is_read_from_the_head(head: bytes, session: str | None) -> None:
    assert session_of(parse_request(head)) == session


def test_ambiguous_framing_is_refused() -> None:
    with pytest.raises(BadRequest, match="Transfer-Encoding"):
        parse_request(
            b"POST /v1/x HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"
        )


# ------------------------------------------------------------------------------ integration
def _ready(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    raise AssertionError(f"{proc.args!r} exited with {proc.wait(30)} before it was ready")


@pytest.fixture(scope="module")
def scripted_engine(
    tmp_path_factory: pytest.TempPathFactory, qwen35_tokenizer: Any
) -> Iterator[str]:
    output = tmp_path_factory.mktemp("engine") / "output_ids.json"
    ids = qwen35_tokenizer.encode("Hello there, agent.<|im_end|>", add_special_tokens=False)
    output.write_text(json.dumps(ids))
    argv = [sys.executable, "-m", "dressage.proxy.testing", "--output-file", str(output)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        yield _ready(proc, "SCRIPTED_ENGINE_URL=")
    finally:
        stop(proc)


class Front:
    def __init__(self, proc: subprocess.Popen[str], url: str, store: Path, stderr: Path) -> None:
        self.proc, self.url, self.store, self.stderr = proc, url, store, stderr

    def workers(self) -> dict[int, int]:
        """Worker index -> pid, from the front's children."""
        found = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"--index" in argv:
                    found[int(argv[argv.index(b"--index") + 1])] = int(pid)
        return found

    def chat(self, session: str, **extra: Any) -> httpx.Response:
        url = f"{self.url}/sessions/{session}/v1/chat/completions"
        return httpx.post(url, json={**CHAT, **extra}, timeout=60)


@pytest.fixture(scope="module")
def front(scripted_engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("front")
    store, stderr = tmp / "store", tmp / "front.err"
    argv = [sys.executable, "-m", "dressage.proxy.server", "--engine-url", scripted_engine]
    argv += ["--port", "0", "--store-dir", str(store), "--admin-key", ADMIN, "--workers", "2"]
    with stderr.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
    try:
        yield Front(proc, _ready(proc, READY_PREFIX), store, stderr)
    finally:
        stop(proc)


def _log_of(front: Front, worker: int) -> str:
    return (front.store / f"worker-{worker}" / "trajectory.log").read_text()


def test_a_sessions_calls_land_in_its_workers_store(front: Front) -> None:
    sessions = [f"affinity-{i}-x" for i in range(6)]
    for session in sessions:
        assert front.chat(session).status_code == 200
        url = f"{front.url}/v1/chat/completions"
        headers = {"x-session-id": session}
        assert httpx.post(url, json=CHAT, headers=headers, timeout=60).status_code == 200
    for session in sessions:
        home = worker_of(session, 2)
        assert _log_of(front, home).count(f'"{session}"') >= 2
        assert f'"{session}"' not in _log_of(front, 1 - home)
        trajectory = httpx.get(f"{front.url}/v1/sessions/{session}/trajectory", headers=AUTH)
        assert len(trajectory.json()["steps"]) == 2


def test_a_streamed_answer_passes_through(front: Front) -> None:
    url = f"{front.url}/sessions/streamed/v1/chat/completions"
    with httpx.stream("POST", url, json={**CHAT, "stream": True}, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(response.iter_raw())
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and len(events) > 3
    deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in events[:-1]]
    text = "".join((d.get("reasoning_content") or "") + (d.get("content") or "") for d in deltas)
    assert "Hello there, agent." in text


def test_control_routes_need_the_admin_key_through_the_front(front: Front) -> None:
    for method, path in [
        ("POST", "/v1/rollout/pause"),
        ("POST", "/v1/rollout/resume"),
        ("GET", "/v1/rollout/pause_state"),
        ("GET", "/v1/stats"),
        ("GET", "/v1/sessions/anyone/trajectory"),
        ("POST", "/v1/sessions/anyone/finalize"),
    ]:
        response = httpx.request(method, f"{front.url}{path}", timeout=30)
        assert response.status_code == 401, (path, response.text)


def test_pause_and_resume_reach_every_worker(front: Front) -> None:
    paused = httpx.post(f"{front.url}/v1/rollout/pause", json={"reason": "t"}, headers=AUTH)
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and len(paused.json()["workers"]) == 2
    state = httpx.get(f"{front.url}/v1/rollout/pause_state", headers=AUTH).json()
    assert [w["paused"] for w in state["workers"]] == [True, True] and state["paused"] is True
    resumed = httpx.post(f"{front.url}/v1/rollout/resume", json={}, headers=AUTH).json()
    assert resumed["resumed"] is True
    state = httpx.get(f"{front.url}/v1/rollout/pause_state", headers=AUTH).json()
    assert [w["paused"] for w in state["workers"]] == [False, False]
    homes = {worker_of(f"stats-{i}", 2): f"stats-{i}" for i in range(16)}
    for session in homes.values():  # a call on each worker, whatever ran before
        assert front.chat(session).status_code == 200
    stats = httpx.get(f"{front.url}/v1/stats", headers=AUTH).json()
    per_worker = [w["counters"].get("calls", 0) for w in stats["workers"]]
    assert min(per_worker) >= 1 and stats["counters"]["calls"] == sum(per_worker)
    assert {w["store"]["path"] for w in stats["workers"]} == {
        str(front.store / f"worker-{k}" / "trajectory.log") for k in (0, 1)
    }


def _wait_ready(front: Front) -> None:
    deadline = time.monotonic() + 120
    while httpx.get(f"{front.url}/ready", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the killed worker did not come back"
        time.sleep(0.5)


def _steps(front: Front, session: str) -> list[Any]:
    url = f"{front.url}/v1/sessions/{session}/trajectory"
    return list(httpx.get(url, headers=AUTH, timeout=30).json()["steps"])


def test_a_killed_worker_comes_back_with_its_records(front: Front) -> None:
    victim = "victim-0"
    home = worker_of(victim, 2)
    other = next(f"other-{i}" for i in range(99) if worker_of(f"other-{i}", 2) != home)
    for session in (victim, other):
        assert front.chat(session).status_code == 200
    before = _steps(front, victim)
    os.kill(front.workers()[home], signal.SIGKILL)
    assert front.chat(other).status_code == 200  # the other worker serves on meanwhile
    _wait_ready(front)
    assert _steps(front, victim) == before and len(before) == 1  # acknowledged: replayed
    assert front.chat(victim).status_code == 200
    assert len(_steps(front, victim)) == 2
    assert "restarted as pid" in front.stderr.read_text()


def test_a_worker_restarted_during_a_pause_comes_back_paused(front: Front) -> None:
    home = worker_of("victim-0", 2)
    paused = httpx.post(f"{front.url}/v1/rollout/pause", json={"mode": "retract"}, headers=AUTH)
    assert paused.status_code == 200, paused.text
    os.kill(front.workers()[home], signal.SIGKILL)
    state = httpx.get(f"{front.url}/v1/rollout/pause_state", headers=AUTH)
    assert state.status_code == 503 and state.json()["worker"] == home
    _wait_ready(front)
    state = httpx.get(f"{front.url}/v1/rollout/pause_state", headers=AUTH).json()
    assert [w["paused"] for w in state["workers"]] == [True, True] and state["paused"] is True
    resumed = httpx.post(f"{front.url}/v1/rollout/resume", json={}, headers=AUTH)
    assert resumed.status_code == 200 and resumed.json()["resumed"] is True
    assert front.chat("victim-0").status_code == 200


def test_kill_9_of_the_front_leaves_no_worker(front: Front) -> None:
    pids = list(front.workers().values())
    assert len(pids) == 2
    front.proc.kill()
    front.proc.wait(30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "a worker outlived its front"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_another_worker_count_on_the_same_store_is_refused(
    front: Front, scripted_engine: str
) -> None:
    for workers in ("3", "1"):
        argv = [sys.executable, "-m", "dressage.proxy.server", "--engine-url", scripted_engine]
        argv += ["--port", "0", "--store-dir", str(front.store), "--workers", workers]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
        assert done.returncode == 2
        assert "start with --workers 2" in done.stderr, done.stderr


# ------------------------------------------------------------- the splice, against a fake worker
async def _front_before(handler: Any) -> tuple[Any, Any, str, int]:
    """A Front over one fake worker served by ``handler``; its server and port."""
    import asyncio

    from dressage.config.proxy import ProxyConfig
    from dressage.proxy.front import Front as FrontProcess
    from dressage.proxy.workers import Worker

    fake = await asyncio.start_server(handler, "127.0.0.1", 0)
    worker = Worker(0, [])
    worker.port = fake.sockets[0].getsockname()[1]
    worker.url = f"http://127.0.0.1:{worker.port}"
    front = FrontProcess(ProxyConfig(), [worker])
    server = await asyncio.get_running_loop().create_server(front.protocol, "127.0.0.1", 0)
    return fake, server, worker.url, server.sockets[0].getsockname()[1]


def test_a_chunked_answer_passes_byte_for_byte_and_keep_alive_holds() -> None:
    import asyncio

    answer = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n"
        b"\r\n5;ext=1\r\ndata:\r\n0C\r\n: keep-alive\r\n0\r\nx-trailer: 1\r\n\r\n"
    )
    seen: list[bytes] = []

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            seen.append(head + await reader.readexactly(4))
            writer.write(answer)

    async def main() -> None:
        fake, server, _, port = await _front_before(worker)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"POST /sessions/s/v1/x HTTP/1.1\r\nhost: h\r\ncontent-length: 4\r\n\r\nbody"
        for _ in range(2):  # one connection, two requests
            writer.write(request)
            got = await asyncio.wait_for(reader.readexactly(len(answer)), 10)
            assert got == answer
        # the worker gets the request as sent, its head ending with the client's address
        forwarded = request.replace(b"\r\n\r\n", b"\r\nx-forwarded-for: 127.0.0.1\r\n\r\n")
        assert seen == [forwarded, forwarded]
        writer.close()
        server.close()
        fake.close()

    asyncio.run(main())


def test_a_client_that_hangs_up_closes_the_worker_connection() -> None:
    import asyncio

    closed = asyncio.Event()

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # then never answers, as a long call
        await reader.read()  # returns at EOF: the front closed the connection
        closed.set()

    async def main() -> None:
        fake, server, _, port = await _front_before(worker)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /sessions/s/v1/models HTTP/1.1\r\nhost: h\r\n\r\n")
        await asyncio.sleep(0.2)
        writer.close()
        await asyncio.wait_for(closed.wait(), 10)
        server.close()
        fake.close()

    asyncio.run(main())


def test_sigint_stops_the_front_and_every_worker(scripted_engine: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "dressage.proxy.server", "--engine-url", scripted_engine]
    argv += ["--port", "0", "--store-dir", str(tmp_path / "store"), "--workers", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        url = _ready(proc, READY_PREFIX)
        started = Front(proc, url, tmp_path / "store", tmp_path / "none")
        pids = list(started.workers().values())
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not any(_alive(pid) for pid in pids)
    finally:
        stop(proc)
