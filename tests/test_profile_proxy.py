"""scripts/profile_proxy.py's category rules put known py-spy frames in the category the
profile's table says (no profiling run here), and every rule that names a module of the
package still names a file of it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.unit

PY = "/root/.pyenv/versions/3.11.7/lib/python3.11"
SITE = "/repo/.venv/lib/python3.11/site-packages"
ROOT = [
    "_run_module_as_main (<frozen runpy>:198)",
    f"main ({REPO}/dressage/proxy/server.py:410)",
    f"Server.run ({SITE}/uvicorn/server.py:67)",
    f"asyncio_run ({SITE}/uvicorn/_compat.py:30)",
    f"Runner.run ({PY}/asyncio/runners.py:118)",
]
CHAT = [
    f"RequestResponseCycle.run_asgi ({SITE}/uvicorn/protocols/http/httptools_impl.py:416)",
    f"add_chat_routes.<locals>.chat ({REPO}/dressage/proxy/chat_routes.py:130)",
    f"SessionManager.chat ({REPO}/dressage/proxy/sessions.py:360)",
]


def _script() -> ModuleType:
    path = REPO / "scripts" / "profile_proxy.py"
    spec = importlib.util.spec_from_file_location("profile_proxy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_proxy"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


pp = _script()


def _stack(*frames: str) -> tuple[object, ...]:
    return tuple(pp.parse_frame(f) for f in (*ROOT, *frames))


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (  # the tokenizer's Rust, called through the piece memo
            [
                *CHAT,
                f"SessionManager._begin ({REPO}/dressage/proxy/sessions.py:190)",
                f"plan_turn ({REPO}/dressage/proxy/turns.py:105)",
                f"TemplateTITOTokenizer._append ({REPO}/dressage/proxy/tito/templated.py:140)",
                f"PieceMemoEncoder.__call__ ({REPO}/dressage/proxy/encoding.py:120)",
                f"make_encoder.<locals>.<lambda> ({REPO}/dressage/proxy/tito/base.py:40)",
            ],
            "TITO encode",
        ),
        (
            [
                *CHAT,
                f"TemplateTITOTokenizer._render ({REPO}/dressage/proxy/tito/templated.py:80)",
                f"render_template ({REPO}/dressage/proxy/tito/template_utils.py:95)",
                "root (<template>:12)",
                f"Context.call ({SITE}/jinja2/runtime.py:300)",
            ],
            "template rendering",
        ),
        (  # decode is answer parsing, though transformers' encode is TITO's
            [
                *CHAT,
                f"assistant_message ({REPO}/dressage/proxy/turns.py:140)",
                f"TITOTokenizer.parse_output ({REPO}/dressage/proxy/tito/base.py:187)",
                f"TITOTokenizer.decode ({REPO}/dressage/proxy/tito/base.py:180)",
                f"PreTrainedTokenizerBase.decode ({SITE}/transformers/tokenization_utils.py:1)",
            ],
            "answer parsing",
        ),
        (  # JSON wherever it runs
            [
                *CHAT,
                f"SessionManager._record ({REPO}/dressage/proxy/sessions.py:290)",
                f"TrajectoryStore._write ({REPO}/dressage/proxy/store.py:138)",
                f"encode ({REPO}/dressage/proxy/store_format.py:78)",
                f"dumps ({PY}/json/__init__.py:238)",
                f"JSONEncoder.iterencode ({PY}/json/encoder.py:258)",
            ],
            pp.JSON,
        ),
        (
            [
                *CHAT,
                f"SessionManager._record ({REPO}/dressage/proxy/sessions.py:290)",
                f"TrajectoryStore._write ({REPO}/dressage/proxy/store.py:138)",
                f"encode ({REPO}/dressage/proxy/store_format.py:75)",
                f"_id_crc ({REPO}/dressage/proxy/store_format.py:68)",
            ],
            "hardening: record identities",
        ),
        (  # asyncio's machinery is charged to its caller
            [
                f"ClientWatch.__init__ ({REPO}/dressage/proxy/chat_routes.py:67)",
                f"ensure_future ({PY}/asyncio/tasks.py:649)",
                f"_ensure_future ({PY}/asyncio/tasks.py:670)",
            ],
            "hardening: disconnect watchers",
        ),
        (
            [
                *CHAT,
                f"HTTP1Pool.request ({REPO}/dressage/proxy/http1.py:230)",
                f"StreamWriter.write ({PY}/asyncio/streams.py:340)",
            ],
            "engine client",
        ),
        (  # everything under the admin finalize call, its response's JSON included
            [
                f"_add_sessions.<locals>.finalize ({REPO}/dressage/proxy/server.py:300)",
                f"json_response ({REPO}/dressage/proxy/http_io.py:33)",
                f"dumps ({REPO}/dressage/proxy/openai_api.py:56)",
                f"dumps ({PY}/json/__init__.py:238)",
            ],
            pp.FINALIZE,
        ),
        ([], pp.LOOP),  # uvloop's own work: the stack ends in the loop's entry point
        ([f"mystery ({SITE}/somewhere/else.py:3)"], pp.OTHER),
    ],
)
def test_a_known_stack_lands_in_its_category(frames: list[str], expected: str) -> None:
    assert pp.category(_stack(*frames)) == expected


def test_a_torn_stack_of_library_frames_only_is_unattributed() -> None:
    assert pp.category([pp.parse_frame(f"Event.wait ({PY}/asyncio/locks.py:213)")]) == pp.OTHER


def test_an_idle_pool_worker_is_not_a_sample() -> None:
    pool = f"{PY}/concurrent/futures/thread.py"
    worker = [f"Thread._bootstrap ({PY}/threading.py:1002)", f"_worker ({pool}:81)"]
    assert pp.waiting(_stack(*worker))
    busy = [*worker, f"_WorkItem.run ({pool}:58)", f"longest_token ({REPO}/dressage/a.py:9)"]
    assert not pp.waiting(_stack(*busy))
    assert not pp.waiting(_stack(f"_worker ({REPO}/dressage/proxy/other.py:3)"))


def test_json_is_also_told_by_whose_it_was() -> None:
    stack = _stack(
        *CHAT,
        f"EngineClient.generate ({REPO}/dressage/proxy/engine_client.py:200)",
        f"loads ({PY}/json/__init__.py:346)",
        f"JSONDecoder.raw_decode ({PY}/json/decoder.py:353)",
    )
    assert pp.category(stack) == pp.JSON
    assert pp.json_owner(stack) == "engine client"


def test_py_spy_raw_output_reads_back(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    line = ";".join([*ROOT, f"PieceMemoEncoder._piece ({REPO}/dressage/proxy/encoding.py:95)"])
    raw.write_text(f"{line} 7\n{line} 2\n\n")
    stacks = pp.read_raw(raw)
    assert list(stacks.values()) == [9]
    (stack,) = stacks
    assert stack[-1] == pp.Frame("PieceMemoEncoder._piece", f"{REPO}/dressage/proxy/encoding.py")
    assert pp.category(stack) == "TITO encode"


def _variants(pattern: str) -> list[str]:
    """The plain alternatives of a path pattern: ``a/(b|c)?\\.py$|d`` -> ``a/b\\.py$``,
    ``a/c\\.py$``, ``a/\\.py$``, ``d``."""
    group = re.search(r"\(([\w|]+)\)(\??)", pattern)
    if group is None:
        return pattern.split("|")
    options = group[1].split("|") + ([""] if group[2] else [])
    head, tail = pattern[: group.start()], pattern[group.end() :]
    return [v for option in options for v in _variants(head + option + tail)]


def test_every_rule_on_the_package_still_names_one_of_its_files() -> None:
    files = [str(p) for p in (REPO / "dressage").rglob("*.py")]
    for name, path, _ in pp.RULES:
        for variant in _variants(path):
            if "dressage" in variant:
                assert any(re.search(variant, f) for f in files), (name, variant)
