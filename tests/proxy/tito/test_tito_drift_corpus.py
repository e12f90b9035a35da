"""Evidence with the real Qwen3.5 tokenizer: naive re-tokenization drifts, TITO does not.

Run with ``-s`` to see the table. A turn drifts when the ids sent to the engine do not start with
the ids it was sent and produced the turn before: ids already trained on changed under them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from dressage.proxy.tito import TITOTokenizer
from dressage.proxy.tito.replay import drift_turns, replay_naive, replay_tito
from dressage.testing.tito_corpus import drop_history_reasoning, qwen35_drift_corpus

pytestmark = pytest.mark.unit

CATEGORIES = {
    "tool_output_mid_word",
    "trailing_whitespace",
    "code",
    "cjk",
    "emoji",
    "numbers",
    "json_arguments",
    "reasoning_history",
    "thinking_off",
}


def test_naive_retokenization_drifts_and_tito_does_not(qwen35: TITOTokenizer) -> None:
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for conv in qwen35_drift_corpus():
        tito = replay_tito(qwen35, conv)
        naive = replay_naive(qwen35, conv)
        stock = replay_naive(qwen35, conv, rewrite=drop_history_reasoning)
        row = table[conv.category]
        row[0] += len(conv.turns)
        row[1] += drift_turns(naive.calls)
        row[2] += drift_turns(stock.calls)
        row[3] += drift_turns(tito.calls)
        assert tito.boundaries == [], (conv.name, tito.boundaries)
        assert tito.state is not None
        last = tito.calls[-1]
        assert tito.state.ids[: len(last.input_ids) + len(last.output_ids)] == (
            last.input_ids + last.output_ids
        )
        _check_loss_mask(tito.state.loss_mask, tito.calls)
    print(f"\n{'category':22} turns naive stock-template tito")
    for category, (turns, naive_drift, stock_drift, tito_drift) in sorted(table.items()):
        print(f"{category:22} {turns:5} {naive_drift:5} {stock_drift:14} {tito_drift:4}")
    assert sum(row[3] for row in table.values()) == 0
    assert sum(row[1] for row in table.values()) > 0
    assert sum(row[2] for row in table.values()) > 0
    for category in CATEGORIES:
        assert table[category][1] + table[category][2] > 0, f"{category} shows no naive drift"


def _check_loss_mask(mask: list[int], calls: Any) -> None:
    expected = [0] * len(mask)
    for call in calls:
        start = len(call.input_ids)
        expected[start : start + len(call.output_ids)] = [1] * len(call.output_ids)
    assert mask == expected
