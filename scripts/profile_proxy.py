"""Where the proxy's CPU goes per call, by category, under ``bench/proxy.py``'s own load.

    .venv/bin/python scripts/profile_proxy.py        # about 1 minute on 2 cores

The harness is ``bench/proxy.py``'s, imported, not copied: its scripted instant engine and its
load generator (multi-turn tool sessions of 8 turns, finalized) on core 1, one proxy on core 0.
For each level (``--sessions``, 1 and 256 by default) py-spy samples the proxy process only
over the whole load run, from core 1; it drops the samples of an idle thread, so the samples
stand for the proxy's CPU time. py-spy pauses the proxy for each sample (its default): its
``--nonblocking`` samples of this asyncio process came back torn, a fifth of them ending in
frames that were not running (``_read_head`` between two engine answers). The proxy's CPU
time over the same run (``/proc/PID/stat``, user + system) divided by the calls it served is
the CPU per call, and each category gets its share of the samples.

A sample is a Python stack; :func:`category` puts it in the category of the first frame, from
the leaf up, that a rule of :data:`RULES` names (the first matching rule wins); a stack under
the admin finalize call is all finalize's. Frames of generic library code (asyncio's
machinery, contextlib) are passed over, so their time goes to the code that called them. Time
in C (the tokenizer's Rust, ``json``'s C encoder) is charged to the Python frame that called
it; uvloop's own loop and socket work shows as a stack that ends in the loop's entry point. A
stack in which only such a frame matched, above code no rule names, is "other
(unattributed)". JSON is one category wherever it runs; the run also prints whose JSON it was
(the category of the code that called it).

py-spy comes with the dev install (``ray[default]`` requires it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
LOOP = "event loop and sockets (uvloop, C)"
OTHER = "other (unattributed)"
FINALIZE = "finalize (admin, 1 per 8 calls)"
JSON = "JSON (encode, decode)"
PASS = ""
"""A rule's category for frames passed over: their time goes to the frame that called them."""

# (category, path pattern, function pattern): a frame matches when re.search finds the path
# pattern in its file's path and the function pattern matches all of the function's qualified
# name (``Class.method``, ``outer.<locals>.inner``) or of its last part (``method``, ``inner``).
RULES: list[tuple[str, str, str]] = [
    # the hardening added since the first measurement (issue 29's and later rounds)
    (
        "hardening: body checks (size cap, depth, surrogates)",
        r"dressage/http_json\.py$",
        r"read_limited_body|parse_json_body|_walk|find_lone_surrogate|_surrogate_index|_encodable",
    ),
    (
        "hardening: disconnect watchers",
        r"dressage/proxy/chat_routes\.py$",
        r"ClientWatch\..*",
    ),
    (
        "hardening: disconnect watchers",
        r"dressage/proxy/generation_controller\.py$",
        r".*_abort_when_gone.*|_unless_gone",
    ),
    ("hardening: record identities", r"dressage/proxy/store_format\.py$", r"identity|_id_crc"),
    ("access log", r"dressage/proxy/access_log\.py$|/logging/", r".*"),
    # JSON wherever it runs
    (JSON, r"/json/", r".*"),
    (JSON, r"/orjson/", r".*"),
    (JSON, r"dressage/proxy/openai_api\.py$", r"dumps"),
    # answer parsing: ids to text, text to the assistant message (before "TITO encode":
    # transformers' decode and encode share modules)
    ("answer parsing", r"dressage/proxy/parsers/", r".*"),
    ("answer parsing", r"/transformers/", r".*decode.*|convert_ids_to_tokens"),
    ("answer parsing", r"dressage/proxy/tito/base\.py$", r"decode|parse_output"),
    ("answer parsing", r"dressage/proxy/turns\.py$", r"assistant_message|finish_reason"),
    # streaming (the bench's agents do not stream)
    ("streaming (SSE)", r"dressage/proxy/streaming\.py$", r".*"),
    ("streaming (SSE)", r"dressage/proxy/chat_routes\.py$", r"_stream|sse|chunk|_EventStream.*"),
    ("streaming (SSE)", r"dressage/proxy/openai_api\.py$", r"sse_.*"),
    ("streaming (SSE)", r"dressage/proxy/sessions\.py$", r"chat_stream"),
    # the store: the step record, its line, the index, durability
    ("store record and durability", r"dressage/proxy/store(_format|_index)?\.py$", r".*"),
    ("store record and durability", r"dressage/trajectory\.py$", r".*"),
    ("store record and durability", r"dressage/proxy/turns\.py$", r"step_extra"),
    ("store record and durability", r"dressage/proxy/sessions\.py$", r"_record"),
    # finalize: the admin call that closes each session (1 in 8 calls here)
    (FINALIZE, r"dressage/proxy/store_segments\.py$", r".*"),
    (
        "finalize (admin, 1 per 8 calls)",
        r"dressage/proxy/session_registry\.py$",
        r"finalize|_close|closing|_closing",
    ),
    (FINALIZE, r"dressage/proxy/server\.py$", r"finalize"),
    # TITO: template rendering, encoding the delta, the append-only check and the state
    ("template rendering", r"/jinja2/|/markupsafe/", r".*"),
    ("template rendering", r"dressage/proxy/tito/template_utils\.py$", r".*"),
    ("template rendering", r"dressage/proxy/tito/templated\.py$", r"_render|render_conversation"),
    (
        "template rendering",
        r"dressage/proxy/tito/messages\.py$",
        r"template_form|content_text|tool_calls_of|_arguments",
    ),
    ("TITO encode", r"dressage/proxy/encoding\.py$", r".*"),
    ("TITO encode", r"/transformers/|/tokenizers/", r".*"),
    ("TITO encode", r"dressage/proxy/tito/base\.py$", r"make_encoder|encode|<lambda>"),
    ("TITO encode", r"dressage/proxy/tito/tiktoken_encode\.py$|/tiktoken/", r".*"),
    ("TITO append check and state", r"dressage/proxy/tito/", r".*"),
    ("TITO append check and state", r"dressage/proxy/turns\.py$", r".*"),
    # validation of the request (beyond JSON well-formedness)
    ("validation", r"dressage/proxy/(openai_api|request_fields|constraints|limits)\.py$", r".*"),
    ("validation", r"dressage/proxy/session_registry\.py$", r"check_session_id"),
    ("validation", r"dressage/auth\.py$|dressage/proxy/pause_requests\.py$", r".*"),
    # the engine client: the /generate request, its answer, the pause gate around it
    ("engine client", r"dressage/proxy/(engine_client|engine_answers|http1)\.py$", r".*"),
    ("engine client", r"dressage/proxy/(generation_controller|pause_controller)\.py$", r".*"),
    ("engine client", r"/httpx/|/httpcore/|/anyio/", r".*"),
    # sessions: the registry, the lock, the call's plan, the checks done once
    ("sessions (registry, lock, call)", r"dressage/proxy/(sessions|session_registry)\.py$", r".*"),
    ("sessions (registry, lock, call)", r"dressage/proxy/(vocabulary|router_fields)\.py$", r".*"),
    # HTTP in and out: the server, the framework, the route handlers, the response
    ("HTTP in and out (uvicorn, Starlette)", r"/uvicorn/protocols/|/starlette/|/fastapi/", r".*"),
    ("HTTP in and out (uvicorn, Starlette)", r"/h11/|/httptools/", r".*"),
    (
        "HTTP in and out (uvicorn, Starlette)",
        r"dressage/proxy/(chat_routes|http_io|serving)\.py$",
        r".*",
    ),
    (
        "HTTP in and out (uvicorn, Starlette)",
        r"dressage/proxy/server\.py$",
        r"(create_app|_add_\w+)\..*",
    ),
    # the loop's entry points: a stack that ends here is the loop's own C work
    (LOOP, r"/asyncio/runners\.py$|/uvicorn/(_compat|server|main)\.py$|/uvloop/", r".*"),
    (LOOP, r"dressage/proxy/server\.py$|^<string>$|<frozen runpy>|runpy\.py$", r".*"),
    # generic machinery: passed over, its time goes to its caller
    (PASS, r"/asyncio/|/contextlib\.py$|/functools\.py$|/typing\.py$|/abc\.py$", r".*"),
    (PASS, r"/enum\.py$|/dataclasses\.py$|/copy\.py$|/re/|/uuid\.py$|/random\.py$", r".*"),
]

_COMPILED = [(name, re.compile(path), re.compile(func)) for name, path, func in RULES]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Frame:
    """One frame of a py-spy stack: its function's name and its file's path."""

    function: str
    path: str


def rule_for(frame: Frame) -> str | None:
    """The category of the first rule naming ``frame`` (:data:`PASS` to pass it over), or None
    when no rule names it."""
    for name, path, func in _COMPILED:
        last = frame.function.rpartition(".")[2]
        if path.search(frame.path) and (func.fullmatch(frame.function) or func.fullmatch(last)):
            return name
    return None


def category(stack: Sequence[Frame]) -> str:
    """The category of a sample whose stack is ``stack`` (root first, leaf last): the first
    frame from the leaf up that a rule names; :data:`OTHER` when that is only the loop's entry
    point with frames no rule names above it, or when nothing matched."""
    names = [rule_for(frame) for frame in stack]
    if FINALIZE in names:  # the store's reads and JSON under it are the admin call's
        return FINALIZE
    unnamed = False
    for name in reversed(names):
        if name is None:
            unnamed = True
        elif name != PASS:
            return OTHER if name == LOOP and unnamed else name
    return OTHER


def waiting(stack: Sequence[Frame]) -> bool:
    """Whether ``stack`` is a thread pool's worker waiting for work (the leaf is the pool's loop,
    blocked in its queue's C ``get``). py-spy counts such a thread as active, but it uses no
    CPU (``/proc``'s per-thread times say so): after the vocabulary scan's ``to_thread`` its
    idle worker was a third of all samples."""
    leaf = stack[-1] if stack else None
    return (
        leaf is not None
        and leaf.function == "_worker"
        and (leaf.path.endswith("concurrent/futures/thread.py"))
    )


def json_owner(stack: Sequence[Frame]) -> str:
    """For a sample in :data:`JSON`, the category of the code that called ``json``."""
    for depth in range(len(stack) - 1, -1, -1):
        if rule_for(stack[depth]) == JSON:
            below = stack[:depth]
            while below and rule_for(below[-1]) == JSON:
                below = below[:-1]
            return category(below)
    return OTHER


def parse_frame(text: str) -> Frame:
    """A frame as py-spy's raw format writes it: ``function (path:line)``."""
    match = _FRAME.match(text)
    if match is None:
        return Frame(text, "")
    return Frame(match["func"], match["path"])


def read_raw(path: Path) -> Counter[tuple[Frame, ...]]:
    """py-spy's raw (collapsed) output: each stack, root first, with its sample count."""
    stacks: Counter[tuple[Frame, ...]] = Counter()
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        frames, _, count = line.rpartition(" ")
        stacks[tuple(parse_frame(f) for f in frames.split(";"))] += int(count)
    return stacks


@dataclass
class Level:
    """One level's measurement: calls served, proxy CPU seconds, samples by category."""

    sessions: int
    calls: int
    calls_per_s: float
    cpu_s: float
    samples: Counter[str] = field(default_factory=Counter)
    json_by_owner: Counter[str] = field(default_factory=Counter)

    @property
    def cpu_us_per_call(self) -> float:
        return self.cpu_s / self.calls * 1e6


def _bench() -> ModuleType:
    """``bench/proxy.py``, imported from its path (``bench/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_proxy", REPO / "bench" / "proxy.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {REPO / 'bench' / 'proxy.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _py_spy() -> str:
    found = shutil.which(
        "py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if found is None:
        raise SystemExit(
            "profile_proxy: py-spy is not installed; install the dev extra (make venv)"
        )
    return found


def _start_sampler(pid: int, rate: int, out: Path) -> subprocess.Popen[str]:
    argv = ["taskset", "-c", "1", _py_spy(), "record", "--pid", str(pid), "--rate", str(rate)]
    argv += ["--format", "raw", "--full-filenames", "-o", str(out)]
    spy = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert spy.stdout is not None
    for line in spy.stdout:
        if "Sampling process" in line:
            return spy
    raise RuntimeError(f"py-spy exited with {spy.wait()} before it sampled pid {pid}")


def _stop_sampler(spy: subprocess.Popen[str]) -> str:
    spy.send_signal(signal.SIGINT)
    out, _ = spy.communicate(timeout=60)
    return out


def profile_level(
    bench: ModuleType,
    proxy_pid: int,
    url: str,
    common: list[str],
    sessions: int,
    args: argparse.Namespace,
    raw: Path,
) -> Level:
    """One load run of ``sessions`` sessions, sampled; CPU and calls over the same run."""
    spy = _start_sampler(proxy_pid, args.rate, raw)
    cpu = bench._cpu_s(proxy_pid)
    try:
        load = ["--mode", "proxy", "--sessions", str(sessions), "--proxy", url]
        load += ["--seed", f"p{sessions}", "--seconds", str(args.seconds)]
        load += ["--stream"] if args.stream else []
        r = bench.run_role("load", *common, *load)
        cpu = bench._cpu_s(proxy_pid) - cpu
    finally:
        said = _stop_sampler(spy)
    level = Level(sessions, r["total_calls"], r["calls_per_s"], cpu)
    if not raw.exists():
        raise RuntimeError(f"py-spy wrote no samples for {sessions} sessions: {said[-500:]}")
    for stack, count in read_raw(raw).items():
        if waiting(stack):
            continue
        name = category(stack)
        level.samples[name] += count
        if name == JSON:
            level.json_by_owner[json_owner(stack)] += count
    return level


def table(level: Level) -> str:
    """The level's table: category, CPU microseconds per call, share of the proxy's CPU."""
    total = sum(level.samples.values())
    lines = [
        f"{level.sessions} sessions: {level.calls} calls, {level.calls_per_s:.0f} calls/s, "
        f"{level.cpu_us_per_call:.0f} us proxy CPU per call, {total} samples",
        f"| {'category':<52} | {'CPU us/call':>11} | {'share':>6} |",
        f"|{'-' * 54}|{'-' * 13}:|{'-' * 7}:|",
    ]
    for name, count in level.samples.most_common():
        share = count / total
        lines.append(f"| {name:<52} | {share * level.cpu_us_per_call:11.0f} | {share:6.1%} |")
    if level.json_by_owner:
        owners = ", ".join(
            f"{name} {count / total:.1%}" for name, count in level.json_by_owner.most_common()
        )
        lines.append(f"JSON by caller (share of all samples): {owners}")
    return "\n".join(lines)


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Within the block, file descriptor 2 (what spawned processes inherit) writes to ``path``:
    the proxy's access log (a line a call) goes there, not to the terminal."""
    saved = os.dup(2)
    with path.open("a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def main() -> int:
    args = _args()
    bench = _bench()
    tmp = Path(tempfile.mkdtemp(prefix="profile-proxy-"))
    raw_dir = Path(args.raw_dir) if args.raw_dir else tmp
    raw_dir.mkdir(parents=True, exist_ok=True)
    from dressage.assets import load_tokenizer

    tokenizer = load_tokenizer("qwen3.5")
    output_file = tmp / "output_ids.json"
    output_file.write_text(str(tokenizer.encode(bench.OUTPUT_TEXT, add_special_tokens=False)))
    services_log = tmp / "services.stderr"
    print(f"machine load average before: {bench._loadavg()}", flush=True)
    levels = []
    try:
        with _stderr_to(services_log):
            paced = ["--stream-interval-ms", str(bench.STREAM_INTERVAL_MS)] if args.stream else []
            engine, engine_url = bench.spawn(
                1, ["-m", "dressage.proxy.testing", "--output-file", str(output_file), *paced],
                "SCRIPTED_ENGINE_URL=",
            )  # fmt: skip
            proxy, url = bench.proxy_process(engine_url, str(tmp / "store"))
        try:
            common = ["--engine", engine_url, "--output-file", str(output_file)]
            for n in args.sessions:
                raw = raw_dir / f"proxy_{n}.txt"
                levels.append(profile_level(bench, proxy.pid, url, common, n, args, raw))
                print(table(levels[-1]) + "\n", flush=True)
        finally:
            bench.stop_process(proxy)
            bench.stop_process(engine)
    except Exception:
        if services_log.exists():
            print(services_log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"machine load average after: {bench._loadavg()}")
    other = max(level.samples[OTHER] / sum(level.samples.values()) for level in levels)
    print(f"largest unattributed share: {other:.1%}")
    return 0


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 256], help="levels to profile")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per level")
    p.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    p.add_argument("--raw-dir", default="", help="keep py-spy's raw stacks here")
    p.add_argument("--stream", action="store_true",
                   help="the calls stream, from an engine that paces its chunks as the "
                        "bench's streaming part does (its level: --sessions 16)")  # fmt: skip
    return p.parse_args()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
