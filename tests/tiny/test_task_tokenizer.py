"""The small Qwen3.5-format vocabulary of the embedded default's tiny models."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.assets import load_tokenizer
from dressage.proxy.tito import create_tito_tokenizer
from dressage.tiny.model import TinyModelSpec, tiny_model_dir, vocab_dir
from dressage.tiny.task_tokenizer import TASK_VOCAB, VOCAB_SIZE, task_tokenizer_dir
from dressage.tiny.teachers import teacher_transcripts

ADDED = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(str(task_tokenizer_dir()))


def test_the_qwen35_added_tokens_follow_the_learnt_vocabulary_as_single_ids(tokenizer: Any) -> None:
    ids = {t: tokenizer.encode(t, add_special_tokens=False) for t in ADDED}
    assert all(len(v) == 1 for v in ids.values()), ids
    assert min(v[0] for v in ids.values()) >= 256  # after the byte alphabet and the merges
    assert len(tokenizer) <= VOCAB_SIZE + 33
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    # control tokens are special (skipped on decode), markup is text the model writes
    text = "<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>"
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True) == (
        "assistant\n<tool_call>x</tool_call>"
    )


@pytest.mark.parametrize(
    "text", ["Compute 41 * 7.", "naïve façade 你好 🚀", "  spaces\n\n\ttabs", "x" * 300, ""]
)
def test_any_text_round_trips_through_the_byte_level_fallback(tokenizer: Any, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_digits_are_single_tokens_as_in_qwen35(tokenizer: Any) -> None:
    pieces = tokenizer.tokenize("1234 + 56")
    assert [p for p in pieces if p.strip("Ġ").isdigit()] == ["1", "2", "3", "4", "5", "6"]


def test_tito_qwen35_runs_the_ideal_transcripts_append_only_on_it(tokenizer: Any) -> None:
    tito = create_tito_tokenizer(tokenizer, "qwen3.5")
    transcripts = teacher_transcripts(
        ("calculator", "lookup"), 4, seed=3, tokenizer_dir=task_tokenizer_dir()
    )
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for t in transcripts:
        assert len(t.ids) == len(t.loss_mask)
        trained = [i for i, m in zip(t.ids, t.loss_mask, strict=True) if m]
        assert trained.count(im_end) == 2  # two assistant turns, each closed
        assert tito.decode(t.ids).count("<tool_response>") == 1
        # shorter than the real vocabulary's: every call of the demo's 24-token turns fits
        first_turn = t.loss_mask.index(0, t.loss_mask.index(1)) - t.loss_mask.index(1)
        assert first_turn <= 24


def test_a_tiny_model_on_it_has_the_small_embedding() -> None:
    spec = TinyModelSpec(vocab=TASK_VOCAB)
    path = tiny_model_dir(spec)
    import json

    config = json.loads((path / "config.json").read_text())
    tokenizer = load_tokenizer(str(path))
    assert len(tokenizer) <= config["vocab_size"] < len(tokenizer) + 64
    assert vocab_dir(TASK_VOCAB) == task_tokenizer_dir()


def test_an_unknown_vocabulary_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'qwen9'"):
        vocab_dir("qwen9")
