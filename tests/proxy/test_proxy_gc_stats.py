"""``/v1/stats`` reports the process's cyclic-GC collections: their count, their time and what
they freed (a sampling profiler hides them among whatever allocated last)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from dressage.proxy.tito import TITOTokenizer
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration


def test_stats_count_the_collections_and_the_garbage_they_freed(
    tmp_path: Path, qwen35_tito: TITOTokenizer, script: Callable[..., Script]
) -> None:
    with scripted_proxy(script("ok<|im_end|>"), tmp_path, qwen35_tito) as (url, _):
        before = httpx.get(f"{url}/v1/stats").json()["gc"]
        cycle: list[object] = []
        cycle.append(cycle)  # one unreachable object once dropped
        del cycle
        gc.collect(0)  # the young generation: the cycle is in it, and it is quick
        after = httpx.get(f"{url}/v1/stats").json()["gc"]
    assert after["collections"] >= before["collections"] + 1
    assert after["unreachable_objects"] >= before["unreachable_objects"] + 1
    assert after["seconds"] >= before["seconds"]
