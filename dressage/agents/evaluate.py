"""Task accuracy through the real agent loop: engine, proxy, tools and the exact-match reward.

    from dressage.agents.evaluate import EvalItem, measure_accuracy
    items = [EvalItem("calculator", "Compute 2 + 3. Reply with the number only.", "5")]
    report = measure_accuracy(proxy_url, items, admin_key=KEY)   # {"calculator": 1.0}

Each item is one proxy session: the built-in agent (or any registered one) works the prompt with
greedy decoding (``top_k`` 1, so a measurement is repeatable), the task's tools answer its
calls, and the task's registered reward (:mod:`dressage.reward.builtin`) scores its final answer
against the label. The session is discarded afterwards, so nothing an evaluation generates is
ever trained on. Agent failures (an HTTP error, a timeout) score 0 and are counted.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dressage.proxy.client import ProxyClient

__all__ = [
    "AccuracyReport",
    "EvalItem",
    "checkpoint_accuracy",
    "items_from_jsonl",
    "measure_accuracy",
]


@dataclass(frozen=True)
class EvalItem:
    task: str
    prompt: str
    label: str


@dataclass
class AccuracyReport:
    """Per task: the share of items solved, how many were tried and how many failed to run."""

    accuracy: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    first_errors: list[str] = field(default_factory=list)
    """The first few failures, each naming the item and the exception."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "count": self.count,
            "errors": self.errors,
            "first_errors": self.first_errors,
        }


def items_from_jsonl(path: str | Path, task: str | None = None) -> list[EvalItem]:
    """Dataset rows (``input``, ``label``, ``metadata.task``) as items; ``task`` overrides."""
    items = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        name = task or (row.get("metadata") or {}).get("task")
        if not name or "input" not in row or "label" not in row:
            raise ValueError(f"{path}:{number}: a row needs input, label and a task")
        items.append(EvalItem(str(name), str(row["input"]), str(row["label"])))
    return items


def _score(task: str, answer: str, label: str) -> float:
    from dressage.reward.registry import get_reward
    from dressage.types import Sample

    sample = Sample(response=answer, label=label, metadata={"task": task})
    return float(get_reward(task)(None, sample))  # type: ignore[arg-type]


async def _one(
    proxy: ProxyClient,
    item: EvalItem,
    *,
    agent: str,
    max_turns: int,
    max_tokens: int,
    timeout_s: float,
    api_key: str | None,
) -> float | str:
    import httpx

    from dressage.agents.base import AgentTask
    from dressage.agents.client import agent_client
    from dressage.agents.registry import load_agent
    from dressage.proxy.client import ProxyClientError

    session = f"eval-{uuid.uuid4().hex[:16]}"
    task = AgentTask(
        prompt=item.prompt,
        task=item.task,
        sampling={"max_tokens": max_tokens, "top_k": 1},
        max_turns=max_turns,
    )
    client = agent_client(
        proxy.session_base_url(session),
        api_key=api_key or proxy.admin_key or "unused",
        timeout_s=timeout_s,
    )
    try:
        result = await asyncio.wait_for(load_agent(agent)(client, task), timeout_s)
        return _score(item.task, result.final_answer, item.label)
    except Exception as exc:  # an agent that fails to run scores 0; counted as an error
        return f"{item.task} {item.prompt[:40]!r}: {type(exc).__name__}: {exc}"[:300]
    finally:
        await client.close()
        try:
            await proxy.discard_session(session)
        except (ProxyClientError, httpx.HTTPError):  # never reached the proxy: nothing to discard
            pass


async def _measure(
    proxy_url: str, items: Sequence[EvalItem], concurrency: int, admin_key: str | None, **kw: Any
) -> list[float | str]:
    from dressage.proxy.client import ProxyClient

    gate = asyncio.Semaphore(concurrency)
    async with ProxyClient(proxy_url, admin_key=admin_key) as proxy:

        async def run(item: EvalItem) -> float | str:
            async with gate:
                return await _one(proxy, item, **kw)

        return list(await asyncio.gather(*(run(item) for item in items)))


def measure_accuracy(
    proxy_url: str,
    items: Iterable[EvalItem],
    *,
    agent: str = "tool_user",
    max_turns: int = 2,
    max_tokens: int = 64,
    concurrency: int = 16,
    timeout_s: float = 120.0,
    api_key: str | None = None,
    admin_key: str | None = None,
) -> AccuracyReport:
    """Run every item through ``agent`` at the proxy and score it (see the module docstring)."""
    items = list(items)
    scores = asyncio.run(
        _measure(
            proxy_url,
            items,
            concurrency,
            agent=agent,
            max_turns=max_turns,
            max_tokens=max_tokens,
            timeout_s=timeout_s,
            api_key=api_key,
            admin_key=admin_key,
        )
    )
    report = AccuracyReport()
    for task in sorted({i.task for i in items}):
        mine = [s for i, s in zip(items, scores, strict=True) if i.task == task]
        report.count[task] = len(mine)
        report.errors[task] = sum(isinstance(s, str) for s in mine)
        report.accuracy[task] = sum(s for s in mine if isinstance(s, float)) / len(mine)
    report.first_errors = [s for s in scores if isinstance(s, str)][:5]
    return report


def checkpoint_accuracy(
    model_dir: str | Path, items: Iterable[EvalItem], *, device: str = "cpu", **options: Any
) -> AccuracyReport:
    """:func:`measure_accuracy` of a Hugging Face folder: serves it with the embedded engine and
    the recording proxy (its own tokenizer, a scratch store) on loopback threads, then stops
    both. ``options`` are :func:`measure_accuracy`'s."""
    import secrets
    import tempfile

    from dressage.config.proxy import ProxyConfig
    from dressage.engine.testing import serve_engine
    from dressage.proxy.testing import serve_proxy

    key, engine_key = secrets.token_hex(16), secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="dressage-eval-") as scratch:
        with serve_engine(model_dir, device=device, admin_api_key=engine_key) as engine_url:
            config = ProxyConfig.model_validate(
                {
                    "engine_url": engine_url,
                    "store_dir": Path(scratch) / "store",
                    "tokenizer_path": str(model_dir),
                    "admin_key": key,
                    "engine_admin_key": engine_key,  # its aborts of calls agents give up
                }
            )
            with serve_proxy(config) as proxy_url:
                return measure_accuracy(proxy_url, items, admin_key=key, **options)
