"""Offline tokenizers for chat families other than Qwen: the project's own byte-level BPE.

No package in the dependency set ships a Llama 3 or DeepSeek vocabulary, so these are trained here,
deterministically, on synthetic text (prose, code, numbers, CJK, emoji), with the family's own
split regex and the family's special tokens added after the learnt vocabulary (where the real
models keep them too). They exercise the chat formats exactly: turn tokens are single special ids,
and ordinary text is byte-level BPE with real merge behaviour. They carry the family's pinned
chat template::

    from dressage.assets.family_tokenizers import load_family_tokenizer
    tok = load_family_tokenizer("llama3")      # or "deepseek"; built once (about 2 s), cached
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dressage.assets._cache import cached_build

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["FAMILY_TOKENIZERS", "FamilyName", "family_tokenizer_dir", "load_family_tokenizer"]

FamilyName = Literal["llama3", "deepseek"]
_RECIPE_VERSION = 1
_VOCAB_SIZE = 6000

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek splits in three passes: digit groups, CJK runs, then words and punctuation.
_DEEPSEEK_SPLITS = (
    r"\p{N}{1,3}",
    r"[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)


@dataclass(frozen=True)
class _Family:
    name: FamilyName
    splits: tuple[str, ...]
    control: tuple[str, ...]
    """Special tokens skipped by ``skip_special_tokens``."""
    markup: tuple[str, ...]
    """Added tokens the model writes as text (tool markup, reasoning tags)."""
    bos: str
    eos: str
    pad: str


FAMILY_TOKENIZERS: dict[str, _Family] = {
    "llama3": _Family(
        name="llama3",
        splits=(_LLAMA3_SPLIT,),
        control=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
            "<|finetune_right_pad_id|>",
        ),
        markup=(),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        pad="<|finetune_right_pad_id|>",
    ),
    "deepseek": _Family(
        name="deepseek",
        splits=_DEEPSEEK_SPLITS,
        control=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
        markup=(
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁outputs▁begin｜>",
            "<｜tool▁outputs▁end｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
            "<｜tool▁sep｜>",
            "<think>",
            "</think>",
        ),
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        pad="<｜▁pad▁｜>",
    ),
}

_WORDS = (
    "the of and to in is that for it with as was on be by this are from or an at which file "
    "function return value error result path line test data model token tool call user "
    "assistant system message internationalization configuration request response segment "
    "search weather temperature Paris London Tokyo hello world because however therefore"
).split()
_CODE = (
    "def main(argv):\n    return 0\n",
    "for i in range(10):\n    print(i * 2)\n",
    'if __name__ == "__main__":\n    sys.exit(main())\n',
    "const x = await fetch(url);\nconsole.log(x.status);\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n',
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;\n",
)
_CJK = ("你好世界", "今日は良い天気です", "数据模型", "東京タワー", "中文文本测试")
_EMOJI = ("🎉", "👍🏽", "🚀", "❤️", "👨‍👩‍👧")


def _corpus(seed: int, lines: int) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.55:
            words = rng.choices(_WORDS, k=rng.randint(4, 18))
            yield " ".join(words).capitalize() + rng.choice((".", "?", "!", ":", "\n", "  \n"))
        elif kind < 0.75:
            yield rng.choice(_CODE)
        elif kind < 0.85:
            yield " ".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(5))
        else:
            yield rng.choice(_CJK) + " " + rng.choice(_EMOJI) + " " + rng.choice(_WORDS)


def _build(family: _Family, template: str, out: Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in family.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(_corpus(seed=0, lines=20000), trainer=trainer)
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in family.control]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.markup])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.pad,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.chat_template = template
    fast.save_pretrained(str(out))


def family_tokenizer_dir(family: FamilyName) -> Path:
    """Folder of the family's tokenizer (built on first use)."""
    from dressage.proxy.tito.template_utils import load_pinned_template

    spec = FAMILY_TOKENIZERS[family]
    template = load_pinned_template(family)
    recipe = {
        "kind": "family-tokenizer",
        "family": family,
        "version": _RECIPE_VERSION,
        "vocab_size": _VOCAB_SIZE,
        "template_sha": hashlib.sha256(template.encode()).hexdigest()[:16],
    }
    return cached_build("tokenizers", recipe, lambda out: _build(spec, template, out))


@functools.cache
def load_family_tokenizer(family: FamilyName) -> PreTrainedTokenizerBase:
    """The family's tokenizer as a ``PreTrainedTokenizerFast`` with its pinned chat template."""
    if family not in FAMILY_TOKENIZERS:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(FAMILY_TOKENIZERS)}")
    from dressage.assets.tokenizers import load_tokenizer

    return load_tokenizer(str(family_tokenizer_dir(family)))
