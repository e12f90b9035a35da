"""TITO's tiktoken encoder gives the backend's ids, and is used only where its checks pass."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dressage.assets import load_family_tokenizer, load_tokenizer
from dressage.proxy.tito.base import SwitchingDecoder, SwitchingEncoder, make_decoder, make_encoder
from dressage.proxy.tito.tiktoken_encode import (
    TiktokenEncoder,
    byte_level_alphabet,
    tiktoken_encoder,
)
from tests.helpers import REPO

pytestmark = pytest.mark.unit

VOCABS = ("qwen3.5", "qwen3")
ATOMS = [
    *"aZ09 .,:;!?{}[]()\"'`<>|/\\=_-+*#@$%&~^",
    *["\n", "\r\n", "\r", "\t", "   ", "\u00a0", "\u3000", "\u2028", "\u200b", "\ufeff"],
    *["'s", "'T", "'re", "'VE", "'m", "'ll", "'d", "don't", "I'M"],
    *["é", "e\u0301", "A\u030a", "\u0915\u094d\u0937", "\u1100\u1161\u11a8", "ﬁ", "Å", "Ω"],
    *["数据", "日本語のテキスト", "한국어", "עברית", "العربية", "Ελληνικά", "кириллица"],
    *["😀", "👨\u200d👩\u200d👧", "🇫🇷", "1️⃣", "\U0001f3fd", "𝔘𝔫𝔦"],
    *["123", "4567890", "3.14", "1e-9", "0x1F", "٣٤", "½", "²"],
]
PARTIALS = ["<think", "</think", "im_end|>", "<|", "|>", "<tool_", "_call>", "<|im_start"]


def _text(added: list[str]) -> st.SearchStrategy[str]:
    piece = st.one_of(
        st.sampled_from(ATOMS),
        st.sampled_from(added),
        st.sampled_from(PARTIALS),
        st.text(max_size=8),
        st.text(alphabet=st.characters(categories=["Mn", "Mc", "Me", "Zs", "Nd"]), max_size=4),
    )
    return st.lists(piece, max_size=40).map("".join)


def _reference(tokenizer: Any) -> Any:
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module", params=VOCABS)
def pair(request: pytest.FixtureRequest) -> tuple[TiktokenEncoder, Any]:
    tokenizer = load_tokenizer(request.param)
    fast = tiktoken_encoder(tokenizer)
    assert fast is not None, f"{request.param} should take the tiktoken path"
    assert make_encoder(tokenizer) is fast  # once built, the verdict and encoder are cached
    return fast, tokenizer


def _added(tokenizer: Any) -> list[str]:
    return [str(t) for t in tokenizer.added_tokens_encoder]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_text_gets_the_backend_ids(
    pair: tuple[TiktokenEncoder, Any], data: st.DataObject
) -> None:
    fast, tokenizer = pair
    text = data.draw(_text(_added(tokenizer)))
    assert fast(text) == _reference(tokenizer)(text)


def _corpus() -> list[str]:
    from bench.proxy import OUTPUT_TEXT, SYSTEM, TOOLS, _tool_result

    rng = random.Random(7)
    texts = [OUTPUT_TEXT, SYSTEM, json.dumps(TOOLS), json.dumps(TOOLS, indent=2)]
    texts += [_tool_result(rng, lines) for lines in (1, 8, 40, 200)]
    for path in sorted((REPO / "dressage").rglob("*")):
        if path.is_file() and path.suffix in {".py", ".jinja", ".md", ".json", ".toml", ".txt"}:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def _chunks(text: str, rng: random.Random) -> list[str]:
    out, at = [], 0
    while at < len(text):
        size = rng.choice((1, 7, 100, 600, 4000))
        out.append(text[at : at + size])
        at += size
    return out


def test_bench_texts_and_the_source_tree_get_the_backend_ids(
    pair: tuple[TiktokenEncoder, Any],
) -> None:
    fast, tokenizer = pair
    reference = _reference(tokenizer)
    rng = random.Random(11)
    count = 0
    for text in _corpus():
        for chunk in [text, *_chunks(text, rng)]:
            assert fast(chunk) == reference(chunk), chunk[:200]
            count += 1
    assert count > 1000


def _tie_texts(tokenizer: Any) -> list[str]:
    """Text around every token ``T == x+y == y+z`` whose backend merge ``(y, z)`` comes before
    ``(x, y)``: where the backend's tie-break (merge order) and tiktoken's (leftmost) differ."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab, index = model["vocab"], {tuple(m): i for i, m in enumerate(model["merges"])}
    alphabet = byte_level_alphabet()
    texts = []
    for token in vocab:
        for k in range(1, len(token)):
            x, y, z = token[:-k], token[:k], token[k:]
            if token[-k:] != y or (x, y) == (y, z) or not {x, y, z} <= vocab.keys():
                continue
            if index[(x, y)] > index[(y, z)]:
                for chars in (x + y + z, x + token, token + z):
                    raw = bytes(alphabet[c] for c in chars)
                    texts.append(raw.decode("utf-8", errors="ignore"))
    return texts


def test_text_where_the_tie_breaks_differ_gets_the_backend_ids(
    pair: tuple[TiktokenEncoder, Any],
) -> None:
    fast, tokenizer = pair
    reference = _reference(tokenizer)
    texts = _tie_texts(tokenizer)
    assert len(texts) > 1000
    for text in texts:
        for variant in (text, f" {text}", text * 2):
            assert fast(variant) == reference(variant), variant


def test_added_tokens_keep_their_ids_wherever_they_are(pair: tuple[TiktokenEncoder, Any]) -> None:
    fast, tokenizer = pair
    for token, token_id in tokenizer.added_tokens_encoder.items():
        for text in (token, f"x{token}y", f" {token} ", f"{token}{token}", token[:-1], token[1:]):
            assert fast(text) == _reference(tokenizer)(text)
        assert fast(token) == [token_id]


def test_a_lone_surrogate_is_refused_as_by_the_backend(pair: tuple[TiktokenEncoder, Any]) -> None:
    fast, tokenizer = pair
    with pytest.raises(TypeError):
        _reference(tokenizer)("a\ud800b")
    with pytest.raises(UnicodeEncodeError):
        fast("a\ud800b")


def test_the_byte_level_alphabet_covers_every_byte_once() -> None:
    table = byte_level_alphabet()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n") and table["a"] == ord("a")


def _modified(change: Any) -> Any:
    """A copy of the Qwen3 tokenizer whose backend JSON went through ``change``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(load_tokenizer("qwen3").backend_tokenizer.to_str())
    change(spec)
    backend = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def _nfkc(spec: dict[str, Any]) -> None:
    spec["normalizer"] = {"type": "NFKC"}


def _use_regex(spec: dict[str, Any]) -> None:
    spec["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = True


def _lstrip(spec: dict[str, Any]) -> None:
    spec["added_tokens"][5]["lstrip"] = True


def _swap_merges(spec: dict[str, Any]) -> None:
    merges = spec["model"]["merges"]
    merges[100], merges[5000] = merges[5000], merges[100]


def _drop_merge(spec: dict[str, Any]) -> None:
    del spec["model"]["merges"][3]


def _merges_on_whole_pieces(spec: dict[str, Any]) -> None:
    spec["model"]["ignore_merges"] = False  # as in real Qwen model folders


def _prefix_processor(spec: dict[str, Any]) -> None:
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}]
        + [{"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {
            "<|im_start|>": {"id": "<|im_start|>", "ids": [151644], "tokens": ["<|im_start|>"]}
        },
    }


CHANGES = [_nfkc, _use_regex, _lstrip, _swap_merges, _drop_merge, _merges_on_whole_pieces]


@pytest.mark.parametrize("change", [*CHANGES, _prefix_processor])
def test_a_tokenizer_failing_a_check_keeps_the_backend_path(change: Any) -> None:
    tokenizer = _modified(change)
    assert tiktoken_encoder(tokenizer) is None
    encode = make_encoder(tokenizer)  # known already: no thread
    assert not isinstance(encode, TiktokenEncoder | SwitchingEncoder)
    text = "ﬁne <think>x</think> Å"
    assert encode(text) == tokenizer.encode(text, add_special_tokens=False)


def test_the_unchanged_copy_takes_the_tiktoken_path() -> None:
    tokenizer = _modified(lambda spec: None)
    fast = tiktoken_encoder(tokenizer)
    assert fast is not None
    text = "ﬁne <think>x</think> Å 日本語"
    assert fast(text) == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_family_tokenizers_take_the_fast_path_only_with_equal_ids(family: Any) -> None:
    tokenizer = load_family_tokenizer(family)
    encode = make_encoder(tokenizer)
    rng = random.Random(3)
    for text in [*_corpus()[:6], "日本語 1234567 don't  \r\n\n x😀"]:
        for chunk in _chunks(text, rng):
            assert encode(chunk) == tokenizer.encode(chunk, add_special_tokens=False)


def test_a_new_tokenizer_is_encoded_at_once_and_switches_to_tiktoken_when_built() -> None:
    """Nothing waits for the build: the backend encodes until tiktoken's encoder is there."""
    tokenizer = _modified(lambda spec: None)
    encode = make_encoder(tokenizer)
    assert isinstance(encode, SwitchingEncoder)
    text = "x <tool_call>{}</tool_call> Å"
    assert encode(text) == tokenizer.encode(text, add_special_tokens=False)  # either encoder
    decode = make_decoder(tokenizer)
    assert isinstance(decode, SwitchingDecoder)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert decode(ids) == _backend_text(tokenizer, ids)  # either decoder
    assert encode.built.wait(120), "the tiktoken encoder was never built"
    assert isinstance(encode.encode, TiktokenEncoder)
    assert encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert make_encoder(tokenizer) is encode.encode
    assert decode(ids) == _backend_text(tokenizer, ids)
    assert decode.decode.__qualname__.startswith("_tiktoken_decoder")  # switched on its own


def _backend_text(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False))


def test_every_id_and_broken_byte_runs_decode_as_by_the_backend(
    pair: tuple[TiktokenEncoder, Any],
) -> None:
    """Every id alone, then random runs that mix the single-byte tokens (which split UTF-8
    sequences, so that the text holds replacement characters), added tokens and the rest:
    tiktoken's text is the backend's, replacement characters included."""
    fast, tokenizer = pair
    assert fast.decodes
    backend = tokenizer.backend_tokenizer
    size = backend.get_vocab_size(with_added_tokens=True)
    singles = [fast.decode([i]) for i in range(size)]
    assert singles == [_backend_text(tokenizer, [i]) for i in range(size)]
    bytes_alone = [i for i in range(size) if len(fast.encoding.decode_single_token_bytes(i)) == 1]
    assert len(bytes_alone) == 256
    added = [fast.encoding.encode_single_token(t) for t in fast.encoding.special_tokens_set]
    rng = random.Random(11)
    broken = 0
    for _ in range(3000):
        pool = rng.choice([bytes_alone, added, range(size)])
        ids = [rng.choice(pool) if rng.random() < 0.6 else rng.randrange(size) for _ in range(12)]
        text = fast.decode(ids)
        assert text == _backend_text(tokenizer, ids), ids
        broken += "\ufffd" in text
    assert broken > 100  # the runs did split sequences


def test_decoding_takes_tiktoken_once_built_and_the_backend_for_an_id_it_lacks() -> None:
    tokenizer = load_tokenizer("qwen3.5")
    fast = tiktoken_encoder(tokenizer)
    assert fast is not None
    decode = make_decoder(tokenizer)  # known already: no switching
    assert not isinstance(decode, SwitchingDecoder)
    ids = tokenizer.encode(
        "<think>\nI é 日本 😀\n</think>\n\nok<|im_end|>", add_special_tokens=False
    )
    assert decode(ids) == _backend_text(tokenizer, ids)
    past = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True) + 5
    with pytest.raises(KeyError):
        fast.decode([past, *ids])
    assert decode([past, *ids]) == _backend_text(tokenizer, [past, *ids])  # skipped, as there


def _strip_decoder(spec: dict[str, Any]) -> None:
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [spec["decoder"], {"type": "Strip", "content": " ", "start": 1, "stop": 0}],
    }


def _latin1_added_token(spec: dict[str, Any]) -> None:
    spec["added_tokens"][5]["content"] = "<é>"


@pytest.mark.parametrize("change", [_strip_decoder, _latin1_added_token])
def test_a_tokenizer_that_decodes_otherwise_keeps_the_backend_decoder(change: Any) -> None:
    """Its ids still encode through tiktoken; its text comes from the backend."""
    tokenizer = _modified(change)
    fast = tiktoken_encoder(tokenizer)
    assert fast is not None and not fast.decodes
    decode = make_decoder(tokenizer)
    ids = tokenizer.encode(" ab <é> <think>", add_special_tokens=False)
    assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=False)


def test_a_tokenizer_class_that_decodes_its_own_way_keeps_it() -> None:
    from transformers import PreTrainedTokenizerFast

    class Shouting(PreTrainedTokenizerFast):
        def _decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(super()._decode(token_ids, **kwargs)).upper()

    tokenizer = Shouting(tokenizer_object=_modified(lambda spec: None).backend_tokenizer)
    fast = tiktoken_encoder(tokenizer)
    assert fast is not None and fast.decodes  # tiktoken could decode its ids, but not its way
    ids = tokenizer.encode("abc <think>", add_special_tokens=False)
    assert make_decoder(tokenizer)(ids) == "ABC <THINK>"
