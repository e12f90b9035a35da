"""Request parsing and response shaping of the /generate wire format (no server)."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.engine.protocol import (
    BodyError,
    ContractError,
    EngineLimits,
    RequestError,
    build_requests,
    output_json,
    parse_body,
    parse_sampling_params,
)
from dressage.engine.request import ABORTED_WAITING, FinishReason, Request
from dressage.engine.sampling import SamplingParams

pytestmark = pytest.mark.unit

LIMITS = EngineLimits(vocab_size=1000, context_length=256, max_total_tokens=10_000)


class _Tok:
    """Each id decodes to "<id>"; id 999 is special."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if (t == 999 and skip_special_tokens) else f"<{t}>" for t in ids)


def _build(body: dict[str, Any]) -> list[Request]:
    return build_requests(parse_body(body), _Tok(), LIMITS)


def test_defaults_and_null_mean_default() -> None:
    params = parse_sampling_params({"temperature": None, "top_k": None}, vocab_size=10)
    assert params == SamplingParams()
    assert parse_sampling_params({"max_new_tokens": None}, vocab_size=10).max_new_tokens is None


def test_unknown_sampling_key_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match=r"unknown field `max_tokens`, expected one of"):
        parse_sampling_params({"max_tokens": 3}, vocab_size=10)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"temperature": "x"}, 'invalid type: string "x", expected f64'),
        ({"max_new_tokens": 1.5}, "invalid type: floating point `1.5`, expected u32"),
        ({"ignore_eos": 1}, "invalid type: integer `1`, expected a boolean"),
        ({"stop_token_ids": [1, "a"]}, "expected a sequence of integers"),
        ({"top_k": True}, "invalid type: boolean `true`, expected i32"),
    ],
)
def test_wrong_types_are_contract_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        parse_sampling_params(raw, vocab_size=10)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5."),
        ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
        ({"temperature": -1}, "temperature must be a non-negative finite number, got -1."),
        ({"top_k": 0}, r"top_k must be -1 \(disable\) or at least 1, got 0."),
        ({"min_p": 2.0}, r"min_p must be in \[0, 1\]"),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"stop": ["x"] * 33}, "at most 32 stop strings"),
        ({"stop_token_ids": [10]}, r"outside the vocabulary \[0, 10\)"),
        ({"sampling_seed": 2**64}, "int64"),
        ({"n": 2}, "n=2 is not supported"),
        ({"regex": "a", "ebnf": "b"}, "Only one of json_schema, regex, ebnf"),
        ({"frequency_penalty": 0.5}, "frequency_penalty=0.5 is not supported"),
    ],
)
def test_bad_values_are_request_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_sampling_params(raw, vocab_size=10)


def test_greedy_and_temperature_rules() -> None:
    assert parse_sampling_params({"temperature": 0}, vocab_size=10).greedy
    assert parse_sampling_params({"temperature": 5e-7}, vocab_size=10).inv_temperature == 1.0
    warm = parse_sampling_params({"temperature": 0.5}, vocab_size=10)
    assert not warm.greedy and warm.inv_temperature == 2.0
    assert parse_sampling_params({"top_k": 1, "temperature": 0.5}, vocab_size=10).greedy


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ([1, 2], BodyError, "must be a JSON object"),
        ({"input_ids": [1, "a"]}, BodyError, "input_ids"),
        ({"input_ids": [1], "stream": "yes"}, BodyError, "stream"),
        ({}, RequestError, "Either text, input_ids or input_embeds should be provided."),
        ({"text": "a", "input_ids": [1]}, RequestError, "Either text, input_ids"),
        ({"input_ids": []}, RequestError, "input_ids cannot be empty."),
        ({"input_ids": [1, 1000]}, RequestError, r"\[1000\] contain values outside"),
        ({"input_ids": [-1]}, RequestError, "outside the vocabulary"),
        ({"input_ids": list(range(256))}, RequestError, r"The input \(256 tokens\) is longer"),
        (
            {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 250}},
            RequestError,
            "You requested a total of 260 tokens: 10 tokens from the input messages and 250",
        ),
        (
            {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 3},
            RequestError,
            r"logprob_start_len \(3\) is larger than the prompt length \(2\)",
        ),
        ({"input_ids": [[1], [2]], "stream": True}, RequestError, "streaming a batch"),
        ({"input_ids": [1], "lora_path": "x"}, RequestError, "lora_path is not supported"),
        ({"input_ids": [1], "top_logprobs_num": -2}, RequestError, "top_logprobs_num"),
        ({"input_ids": [[1], [2]], "rid": ["a"]}, RequestError, "rid has 1 entries"),
    ],
)
def test_request_errors(body: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build_requests(parse_body(body), _Tok(), LIMITS)


def test_unknown_top_level_keys_are_ignored_and_null_max_means_context() -> None:
    (req,) = _build(
        {"input_ids": [1, 2, 3], "whatever": 1, "sampling_params": {"max_new_tokens": None}}
    )
    assert req.max_new_tokens == LIMITS.context_length - 3


def test_batch_rids_and_per_item_params() -> None:
    reqs = _build(
        {
            "text": ["ab", "c"],
            "rid": "r",
            "sampling_params": [{"max_new_tokens": 3}, {"max_new_tokens": 4}],
        }
    )
    assert [r.rid for r in reqs] == ["r_0", "r_1"]
    assert [r.prompt_ids for r in reqs] == [[97, 98], [99]]
    assert [r.max_new_tokens for r in reqs] == [3, 4]


def _finished(req: Request, ids: list[int], reason: FinishReason) -> Request:
    for t in ids:
        req.append(t, -0.5, "v1")
    req.started = True
    req.set_finished(reason, "v1")
    return req


def test_output_keeps_stop_token_in_ids_and_trims_text() -> None:
    (req,) = _build({"input_ids": [5, 6], "return_logprob": True, "logprob_start_len": 0})
    req.input_logprobs = [None, -1.25]
    _finished(req, [7, 8, 42], FinishReason("stop", matched=42))
    out = output_json(req, _Tok(), final=True, weight_version="v2")
    assert out["output_ids"] == [7, 8, 42]
    assert out["text"] == "<7><8>"
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": 42}
    assert meta["weight_version"] == "v1"  # the version that produced the tokens
    assert meta["weight_versions"] == [{"version": "v1", "start": 0, "end": 3}]
    assert meta["output_token_logprobs"] == [[-0.5, 7, None], [-0.5, 8, None], [-0.5, 42, None]]
    assert meta["input_token_logprobs"] == [[None, 5, None], [-1.25, 6, None]]
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (2, 3, 0)


def test_stop_string_trim_and_no_stop_trim() -> None:
    for no_trim, text in ((False, "<7>"), (True, "<7><8><9>")):
        (req,) = _build({"input_ids": [1], "sampling_params": {"no_stop_trim": no_trim}})
        _finished(req, [7, 8, 9], FinishReason("stop", matched="<8>"))
        assert output_json(req, _Tok(), final=True, weight_version="v")["text"] == text


def test_waiting_abort_has_no_prompt_or_cached_tokens() -> None:
    (req,) = _build({"input_ids": [1]})
    req.set_finished(ABORTED_WAITING, "v")
    meta = output_json(req, _Tok(), final=True, weight_version="v")["meta_info"]
    assert meta["finish_reason"]["message"] == "Abort in waiting queue"
    assert "prompt_tokens" not in meta and "cached_tokens" not in meta
    assert meta["completion_tokens"] == 0 and "e2e_latency" in meta


def test_check_stop_order_length_then_token_then_string() -> None:
    params = SamplingParams(stop=("<3>",), stop_token_ids=frozenset({3}))
    req = Request(rid="r", prompt_ids=[1], params=params, max_new_tokens=2)
    req.append(2, 0.0, "v")
    decode = _Tok().decode
    assert req.check_stop(frozenset({9}), decode) is None
    req.append(3, 0.0, "v")
    assert req.check_stop(frozenset({9}), decode) == FinishReason("length", length=2)
    req2 = Request(rid="r2", prompt_ids=[1], params=params, max_new_tokens=5)
    req2.append(3, 0.0, "v")
    assert req2.check_stop(frozenset(), decode) == FinishReason("stop", matched=3)
    req3 = Request(
        rid="r3", prompt_ids=[1], params=SamplingParams(stop=("<4><5>",)), max_new_tokens=9
    )
    for t in (4, 5):
        req3.append(t, 0.0, "v")
    assert req3.check_stop(frozenset(), decode) == FinishReason("stop", matched="<4><5>")
    eos_ignored = Request(
        rid="r4", prompt_ids=[1], params=SamplingParams(ignore_eos=True), max_new_tokens=9
    )
    eos_ignored.append(9, 0.0, "v")
    assert eos_ignored.check_stop(frozenset({9}), decode) is None
