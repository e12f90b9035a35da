"""What the recording proxy costs: added latency and calls/s against calling the engine directly.

The engine is a scripted SGLang server that answers ``/generate`` at once (a Qwen3.5 output with
reasoning, text and a tool call, real tokenizer ids), so only the proxy's own cost is measured.
Agents are multi-turn: tools on every call, the history growing each turn (the model's tool call
plus a ~150-token tool result), 8 turns, then the session is finalized and a new one starts.
Three processes: the proxy pinned to core 0; the load generator and the engine pinned to core 1.
``direct`` runs send the same conversations as token ids straight to the engine: that is the
harness's own ceiling. Then idle memory: a fresh proxy holds 1000 idle 3-turn sessions, twice
(short and long tool results); the per-session cost is the intercept of RSS against tokens.

Streaming: the same sessions with ``stream: true`` against ``stream: false`` on one proxy (whole,
streamed, whole, streamed), at 16 sessions; the scripted engine streams one cumulative chunk per
output token (SGLang's default), so the proxy's added CPU per chunk is (CPU per streamed call - CPU
per whole call) / chunks per call. ``--stream-coalesce-ms MS`` and ``--stream-incremental`` measure,
in the same run, the proxy with its chunks gathered for MS, and an engine that sends each chunk's
new tokens only (SGLang's ``--incremental-streaming-output``). With ``--before REF``, that
commit's proxy runs beside this one in each of them, the two driven in turn, run for run.

RSS over a long run: a fresh proxy under 256 sessions (finalized after 8 turns, new ones
starting) for ``--rss-seconds``, its RSS sampled every ``--rss-interval`` s; it levels off when
the last half grew at most a quarter of what the first half grew, or at most 2% of the RSS
(judged from 120 s on: the default 20 s run only shows the curve, the heap still filling).

    python bench/proxy.py          # about 4 minutes on 2 cores; the last line is the JSON summary
    python bench/proxy.py --parts rss --rss-seconds 600 --rss-interval 5   # the 10-minute run
    python bench/proxy.py --parts workers   # 256 sessions through 1, 2, 4 proxy processes
    python bench/proxy.py --parts cpu_ab --before 3d852fc   # CPU per call against a commit
    python bench/proxy.py --parts stream --before e5805dd   # streaming, beside that commit's
    python bench/proxy.py --parts stream --stream-answer-tokens 1000 --stream-seconds 6 \
        --before c006d20    # streaming 1,000-token answers (their reasoning lengthened)
    python bench/proxy.py --parts stream --stream-coalesce-ms 20 --stream-incremental

CPU per call against another commit (``--parts cpu_ab --before REF``, about 4 minutes): that
commit's proxy (``git archive`` into a temporary folder, run with this interpreter) and this one,
side by side on core 0, driven in turn at 1, 64 and 256 sessions, 3 runs each; the medians, and
their ratio against the issue's target of a fifth.

Several processes (``--parts workers``, about 2 minutes): calls/s at 256 sessions through a plain
proxy and through ``dressage-proxy --workers N`` (a front and N workers) for N = 2, 4, against
the direct ceiling, and the front's own CPU per call. None of the proxy processes is pinned (the
harness and engine stay on core 1), so on 2 cores the figure says what the front costs more than
what N processes gain: the scaling needs a core per worker.

Targets: added p50 <= 2 ms at 1 session; calls/s at 256 sessions >= at 1 session; >= 600
calls/s through the proxy at 256 sessions, or >= 90% of the direct ceiling where the harness
cannot drive 600; idle memory per session <= 50 KB plus its tokens (``met``). Reported beside,
each with its own verdict: added CPU per streamed chunk <= 20 us (``stream_met``), idle memory
per session <= 8.3 KB plus its tokens (``idle_issue_met``), RSS levels off (``rss_levels_off``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dressage.proxy.http1 import HTTP1Pool
from dressage.proxy.tito import create_tito_tokenizer

REPO = Path(__file__).resolve().parents[1]
LEVELS = (1, 64, 256)
TURNS = 8
RUN_SECONDS = 8.0
WARMUP_SECONDS = 1.5
IDLE_SESSIONS = 1000
STREAM_SESSIONS = 16
STREAM_SECONDS = 4.0
STREAM_CHUNK_TARGET_US = 20.0
STREAM_INTERVAL_MS = 2.0
"""The streaming engine's time between two chunks (SGLang's decode step at a few hundred tokens a
second per request)."""
RSS_SESSIONS = 256
RSS_SECONDS = 20.0
RSS_JUDGED_SECONDS = 120.0
"""Shorter runs report the curve but no verdict: the heap fills for about the first minute."""
IDLE_ISSUE_TARGET_KB = 8.3
PARTS = ("throughput", "stream", "idle", "rss", "workers", "cpu_ab")
AB_TARGET_RATIO = 0.2
"""``--parts cpu_ab``: the issue's target, CPU per call at most a fifth of the starting commit's."""
AB_ROUNDS = 3
DEFAULT_PARTS = ("throughput", "stream", "idle", "rss")
WORKER_COUNTS = (1, 2, 4)
"""``--parts workers``: proxy process counts measured at 256 sessions (1: the plain proxy, no
front; more: ``--workers N``, a front and N workers)."""
ADMIN_KEY = "bench-admin-key"
WORDS = "INFO WARN request served cache miss retry timeout worker shard def return".split()

SYSTEM = (
    "You are a careful coding agent working in a Python repository. Read files before you "
    "change them, run the tests after every change, and explain what you did. " * 6
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ').capitalize()} in the repository workspace.",
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"The {arg}."}},
                "required": [arg],
            },
        },
    }
    for name, arg in (
        ("read_file", "path"),
        ("run", "cmd"),
        ("write_file", "path"),
        ("search", "query"),
    )
]
OUTPUT_TEXT = (
    "The failing test imports the parser module; I should read it first.\n</think>\n\n"
    "Let me look at the parser.\n\n<tool_call>\n<function=read_file>\n<parameter=path>\n"
    "src/parser.py\n</parameter>\n</function>\n</tool_call><|im_end|>"
)


def _long_answer(tokenizer: Any, tokens: int) -> list[int]:
    """The bench's answer with its reasoning lengthened to about ``tokens`` tokens in all."""
    step = "Then I check the next caller of the parser and what it passes in. "
    reasoning = ""
    while len(tokenizer.encode(reasoning + OUTPUT_TEXT, add_special_tokens=False)) < tokens:
        reasoning += step
    return list(tokenizer.encode(reasoning + OUTPUT_TEXT, add_special_tokens=False))


def _tool_result(rng: random.Random, lines: int) -> str:
    return "\n".join(
        f"{i:03d} {' '.join(rng.choices(WORDS, k=7))} id={rng.randint(0, 9999)}"
        for i in range(lines)
    )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------------------ load generator
class Agent:
    """One simulated agent: its message history as cached JSON fragments (so the harness does
    not re-serialise the history each turn)."""

    def __init__(
        self, sid: str, rng: random.Random, result_lines: int, max_tokens: int = 256
    ) -> None:
        self.sid = sid
        self.max_tokens = b"%d" % max_tokens
        self.rng = rng
        self.result_lines = result_lines
        self.parts = [
            json.dumps({"role": "system", "content": SYSTEM}).encode(),
            json.dumps({"role": "user", "content": "Fix the failing parser test."}).encode(),
        ]

    def body(self, tools_json: bytes, stream: bool = False) -> bytes:
        return (
            b'{"model":"bench","max_tokens":'
            + self.max_tokens
            + b',"temperature":1.0,'
            + (b'"stream":true,' if stream else b"")
            + b'"tools":'
            + tools_json
            + b',"messages":['
            + b",".join(self.parts)
            + b"]}"
        )

    def answer(self, response: dict[str, Any]) -> None:
        self.answer_message(response["choices"][0]["message"])

    def answer_message(self, message: dict[str, Any]) -> None:
        self.parts.append(json.dumps(message).encode())
        for call in message.get("tool_calls") or ():
            result = {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": _tool_result(self.rng, self.result_lines),
            }
            self.parts.append(json.dumps(result).encode())


def sse_message(raw: bytes) -> tuple[dict[str, Any], int]:
    """The assistant message an agent builds from the proxy's SSE chunks (as the OpenAI SDK's
    stream helpers accumulate it), and how many chunks carried a delta."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    chunks = 0
    for event in raw.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        payload = event[6:]
        if payload == b"[DONE]":
            break
        data = json.loads(payload)
        if "error" in data:
            raise RuntimeError(f"stream failed: {data['error']}")
        for choice in data["choices"]:
            delta = choice["delta"]
            chunks += 1
            reasoning.append(delta.get("reasoning_content") or "")
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or ():
                calls.append({k: v for k, v in call.items() if k != "index"})
    text = "".join(content)
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message, chunks


class DirectAgent:
    """The same conversation as token ids sent straight to ``/generate``."""

    def __init__(
        self, rng: random.Random, prompt_len: int, turn_len: int, output_ids: list[int]
    ) -> None:
        self.rng = rng
        self.turn_len = turn_len
        self.ids = "".join(f"{rng.randint(0, 200000)}," for _ in range(prompt_len)).encode()
        self.output = "".join(f"{i}," for i in output_ids).encode()
        self.turn = 0

    def body(self) -> bytes:
        self.turn += 1
        return (
            b'{"input_ids":['
            + self.ids[:-1]
            + b'],"sampling_params":{"max_new_tokens":256,"temperature":1.0,'
            + b'"stop_token_ids":[248046,248044]},"return_logprob":true,"rid":"r%d-%d"}'
            % (id(self), self.turn)
        )

    def answer(self, response: dict[str, Any]) -> None:
        result = "".join(f"{self.rng.randint(0, 200000)}," for _ in range(self.turn_len))
        self.ids += self.output + result.encode()


async def _load(args: argparse.Namespace) -> dict[str, Any]:
    target = args.proxy if args.mode == "proxy" else args.engine
    pool = HTTP1Pool(target, max_idle=4096)
    admin = HTTP1Pool(args.proxy, max_idle=64) if args.mode == "proxy" else None
    headers = [("content-type", "application/json"), ("authorization", f"Bearer {ADMIN_KEY}")]
    tools_json = json.dumps(TOOLS).encode()
    output_ids = json.loads(Path(args.output_file).read_text())
    latencies: list[float] = []
    trace: list[tuple[float, float]] = []
    calls = total = sse_chunks = 0
    measuring = False
    stop_at = time.perf_counter() + args.warmup + args.seconds
    counter = 0

    async def session_loop(worker: int) -> None:
        nonlocal calls, counter, total, sse_chunks
        rng = random.Random(worker)
        while time.perf_counter() < stop_at:
            counter += 1
            sid = f"b{args.seed}-{worker}-{counter}"
            agent: Agent | DirectAgent
            if args.mode == "proxy":
                agent = Agent(sid, rng, args.result_lines, args.max_tokens)
            else:
                agent = DirectAgent(rng, args.prompt_len, args.turn_len, output_ids)
            for _ in range(TURNS):
                if time.perf_counter() >= stop_at:
                    return
                if isinstance(agent, Agent):
                    body = agent.body(tools_json, args.stream)
                    path = f"/sessions/{sid}/v1/chat/completions"
                else:
                    body, path = agent.body(), "/generate"
                t0 = time.perf_counter()
                response = await pool.request("POST", path, body, headers=headers)
                elapsed = time.perf_counter() - t0
                if response.status != 200:
                    raise RuntimeError(f"{path}: HTTP {response.status} {response.body[:300]!r}")
                if args.stream and isinstance(agent, Agent):
                    message, chunks = sse_message(response.body)
                    agent.answer_message(message)
                    sse_chunks += chunks
                else:
                    agent.answer(json.loads(response.body))
                total += 1
                if measuring:
                    calls += 1
                    latencies.append(elapsed)
                    if args.trace:
                        trace.append((round(time.time(), 4), round(elapsed, 6)))
            if admin is not None and not args.keep_sessions:
                r = await admin.request("POST", f"/v1/sessions/{sid}/finalize", headers=headers)
                if r.status != 200:
                    raise RuntimeError(f"finalize {sid}: HTTP {r.status} {r.body[:300]!r}")

    async def clock() -> float:
        nonlocal measuring
        await asyncio.sleep(args.warmup)
        measuring = True
        if args.trace:
            print("LOAD_MEASURING", flush=True)
        start = time.perf_counter()
        await asyncio.sleep(args.seconds)
        measuring = False
        return time.perf_counter() - start

    tasks = [asyncio.create_task(session_loop(w)) for w in range(args.sessions)]
    elapsed = await clock()
    await asyncio.gather(*tasks)
    return {
        "calls": calls,
        "total_calls": total,
        "calls_per_s": calls / elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "sse_chunks": sse_chunks,
        **({"trace": trace} if args.trace else {}),
    }


async def _idle(args: argparse.Namespace) -> dict[str, Any]:
    """Open ``--sessions`` sessions of 3 turns each and leave them idle (not finalized)."""
    pool = HTTP1Pool(args.proxy, max_idle=256)
    headers = [("content-type", "application/json")]
    tools_json = json.dumps(TOOLS).encode()
    tokens: list[int] = []

    async def one(i: int) -> None:
        agent = Agent(f"idle{args.seed}-{i}", random.Random(i), args.result_lines)
        last = 0
        for _ in range(3):
            response = await pool.request(
                "POST", f"/sessions/{agent.sid}/v1/chat/completions", agent.body(tools_json),
                headers=headers,
            )  # fmt: skip
            data = json.loads(response.body)
            agent.answer(data)
            last = data["usage"]["total_tokens"]
        tokens.append(last)

    for start in range(0, args.sessions, 64):
        await asyncio.gather(*(one(i) for i in range(start, min(args.sessions, start + 64))))
    return {"sessions": len(tokens), "tokens_per_session": statistics.fmean(tokens)}


def hostile_body(attack: str) -> bytes:
    """One hostile client's request body: ``big`` a 10 MB user message, ``deep`` 100,000 nested
    arrays in place of the messages, ``flood`` a tiny (empty) call."""
    if attack == "big":
        content = "x" * (10 * 1000 * 1000)
        return json.dumps({"model": "bench", "messages": [{"role": "user", "content": content}]})\
            .encode()  # fmt: skip
    if attack == "deep":
        return b'{"model":"bench","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if attack == "flood":
        return b"{}"
    raise ValueError(f"unknown attack {attack!r}")


async def _hostile(args: argparse.Namespace) -> dict[str, Any]:
    """A hostile client: prints ``HOSTILE_READY``, waits for a line on stdin, then sends
    ``--attack`` bodies from ``--concurrency`` connections until the next line (or EOF) comes
    or ``--seconds`` pass; its JSON result tells the statuses and error messages it got."""
    import threading

    pool = HTTP1Pool(args.proxy, max_idle=args.concurrency, local_address=args.source_address)
    headers = [("content-type", "application/json")]
    body = hostile_body(args.attack)
    go, stop = threading.Event(), threading.Event()

    def control() -> None:
        sys.stdin.readline()
        go.set()
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=control, daemon=True).start()
    print("HOSTILE_READY", flush=True)
    while not go.is_set():
        await asyncio.sleep(0.01)
    deadline = time.perf_counter() + args.seconds
    statuses: dict[str, int] = {}
    messages: dict[str, int] = {}
    latencies: list[float] = []

    async def one(worker: int) -> None:
        path = f"/sessions/hostile-{args.attack}-{worker}/v1/chat/completions"
        while not stop.is_set() and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            response = await pool.request("POST", path, body, headers=headers)
            latencies.append(time.perf_counter() - t0)
            statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
            try:
                error = json.loads(response.body).get("error") or {}
                key = json.dumps([error.get("code"), error.get("message")])
            except (ValueError, AttributeError):
                key = json.dumps([None, response.body[:200].decode("utf-8", "replace")])
            messages[key] = messages.get(key, 0) + 1

    await asyncio.gather(*(one(w) for w in range(args.concurrency)))
    return {
        "attack": args.attack,
        "body_bytes": len(body),
        "requests": len(latencies),
        "statuses": statuses,
        "errors": [[*json.loads(k), n] for k, n in sorted(messages.items(), key=lambda i: -i[1])],
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "max_ms": max(latencies, default=float("nan")) * 1e3,
    }


def _run_role(args: argparse.Namespace) -> int:
    fn = {"idle": _idle, "load": _load, "hostile": _hostile}[args.role]
    if args.nice:
        os.nice(args.nice)
    try:  # the harness's own loop: uvloop when it is there (uvicorn uses it too)
        from uvloop import run
    except ImportError:
        run = asyncio.run
    result = run(fn(args))
    _write_all(sys.stdout.fileno(), (json.dumps(result) + "\n").encode())
    return 0


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``, waiting while the pipe is full. stdout can be non-blocking after a
    uvloop run (and was made so again during a write in CI), and ``print`` then cuts a line
    longer than the pipe (the load's ``--trace``) with no error: CI lost a trace at 64 KiB and
    at 128 KiB that way."""
    import select

    sys.stdout.flush()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)


# ------------------------------------------------------------------------------ orchestration
def _pinned(core: int | None, argv: list[str]) -> list[str]:
    """``argv`` run by this interpreter, under ``taskset`` to ``core`` unless None."""
    return [*(["taskset", "-c", str(core)] if core is not None else []), sys.executable, *argv]


def spawn(
    core: int | None, argv: list[str], ready: str, *, tree: Path = REPO
) -> tuple[subprocess.Popen[str], str]:
    """A Python process of this interpreter (pinned to ``core`` unless None) running ``tree``'s
    code (this repository, or another commit's copy), once it printed a line starting with
    ``ready``; returns it and the rest of that line."""
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        _pinned(core, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        cwd=tree,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(ready):
            return proc, line[len(ready) :].strip()
    raise RuntimeError(f"{argv[:3]} exited with {proc.wait()} before it was ready")


def proxy_process(
    engine_url: str,
    store: str,
    *,
    fsync: bool = False,
    core: int | None = 0,
    workers: int = 1,
    tree: Path = REPO,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[str], str]:
    argv = ["-m", "dressage.proxy.server", "--engine-url", engine_url, "--port", "0"]
    argv += ["--store-dir", store, "--admin-key", ADMIN_KEY, "--log-level", "warning", *extra]
    if workers != 1:
        argv += ["--workers", str(workers)]
    if fsync:
        argv.append("--store-fsync")
    proc, url = spawn(core, argv, "DRESSAGE_PROXY_URL=", tree=tree)
    wait_idle(proc.pid)
    return proc, url


def wait_idle(pid: int, *, timeout: float = 60.0) -> None:
    """Wait until ``pid`` and its children use under 2% of a core over two half seconds in a
    row: a proxy that is ready may still build its tokenizer's tiktoken encoder and scan its
    vocabulary in threads (seconds of CPU), which a measurement must not count as its calls'."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        cpu = _cpu_s(pid) + _children_cpu_s(pid)
        time.sleep(0.5)
        quiet = quiet + 1 if _cpu_s(pid) + _children_cpu_s(pid) - cpu < 0.01 else 0
        if quiet == 2:
            return
    raise RuntimeError(f"process {pid} was still busy {timeout:.0f} s after it was ready")


def role_argv(role: str, *extra: str) -> list[str]:
    return [str(Path(__file__).resolve()), "--role", role, *extra]


def run_role(role: str, *extra: str, core: int | None = 1) -> dict[str, Any]:
    """Run a harness role to its end (pinned to ``core`` unless None); its JSON result."""
    out = subprocess.run(
        _pinned(core, role_argv(role, *extra)),
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{role} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _cpu_s(pid: int) -> float:
    return sum(_cpu_times(pid))


def _cpu_times(pid: int) -> tuple[float, float]:
    """The process's user and system CPU seconds so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def stop_process(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _idle_rss(engine_url: str, store: str, output_file: str, lines: int) -> tuple[float, float]:
    """RSS growth per idle session of a fresh proxy, and the sessions' mean token count.

    Measured between 1000 and 3000 held sessions: the first thousand fill the free heap the
    tokenizer's loading left behind, which would otherwise hide what sessions cost."""
    proc, url = proxy_process(engine_url, store)
    try:
        common = ["--proxy", url, "--engine", engine_url, "--output-file", output_file]
        common += ["--result-lines", str(lines), "--sessions", str(IDLE_SESSIONS)]
        run_role("idle", *common, "--seed", "first")
        before = _rss_kb(proc.pid)
        tokens = [
            run_role("idle", *common, "--seed", f"more{k}")["tokens_per_session"] for k in (1, 2)
        ]
        grown = _rss_kb(proc.pid) - before
    finally:
        stop_process(proc)
    return grown * 1024 / (2 * IDLE_SESSIONS), statistics.fmean(tokens)


def _memory(engine_url: str, tmp: Path, output_file: str) -> dict[str, float]:
    """Two fresh proxies hold sessions that differ only in the length of their tool results; the
    per-session cost is the intercept of RSS per session against tokens per session."""
    short, t_short = _idle_rss(engine_url, str(tmp / "mem-short"), output_file, 10)
    long, t_long = _idle_rss(engine_url, str(tmp / "mem-long"), output_file, 40)
    per_token = (long - short) / (t_long - t_short)
    return {
        "idle_bytes_per_session_short": short,
        "idle_bytes_per_session_long": long,
        "tokens_per_session_short": t_short,
        "tokens_per_session_long": t_long,
        "idle_bytes_per_token": per_token,
        "idle_fixed_kb_per_session": (short - per_token * t_short) / 1024,
    }


def _streaming(
    output_file: str,
    tmp: Path,
    common: list[str],
    chunks: int,
    seconds: float,
    *,
    trees: tuple[Path, ...] = (REPO,),
    interval: int = 1,
    coalesce_ms: float = 0.0,
    incremental: bool = False,
) -> list[dict[str, Any]]:
    """CPU per call of a proxy of each of ``trees`` (this repository's code, another commit's
    copy), whole and streamed, alternating (whole, streamed, whole, streamed, each run by each
    proxy in turn) so that a drift of the machine falls on every measure; one result a tree.
    ``chunks``: the answer's tokens, a chunk each, or one chunk every ``interval`` tokens (the
    proxy's ``--stream-interval``); ``coalesce_ms``: the proxy's ``--stream-coalesce-ms`` (the
    engine's chunks stay as many); ``incremental``: the engine streams as SGLang's
    ``--incremental-streaming-output`` does (each chunk with its new tokens only; cumulative
    chunks if not). The engine (this repository's, for every tree) streams as SGLang does:
    chunked, one event an HTTP chunk, :data:`STREAM_INTERVAL_MS` apart, so that each chunk
    reaches the proxy on its own (sent all at once, a whole answer's events would arrive in
    one read)."""
    engine, engine_url = spawn(
        1, ["-m", "dressage.proxy.testing", "--output-file", output_file,
            "--stream-interval-ms", str(STREAM_INTERVAL_MS),
            *(["--incremental-streaming-output"] if incremental else [])],
        "SCRIPTED_ENGINE_URL=",
    )  # fmt: skip
    common = [*common, "--engine", engine_url]
    extra = ("--stream-interval", str(interval)) if interval > 1 else ()
    if coalesce_ms:
        extra = (*extra, "--stream-coalesce-ms", str(coalesce_ms))
    proxies: list[tuple[subprocess.Popen[str], str]] = []
    runs: list[dict[bool, list[dict[str, Any]]]] = [{False: [], True: []} for _ in trees]
    try:
        for k, tree in enumerate(trees):
            store = f"store-stream-{k}-{tree.name}-{interval}-{coalesce_ms}-{incremental}"
            proxies.append(proxy_process(engine_url, str(tmp / store), tree=tree, extra=extra))
        for k, stream in enumerate((False, True, False, True)):
            for (proxy, url), tree_runs in zip(proxies, runs, strict=True):
                user, system = _cpu_times(proxy.pid)
                load = ["--mode", "proxy", "--sessions", str(STREAM_SESSIONS), "--proxy", url]
                load += ["--seed", f"stream{k}", "--seconds", str(seconds)]
                r = run_role("load", *common, *load, *(["--stream"] if stream else []))
                user_after, system_after = _cpu_times(proxy.pid)
                calls = r["total_calls"]
                r["cpu_us_per_call"] = (user_after + system_after - user - system) / calls * 1e6
                r["system_us_per_call"] = (system_after - system) / calls * 1e6
                tree_runs[stream].append(r)
    finally:
        for proxy, _ in proxies:
            stop_process(proxy)
        stop_process(engine)
    return [_stream_result(tree_runs, chunks, interval) for tree_runs in runs]


def _stream_result(
    runs: dict[bool, list[dict[str, Any]]], chunks: int, interval: int
) -> dict[str, Any]:
    """One proxy's streaming figures from its whole (False) and streamed (True) runs."""
    whole = statistics.fmean(r["cpu_us_per_call"] for r in runs[False])
    streamed = statistics.fmean(r["cpu_us_per_call"] for r in runs[True])
    tokens, chunks = chunks, -(-chunks // interval)
    per_chunk = (streamed - whole) / chunks
    system = statistics.fmean(r["system_us_per_call"] for r in runs[True])
    system -= statistics.fmean(r["system_us_per_call"] for r in runs[False])
    sse = sum(r["sse_chunks"] for r in runs[True]) / sum(r["total_calls"] for r in runs[True])
    return {
        "stream_sessions": STREAM_SESSIONS,
        "stream_engine_chunks_per_call": chunks,
        "stream_sse_chunks_per_call": round(sse, 1),
        "whole_cpu_us_per_call": round(whole, 1),
        "stream_cpu_us_per_call": round(streamed, 1),
        "whole_cpu_us_per_call_runs": [round(r["cpu_us_per_call"], 1) for r in runs[False]],
        "stream_cpu_us_per_call_runs": [round(r["cpu_us_per_call"], 1) for r in runs[True]],
        "whole_calls_per_s": round(statistics.fmean(r["calls_per_s"] for r in runs[False]), 1),
        "stream_calls_per_s": round(statistics.fmean(r["calls_per_s"] for r in runs[True]), 1),
        "stream_added_cpu_us_per_chunk": round(per_chunk, 2),
        "stream_added_system_us_per_chunk": round(system / chunks, 2),
        "stream_added_cpu_us_per_token": round((streamed - whole) / tokens, 2),
        "stream_chunk_target_us": STREAM_CHUNK_TARGET_US,
        "stream_met": per_chunk <= STREAM_CHUNK_TARGET_US,
    }


_VARIANT_KEYS = (
    "stream_sse_chunks_per_call",
    "whole_cpu_us_per_call",
    "stream_cpu_us_per_call",
    "stream_cpu_us_per_call_runs",
    "stream_added_cpu_us_per_chunk",
    "stream_added_system_us_per_chunk",
    "stream_met",
)


def _variant(prefix: str, measured: dict[str, Any]) -> dict[str, Any]:
    """A streaming variant's figures (a :func:`_streaming` result) under ``prefix_`` keys."""
    return {f"{prefix}_{key}": measured[key] for key in _VARIANT_KEYS}


def _variant_line(stream: dict[str, Any], prefix: str, label: str) -> str:
    """The printed line of the streaming variant stored under ``prefix_`` keys."""
    return (
        f"  {label}: {stream[f'{prefix}_stream_cpu_us_per_call']:.0f} us per streamed call vs "
        f"{stream[f'{prefix}_whole_cpu_us_per_call']:.0f} whole (runs "
        f"{stream[f'{prefix}_stream_cpu_us_per_call_runs']}), "
        f"{stream['stream_engine_chunks_per_call']} engine chunks and "
        f"{stream[f'{prefix}_stream_sse_chunks_per_call']} SSE chunks a call: "
        f"{stream[f'{prefix}_stream_added_cpu_us_per_chunk']:.1f} us added per engine chunk "
        f"(target <= {STREAM_CHUNK_TARGET_US:.0f}), of which "
        f"{stream[f'{prefix}_stream_added_system_us_per_chunk']:.1f} in system calls"
    )


def _slope_kb_per_min(points: list[tuple[float, int]]) -> float:
    if len(points) < 2:
        return float("nan")
    ts, ys = [t for t, _ in points], [y for _, y in points]
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in points) / var * 60 if var else float("nan")


def _rss_run(
    engine_url: str, tmp: Path, common: list[str], seconds: float, interval: float
) -> dict[str, Any]:
    """A fresh proxy under ``RSS_SESSIONS`` sessions for ``seconds``, its RSS every ``interval``
    seconds (module docstring); prints the curve as it goes."""
    proxy, url = proxy_process(engine_url, str(tmp / "store-rss"))
    samples: list[tuple[float, int]] = []
    try:
        start_kb = _rss_kb(proxy.pid)
        argv = role_argv("load", *common, "--mode", "proxy", "--sessions", str(RSS_SESSIONS),
                         "--proxy", url, "--seed", "rss", "--seconds", str(seconds),
                         "--warmup", "0")  # fmt: skip
        load = subprocess.Popen(
            _pinned(1, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
        )  # fmt: skip
        t0 = time.monotonic()
        while load.poll() is None:
            time.sleep(interval)
            if load.poll() is None:
                t, kb = time.monotonic() - t0, _rss_kb(proxy.pid)
                samples.append((t, kb))
                print(f"rss t={t:6.1f}s {kb / 1024:8.1f} MB", flush=True)
        out, err = load.communicate()
        if load.returncode != 0:
            raise RuntimeError(f"load failed:\n{err[-3000:]}")
        result = json.loads(out.strip().splitlines()[-1])
        cpu_s = _cpu_s(proxy.pid)
    finally:
        stop_process(proxy)
    # the first samples hold the process start (imports, the harness's ramp): judged on the rest
    settled = [p for p in samples if p[0] >= min(10.0, seconds / 6)]
    half = len(settled) // 2
    first, last = settled[: half + 1], settled[half:]
    first_growth = first[-1][1] - first[0][1] if len(first) > 1 else 0
    last_growth = last[-1][1] - last[0][1] if len(last) > 1 else 0
    allowed = max(0.25 * first_growth, 0.02 * last[0][1]) if last else float("nan")
    return {
        "rss_sessions": RSS_SESSIONS,
        "rss_seconds": seconds,
        "rss_calls": result["total_calls"],
        "rss_calls_per_s": round(result["total_calls"] / seconds, 1),
        "rss_p99_ms": round(result["p99_ms"], 1),
        "rss_proxy_cpu_s": round(cpu_s, 1),
        "rss_start_mb": round(start_kb / 1024, 1),
        "rss_settled_from_s": round(settled[0][0], 1) if settled else None,
        "rss_mid_mb": round(last[0][1] / 1024, 1) if last else None,
        "rss_end_mb": round(samples[-1][1] / 1024, 1) if samples else None,
        "rss_max_mb": round(max(kb for _, kb in samples) / 1024, 1) if samples else None,
        "rss_first_half_growth_mb": round(first_growth / 1024, 2),
        "rss_last_half_growth_mb": round(last_growth / 1024, 2),
        "rss_first_half_slope_mb_per_min": round(_slope_kb_per_min(first) / 1024, 3),
        "rss_last_half_slope_mb_per_min": round(_slope_kb_per_min(last) / 1024, 3),
        "rss_allowed_last_half_growth_mb": round(allowed / 1024, 2),
        "rss_levels_off": (bool(last) and last_growth <= allowed)
        if seconds >= RSS_JUDGED_SECONDS
        else None,
        "rss_samples_mb": [[round(t, 1), round(kb / 1024, 1)] for t, kb in samples],
    }


def _throughput(
    engine_url: str, tmp: Path, common: list[str]
) -> dict[str, dict[int, dict[str, Any]]]:
    """Direct and proxied load at every level, and the fsync'd store at 64 sessions."""
    results: dict[str, dict[int, dict[str, Any]]] = {"direct": {}, "proxy": {}, "proxy_fsync": {}}
    for n in LEVELS:
        results["direct"][n] = run_role(
            "load", *common, "--mode", "direct", "--sessions", str(n), "--proxy", engine_url
        )
    for fsync in (False, True):
        proxy, url = proxy_process(engine_url, str(tmp / f"store-{fsync}"), fsync=fsync)
        try:
            for n in LEVELS if not fsync else (64,):
                cpu = _cpu_s(proxy.pid)
                r = run_role("load", *common, "--mode", "proxy", "--sessions", str(n),
                             "--proxy", url, "--seed", str(n))  # fmt: skip
                r["cpu_us_per_call"] = (_cpu_s(proxy.pid) - cpu) / r["total_calls"] * 1e6
                results["proxy_fsync" if fsync else "proxy"][n] = r
        finally:
            stop_process(proxy)
    return results


def checkout(ref: str, tmp: Path) -> Path:
    """This repository's files at commit ``ref`` (``git archive``), in a folder of ``tmp``."""
    out = tmp / f"tree-{ref}"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--before {ref}: git archive failed: {archive.stderr.decode()[:300]}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def _cpu_ab(
    engine_url: str, tmp: Path, common: list[str], before: Path, rounds: int
) -> dict[str, Any]:
    """Proxy CPU per call of ``before``'s proxy and this one, at every level: both proxies run
    side by side on core 0 and are driven in turn (before, after, before, after, ...), so that
    a drift of the machine falls on both; the median of ``rounds`` runs each."""
    proxies = {
        "before": proxy_process(engine_url, str(tmp / "store-ab-before"), tree=before),
        "after": proxy_process(engine_url, str(tmp / "store-ab-after")),
    }
    runs: dict[str, dict[int, list[float]]] = {k: {n: [] for n in LEVELS} for k in proxies}
    system: dict[str, dict[int, list[float]]] = {k: {n: [] for n in LEVELS} for k in proxies}
    try:
        for n in LEVELS:
            for k in range(rounds):
                for name, (proc, url) in proxies.items():
                    user0, sys0 = _cpu_times(proc.pid)
                    r = run_role("load", *common, "--mode", "proxy", "--sessions", str(n),
                                 "--proxy", url, "--seed", f"ab-{name}-{n}-{k}")  # fmt: skip
                    user1, sys1 = _cpu_times(proc.pid)
                    spent = user1 - user0 + sys1 - sys0
                    runs[name][n].append(spent / r["total_calls"] * 1e6)
                    system[name][n].append((sys1 - sys0) / spent if spent else 0.0)
    finally:
        for proc, _ in proxies.values():
            stop_process(proc)
    print(f"{'sessions':>8} {'before us/call':>15} {'after us/call':>14} {'after/before':>12}"
          f" {'after system':>12}")  # fmt: skip
    out: dict[str, Any] = {}
    for n in LEVELS:
        b, a = statistics.median(runs["before"][n]), statistics.median(runs["after"][n])
        kernel = statistics.median(system["after"][n])  # the share in system calls
        print(f"{n:8d} {b:15.0f} {a:14.0f} {a / b:12.3f} {kernel:12.1%}")
        out[f"ab_after_system_share_{n}"] = round(kernel, 3)
        out[f"ab_before_cpu_us_per_call_{n}"] = round(b, 1)
        out[f"ab_after_cpu_us_per_call_{n}"] = round(a, 1)
        out[f"ab_ratio_{n}"] = round(a / b, 3)
        out[f"ab_runs_{n}"] = {k: [round(v, 1) for v in runs[k][n]] for k in runs}
    worst = max(out[f"ab_ratio_{n}"] for n in LEVELS)
    out.update({"ab_worst_ratio": worst, "ab_target_ratio": AB_TARGET_RATIO,
                "ab_met": worst <= AB_TARGET_RATIO})  # fmt: skip
    return out


def _children_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s living children (a front's workers)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += _cpu_s(int(child))
            except OSError:
                pass
    return total


def _workers_run(
    engine_url: str, tmp: Path, common: list[str], counts: tuple[int, ...] = WORKER_COUNTS
) -> dict[str, Any]:
    """Calls/s at 256 sessions through a plain proxy and through a front with ``counts`` workers,
    none of them pinned (they share the machine with the harness, pinned to core 1), against the
    direct ceiling; with the front's own CPU per call (its reading of heads and splicing)."""
    direct = run_role("load", *common, "--mode", "direct", "--sessions", "256",
                      "--proxy", engine_url)  # fmt: skip
    runs: dict[str, dict[str, Any]] = {}
    for workers in counts:
        name = f"{workers}"
        proxy, url = proxy_process(
            engine_url, str(tmp / f"store-{name}"), core=None, workers=workers
        )
        try:
            front_cpu, workers_cpu = _cpu_s(proxy.pid), _children_cpu_s(proxy.pid)
            r = run_role("load", *common, "--mode", "proxy", "--sessions", "256",
                         "--proxy", url, "--seed", name)  # fmt: skip
            calls = r["total_calls"]
            r["front_cpu_us_per_call"] = (_cpu_s(proxy.pid) - front_cpu) / calls * 1e6
            r["workers_cpu_us_per_call"] = (_children_cpu_s(proxy.pid) - workers_cpu) / calls * 1e6
            runs[name] = r
        finally:
            stop_process(proxy)
    ceiling = direct["calls_per_s"]
    print(f"{'proxy workers':>16} {'calls/s':>9} {'of direct':>9} {'p50 ms':>8} "
          f"{'front us':>9} {'workers us':>10}")  # fmt: skip
    print(f"{'direct':>16} {ceiling:9.0f} {1:9.2f} {direct['p50_ms']:8.2f}")
    for name, r in runs.items():
        plain = name == "1"  # no front: the one process is the worker
        front_us = float("nan") if plain else r["front_cpu_us_per_call"]
        workers_us = r["front_cpu_us_per_call"] if plain else r["workers_cpu_us_per_call"]
        print(f"{name:>16} {r['calls_per_s']:9.0f} {r['calls_per_s'] / ceiling:9.2f} "
              f"{r['p50_ms']:8.2f} {front_us:9.0f} {workers_us:10.0f}")  # fmt: skip
    best = max(runs.items(), key=lambda item: item[1]["calls_per_s"])
    out: dict[str, Any] = {
        "workers_direct_calls_per_s_256": round(ceiling, 1),
        "workers_cpu_count": os.cpu_count(),
        "workers_best": int(best[0]),
        "workers_best_ratio": round(best[1]["calls_per_s"] / ceiling, 3),
        "workers_met": best[1]["calls_per_s"] >= 0.9 * ceiling,
    }
    for name, r in runs.items():
        out[f"workers_{name}_calls_per_s_256"] = round(r["calls_per_s"], 1)
        out[f"workers_{name}_p50_ms_256"] = round(r["p50_ms"], 3)
        if name != "1":
            out[f"workers_{name}_front_cpu_us_per_call"] = round(r["front_cpu_us_per_call"], 1)
            out[f"workers_{name}_cpu_us_per_call"] = round(r["workers_cpu_us_per_call"], 1)
        else:
            out["workers_1_cpu_us_per_call"] = round(r["front_cpu_us_per_call"], 1)
    return out


def _throughput_summary(results: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    print(f"{'run':>14} {'sessions':>8} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'cpu us':>7}")
    for kind in ("direct", "proxy", "proxy_fsync"):
        for n, r in sorted(results[kind].items()):
            cpu = r.get("cpu_us_per_call", float("nan"))
            print(
                f"{kind:>14} {n:8d} {r['calls_per_s']:9.0f} {r['p50_ms']:8.3f} "
                f"{r['p99_ms']:8.3f} {cpu:7.0f}"
            )
    direct, proxy = results["direct"], results["proxy"]
    added = {n: proxy[n]["p50_ms"] - direct[n]["p50_ms"] for n in LEVELS}
    added_p99 = {n: proxy[n]["p99_ms"] - direct[n]["p99_ms"] for n in LEVELS}
    ceiling = direct[256]["calls_per_s"]
    ours = proxy[256]["calls_per_s"]
    throughput_target = min(600.0, 0.9 * ceiling)
    print(f"added latency p50 at 1 session: {added[1]:.3f} ms (target <= 2)")
    print(f"calls/s at 256 vs 1 session: {ours:.0f} vs {proxy[1]['calls_per_s']:.0f}")
    print(f"harness ceiling (direct, 256 sessions): {ceiling:.0f} calls/s; proxy {ours:.0f}")
    summary: dict[str, Any] = {
        "metric": "proxy calls/s at 256 concurrent multi-turn tool sessions (baseline: direct)",
        "unit": "calls/s",
        "baseline": round(ceiling, 1),
        "ours": round(ours, 1),
        "ratio": round(ours / ceiling, 3),
        "target": round(throughput_target, 1),
        "met": (added[1] <= 2.0 and ours >= proxy[1]["calls_per_s"] and ours >= throughput_target),
        "added_p50_ms_1": round(added[1], 3),
        "added_p50_target_ms": 2.0,
    }
    for n in LEVELS:
        summary[f"direct_calls_per_s_{n}"] = round(direct[n]["calls_per_s"], 1)
        summary[f"proxy_calls_per_s_{n}"] = round(proxy[n]["calls_per_s"], 1)
        summary[f"direct_p50_ms_{n}"] = round(direct[n]["p50_ms"], 3)
        summary[f"proxy_p50_ms_{n}"] = round(proxy[n]["p50_ms"], 3)
        summary[f"proxy_p99_ms_{n}"] = round(proxy[n]["p99_ms"], 3)
        summary[f"added_p50_ms_{n}"] = round(added[n], 3)
        summary[f"added_p99_ms_{n}"] = round(added_p99[n], 3)
        summary[f"proxy_cpu_us_per_call_{n}"] = round(proxy[n]["cpu_us_per_call"], 1)
    fsync64 = results["proxy_fsync"][64]
    summary["proxy_fsync_calls_per_s_64"] = round(fsync64["calls_per_s"], 1)
    summary["proxy_fsync_p50_ms_64"] = round(fsync64["p50_ms"], 3)
    return summary


def main(args: argparse.Namespace) -> int:
    from dressage.assets import load_tokenizer

    parts = set(args.parts)
    tokenizer = load_tokenizer("qwen3.5")
    output_ids = tokenizer.encode(OUTPUT_TEXT, add_special_tokens=False)
    # direct calls carry as many ids as the proxy's: the first prompt, then each turn's tool
    # result with its turn markup (the same text the agents send)
    tito = create_tito_tokenizer(tokenizer, "qwen3.5")
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix it."}]
    prompt_len = len(tito.start(first, tools=TOOLS).delta_ids)
    turn_len = len(tokenizer.encode(_tool_result(random.Random(0), 10), add_special_tokens=False))
    turn_len += 12
    load_before = _loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    output_file = str(tmp / "output_ids.json")
    Path(output_file).write_text(json.dumps(output_ids))
    engine, engine_url = spawn(
        1, ["-m", "dressage.proxy.testing", "--output-file", output_file], "SCRIPTED_ENGINE_URL="
    )
    results = stream = memory = rss = scaling = ab = None
    if "cpu_ab" in parts and not args.before:
        raise SystemExit("--parts cpu_ab needs --before REF (the commit to compare with)")
    try:
        common = ["--engine", engine_url, "--output-file", output_file]
        common += ["--prompt-len", str(prompt_len), "--turn-len", str(turn_len)]
        if "throughput" in parts:
            results = _throughput(engine_url, tmp, common)
        if "stream" in parts:
            # one chunk per output token (the last with the finish), from a paced engine
            stream_file, stream_common, stream_ids = output_file, common, output_ids
            if args.stream_answer_tokens:
                stream_ids = _long_answer(tokenizer, args.stream_answer_tokens)
                stream_file = str(tmp / "long_output_ids.json")
                Path(stream_file).write_text(json.dumps(stream_ids))
                stream_common = [*common, "--output-file", stream_file,
                                 "--max-tokens", str(len(stream_ids) + 64)]  # fmt: skip
            # --before: its proxy measured beside this one, run for run, in each variant
            trees = (REPO, checkout(args.before, tmp)) if args.before else (REPO,)

            def measure(**variant: Any) -> list[dict[str, Any]]:
                return _streaming(stream_file, tmp, stream_common, len(stream_ids),
                                  args.stream_seconds, trees=trees, **variant)  # fmt: skip

            stream, *before = measure()
            if before:
                stream["stream_before"] = args.before
                for key in ("whole_cpu_us_per_call", "stream_cpu_us_per_call",
                            "stream_added_cpu_us_per_chunk"):  # fmt: skip
                    stream[f"before_{key}"] = before[0][key]
            if args.stream_interval > 1:  # the same proxy with --stream-interval, same run
                # this proxy alone: --before's figures are the variants above and below
                (spaced,) = _streaming(
                    stream_file, tmp, stream_common, len(stream_ids), args.stream_seconds,
                    interval=args.stream_interval,
                )  # fmt: skip
                stream["stream_interval"] = args.stream_interval
                for key in ("stream_engine_chunks_per_call", "whole_cpu_us_per_call",
                            "stream_cpu_us_per_call", "stream_added_cpu_us_per_chunk",
                            "stream_added_cpu_us_per_token"):  # fmt: skip
                    stream[f"interval_{key}"] = spaced[key]
            if args.stream_coalesce_ms:  # the same proxy with --stream-coalesce-ms, same run
                gathered, *before = measure(coalesce_ms=args.stream_coalesce_ms)
                stream["stream_coalesce_ms"] = args.stream_coalesce_ms
                stream.update(_variant("coalesce", gathered))
                if before:
                    stream.update(_variant("before_coalesce", before[0]))
            if args.stream_incremental:  # an incremental engine, the same proxy, same run
                deltas, *before = measure(coalesce_ms=args.stream_coalesce_ms, incremental=True)
                stream["stream_incremental"] = True
                stream.update(_variant("incremental", deltas))
                if before:
                    stream.update(_variant("before_incremental", before[0]))
        if "idle" in parts:
            memory = _memory(engine_url, tmp, output_file)
        if "rss" in parts:
            rss = _rss_run(engine_url, tmp, common, args.rss_seconds, args.rss_interval)
        if "workers" in parts:
            scaling = _workers_run(engine_url, tmp, common, tuple(args.worker_counts))
        if "cpu_ab" in parts:
            ab = _cpu_ab(engine_url, tmp, common, checkout(args.before, tmp), args.ab_rounds)
    finally:
        stop_process(engine)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"machine load average before / after: {load_before} / {_loadavg()}")
    summary: dict[str, Any] = {}
    if results is not None:
        summary.update(_throughput_summary(results))
    if stream is not None:
        print(
            f"streaming at {STREAM_SESSIONS} sessions: {stream['stream_cpu_us_per_call']:.0f} us "
            f"CPU per streamed call vs {stream['whole_cpu_us_per_call']:.0f} whole "
            f"(runs {stream['stream_cpu_us_per_call_runs']} vs "
            f"{stream['whole_cpu_us_per_call_runs']}), "
            f"{stream['stream_engine_chunks_per_call']} engine chunks and "
            f"{stream['stream_sse_chunks_per_call']} SSE chunks a call: "
            f"{stream['stream_added_cpu_us_per_chunk']:.1f} us added per chunk "
            f"(target <= {STREAM_CHUNK_TARGET_US:.0f}), of which "
            f"{stream['stream_added_system_us_per_chunk']:.1f} in system calls"
        )
        if "stream_interval" in stream:
            print(
                f"  --stream-interval {stream['stream_interval']}: "
                f"{stream['interval_stream_cpu_us_per_call']:.0f} us per streamed call vs "
                f"{stream['interval_whole_cpu_us_per_call']:.0f} whole, "
                f"{stream['interval_stream_engine_chunks_per_call']} engine chunks a call: "
                f"{stream['interval_stream_added_cpu_us_per_chunk']:.1f} us added per chunk, "
                f"{stream['interval_stream_added_cpu_us_per_token']:.1f} per token (against "
                f"{stream['stream_added_cpu_us_per_token']:.1f} a token a chunk)"
            )
        if "stream_coalesce_ms" in stream:
            label = f"--stream-coalesce-ms {stream['stream_coalesce_ms']:g}"
            print(_variant_line(stream, "coalesce", label))
            if "before_coalesce_stream_met" in stream:
                print(_variant_line(stream, "before_coalesce", f"--before's, {label}"))
        if "stream_incremental" in stream:
            label = (
                "an incremental engine (--incremental-streaming-output), "
                f"--stream-coalesce-ms {args.stream_coalesce_ms:g}"
            )
            print(_variant_line(stream, "incremental", label))
            if "before_incremental_stream_met" in stream:
                print(_variant_line(stream, "before_incremental", f"--before's, {label}"))
        if "stream_before" in stream:
            print(
                f"  --before {stream['stream_before']}: "
                f"{stream['before_stream_cpu_us_per_call']:.0f} us per streamed call vs "
                f"{stream['before_whole_cpu_us_per_call']:.0f} whole: "
                f"{stream['before_stream_added_cpu_us_per_chunk']:.1f} us added per chunk"
            )
        if not summary:
            whole, ours = stream["whole_cpu_us_per_call"], stream["stream_cpu_us_per_call"]
            chunks = stream["stream_engine_chunks_per_call"]
            summary.update({
                "metric": "proxy CPU per streamed call (baseline: the same call whole)",
                "unit": "us CPU per call", "baseline": whole, "ours": ours,
                "ratio": round(ours / whole, 3),
                "target": round(whole + STREAM_CHUNK_TARGET_US * chunks, 1),
                "met": stream["stream_met"],
            })  # fmt: skip
        summary.update(stream)
    if memory is not None:
        fixed = memory["idle_fixed_kb_per_session"]
        print(
            f"idle memory (RSS): {memory['idle_bytes_per_session_short'] / 1024:.1f} KB per "
            f"session of {memory['tokens_per_session_short']:.0f} tokens, "
            f"{memory['idle_bytes_per_session_long'] / 1024:.1f} KB of "
            f"{memory['tokens_per_session_long']:.0f}; intercept {fixed:.1f} KB + "
            f"{memory['idle_bytes_per_token']:.0f} B per token (target <= 50 KB + tokens; the "
            f"issue's <= {IDLE_ISSUE_TARGET_KB} KB + tokens)"
        )
        if not summary:
            summary.update({
                "metric": "idle memory per session beyond its tokens (baseline: 8.3 KB)",
                "unit": "KB", "baseline": IDLE_ISSUE_TARGET_KB, "ours": round(fixed, 2),
                "ratio": round(fixed / IDLE_ISSUE_TARGET_KB, 3), "target": IDLE_ISSUE_TARGET_KB,
                "met": fixed <= IDLE_ISSUE_TARGET_KB,
            })  # fmt: skip
        elif results is not None:
            summary["met"] = summary["met"] and fixed <= 50
        summary.update({k: round(v, 2) for k, v in memory.items()})
        summary["idle_target_kb"] = 50
        summary["idle_issue_target_kb"] = IDLE_ISSUE_TARGET_KB
        summary["idle_issue_met"] = fixed <= IDLE_ISSUE_TARGET_KB
    if rss is not None:
        print(
            f"RSS over {rss['rss_seconds']:.0f} s at {RSS_SESSIONS} sessions "
            f"({rss['rss_calls']} calls): {rss['rss_start_mb']} MB at start, "
            f"{rss['rss_mid_mb']} MB at mid-run, {rss['rss_end_mb']} MB at the end; growth "
            f"first half {rss['rss_first_half_growth_mb']} MB, last half "
            f"{rss['rss_last_half_growth_mb']} MB (allowed "
            f"{rss['rss_allowed_last_half_growth_mb']} MB): "
            + {True: "levels off", False: "still growing", None: "not judged"}[
                rss["rss_levels_off"]
            ]
            + (
                ""
                if rss["rss_levels_off"] is not None
                else f" (a run under {RSS_JUDGED_SECONDS:.0f} s: the heap fills for about the "
                "first minute; the issue's run is --rss-seconds 600)"
            )
        )
        if not summary:
            first_growth = rss["rss_first_half_growth_mb"]
            last_growth = rss["rss_last_half_growth_mb"]
            summary.update({
                "metric": f"proxy RSS growth over the last half of a {rss['rss_seconds']:.0f} s "
                f"run at {RSS_SESSIONS} sessions (baseline: the first half's growth)",
                "unit": "MB", "baseline": first_growth, "ours": last_growth,
                "ratio": round(last_growth / first_growth, 3) if first_growth else None,
                "target": rss["rss_allowed_last_half_growth_mb"], "met": rss["rss_levels_off"],
            })  # fmt: skip
        summary.update(rss)
    if scaling is not None:
        if not summary:
            best = scaling[f"workers_{scaling['workers_best']}_calls_per_s_256"]
            summary.update({
                "metric": "calls/s at 256 sessions through the best count of proxy processes "
                "(baseline: direct)",
                "unit": "calls/s", "baseline": scaling["workers_direct_calls_per_s_256"],
                "ours": best, "ratio": scaling["workers_best_ratio"],
                "target": round(0.9 * scaling["workers_direct_calls_per_s_256"], 1),
                "met": scaling["workers_met"],
            })  # fmt: skip
        summary.update(scaling)
    if ab is not None:
        if not summary:
            summary.update({
                "metric": "proxy CPU per call, this commit against --before, at the worst of "
                "1, 64 and 256 sessions (ratio after/before)",
                "unit": "us CPU per call", "baseline": ab["ab_before_cpu_us_per_call_256"],
                "ours": ab["ab_after_cpu_us_per_call_256"], "ratio": ab["ab_worst_ratio"],
                "target": AB_TARGET_RATIO, "met": ab["ab_met"],
            })  # fmt: skip
        summary.update(ab)
        summary["ab_before"] = args.before
    summary["parts"] = sorted(parts, key=PARTS.index)
    summary["loadavg_before"] = load_before
    summary["first_prompt_ids"] = prompt_len
    summary["ids_per_turn"] = turn_len + len(output_ids)
    print(json.dumps(summary))
    return 0


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["main", "load", "idle", "hostile"], default="main")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS),
                   help="main: which measures to run (default: all but workers)")  # fmt: skip
    p.add_argument("--stream-seconds", type=float, default=STREAM_SECONDS,
                   help="main: each of the 4 runs of the streaming measure")  # fmt: skip
    p.add_argument("--stream-answer-tokens", type=int, default=0,
                   help="main: the streamed answer's length in tokens (its reasoning "
                        "lengthened; 0: the bench's answer as it is)")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=256, help="load: the calls' max_tokens")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="main: also measure streaming through --stream-interval N")  # fmt: skip
    p.add_argument("--stream-coalesce-ms", type=float, default=0.0,
                   help="main: also measure streaming through --stream-coalesce-ms MS")  # fmt: skip
    p.add_argument("--stream-incremental", action="store_true",
                   help="main: also measure streaming from an engine that sends only each "
                        "chunk's new tokens (SGLang's --incremental-streaming-output), through "
                        "--stream-coalesce-ms if given")  # fmt: skip
    p.add_argument("--rss-seconds", type=float, default=RSS_SECONDS,
                   help="main: the long run's length (the issue's run: 600)")  # fmt: skip
    p.add_argument("--rss-interval", type=float, default=2.0,
                   help="main: seconds between RSS samples")  # fmt: skip
    p.add_argument("--before", default="",
                   help="main, --parts cpu_ab: the commit whose proxy to compare with")  # fmt: skip
    p.add_argument("--worker-counts", type=int, nargs="+", default=list(WORKER_COUNTS),
                   help="main, --parts workers: proxy processes (1: a plain proxy)")  # fmt: skip
    p.add_argument("--ab-rounds", type=int, default=AB_ROUNDS,
                   help="main, --parts cpu_ab: runs of each proxy at each level")  # fmt: skip
    p.add_argument("--mode", choices=["direct", "proxy"], default="proxy")
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("--seconds", type=float, default=RUN_SECONDS)
    p.add_argument("--warmup", type=float, default=WARMUP_SECONDS)
    p.add_argument("--stream", action="store_true", help="load: the chat calls stream")
    p.add_argument("--trace", action="store_true", help="load: every call's (end, latency)")
    p.add_argument("--attack", choices=["big", "deep", "flood"], default="flood")
    p.add_argument("--concurrency", type=int, default=1, help="hostile: connections")
    p.add_argument("--source-address", default=None,
                   help="hostile: connect from this address (another client)")  # fmt: skip
    p.add_argument("--nice", type=int, default=0, help="roles: run at this niceness")
    p.add_argument("--proxy", default="")
    p.add_argument("--engine", default="")
    p.add_argument("--output-file", default="")
    p.add_argument("--seed", default="0")
    p.add_argument("--result-lines", type=int, default=10)
    p.add_argument("--keep-sessions", action="store_true")
    p.add_argument("--prompt-len", type=int, default=800, help="direct mode: first prompt ids")
    p.add_argument("--turn-len", type=int, default=170, help="direct mode: ids added per turn")
    return p.parse_args()


if __name__ == "__main__":
    arguments = _args()
    sys.exit(main(arguments) if arguments.role == "main" else _run_role(arguments))
