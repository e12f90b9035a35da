"""The encode memo returns exactly the tokenizer's ids, for any text around any added tokens."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.proxy.encoding import PieceMemoEncoder, exact_added_tokens, install_encode_memo
from dressage.proxy.tito import TITOTokenizer, create_tito_tokenizer

pytestmark = pytest.mark.unit

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endoftext|>"]
ATOMS = [*"ab xyz\n\t  .,:;{}\"'<>|/=_-", "é", "e\u0301", "数据", "😀", "\u200b", "A\u030a"]
TEXT = st.lists(st.sampled_from(ATOMS), max_size=30).map("".join)
PARTIAL = st.sampled_from(["<think", "im_end|>", "<|", "</"])
PIECES = st.lists(st.one_of(TEXT, st.sampled_from(SPECIALS), PARTIAL))


@pytest.fixture(scope="module")
def memo(qwen35_tokenizer: Any) -> tuple[PieceMemoEncoder, TITOTokenizer]:
    tito = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
    added = exact_added_tokens(qwen35_tokenizer)
    assert added is not None and added["<|im_end|>"] == 248046
    return PieceMemoEncoder(tito.encode, added, min_chars=1, max_chars=400), tito


@settings(max_examples=400, deadline=None)
@given(PIECES)
def test_memo_ids_are_the_tokenizer_ids(
    memo: tuple[PieceMemoEncoder, TITOTokenizer], pieces: list[str]
) -> None:
    encoder, tito = memo
    text = "".join(pieces)
    expected = tito.encode(text)
    assert encoder(text) == expected
    assert encoder(text) == expected  # again, from the memo


def test_long_repeated_prompts_come_from_the_memo(qwen35_tokenizer: Any) -> None:
    tito = create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")
    plain = tito.encode
    assert install_encode_memo(tito) and not install_encode_memo(tito)  # once
    system = {"role": "system", "content": "You are a careful agent. " * 60}
    ids = [
        tito.start([system, {"role": "user", "content": task}]).delta_ids
        for task in ("first task", "second task")
    ]
    tito.start([system, {"role": "user", "content": "third task"}])
    assert isinstance(tito.encode, PieceMemoEncoder) and tito.encode.hits == 1  # 2nd sight in
    for task, got in zip(("first task", "second task"), ids, strict=True):
        text = tito.render_conversation([system, {"role": "user", "content": task}])
        assert got == plain(text)


def test_tokenizers_with_stripping_added_tokens_get_no_memo() -> None:
    class Backend:
        def to_str(self) -> str:
            return '{"added_tokens": [{"id": 1, "content": "<x>", "lstrip": true}]}'

    class Tokenizer:
        backend_tokenizer = Backend()

    assert exact_added_tokens(Tokenizer()) is None  # type: ignore[arg-type]
