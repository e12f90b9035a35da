"""The embedded engine's logit_bias, top_logprobs_num and grammar (json_schema, regex, ebnf,
structural_tag) sampling parameters, against a real engine over HTTP and a full forward."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import httpx
import pytest
import torch

from tests.engine.engine_oracle import full_forward_logprobs

pytestmark = pytest.mark.integration


def _post(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/generate", json=body, timeout=120)


def _gen(url: str, **body: Any) -> dict[str, Any]:
    r = _post(url, **body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _prompt(seed: int, n: int = 12) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 200_000) for _ in range(n)]


def _next_logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def test_logit_bias_moves_the_argmax_and_the_logprob_is_the_biased_one(
    engine_url: str, reference_model: Any
) -> None:
    prompt = _prompt(11)
    logits = _next_logits(reference_model, prompt)
    first, second = torch.topk(logits, 2).indices.tolist()
    params = {"max_new_tokens": 1, "temperature": 0, "logit_bias": {str(first): -100.0}}
    out = _gen(engine_url, input_ids=prompt, sampling_params=params, return_logprob=True)
    assert out["output_ids"] == [second]
    biased = logits.clone()
    biased[first] -= 100.0
    expected = float(torch.log_softmax(biased, 0)[second])
    assert out["meta_info"]["output_token_logprobs"][0][0] == pytest.approx(expected, abs=1e-4)


def test_top_logprobs_num_returns_the_most_likely_tokens(
    engine_url: str, reference_model: Any
) -> None:
    prompt = _prompt(12)
    out = _gen(
        engine_url,
        input_ids=prompt,
        sampling_params={"max_new_tokens": 3, "ignore_eos": True},
        return_logprob=True,
        top_logprobs_num=4,
    )
    meta = out["meta_info"]
    tops = meta["output_top_logprobs"]
    assert len(tops) == 3 and all(len(top) == 4 for top in tops)
    ids = prompt
    for top, token in zip(tops, out["output_ids"], strict=True):
        expected = torch.log_softmax(_next_logits(reference_model, ids), 0)
        values, best = torch.topk(expected, 4)
        assert [t[1] for t in top] == best.tolist()
        assert [t[0] for t in top] == pytest.approx(values.tolist(), abs=1e-4)
        ids = [*ids, token]
    # the sampled tokens' own log-probs are unchanged by asking for candidates
    got = [e[0] for e in meta["output_token_logprobs"]]
    want = full_forward_logprobs(reference_model, prompt, out["output_ids"], 1.0)
    assert got == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize(
    ("kind", "value", "check"),
    [
        ("regex", "(yes|no)", lambda text: text in ("yes", "no")),
        (
            "json_schema",
            json.dumps(
                {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                    "additionalProperties": False,
                }
            ),
            lambda text: isinstance(json.loads(text)["ok"], bool),
        ),
        ("ebnf", 'root ::= "a" | "bb"', lambda text: text in ("a", "bb")),
    ],
)
def test_a_grammar_constrains_the_output_and_logprobs_are_of_the_masked_distribution(
    engine_url: str, reference_model: Any, kind: str, value: str, check: Any
) -> None:
    prompt = _prompt(13)
    out = _gen(
        engine_url,
        input_ids=prompt,
        sampling_params={kind: value, "max_new_tokens": 64, "sampling_seed": 3},
        return_logprob=True,
    )
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out["meta_info"]
    assert check(out["text"]), out["text"]
    # every token's log-prob is log_softmax over the tokens the grammar allowed at that step,
    # so it is at least the unconstrained log-prob (the mass of masked tokens is moved)
    got = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
    free = full_forward_logprobs(reference_model, prompt, out["output_ids"], 1.0)
    assert all(g >= f - 1e-4 for g, f in zip(got, free, strict=True))
    assert any(g > f + 1e-3 for g, f in zip(got, free, strict=True))
    assert all(math.isfinite(g) and g <= 0 for g in got)


def test_a_schema_that_cannot_compile_is_a_400_naming_its_part(engine_url: str) -> None:
    schema = {"type": "object", "properties": {"when": {"type": "datetime"}}}
    r = _post(
        engine_url,
        input_ids=_prompt(14),
        sampling_params={"json_schema": json.dumps(schema), "max_new_tokens": 4},
    )
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "json_schema" in message and "datetime" in message


def test_bad_logit_bias_and_two_grammars_are_refused(engine_url: str) -> None:
    prompt = _prompt(15)
    for params, needle in [
        ({"logit_bias": {"abc": 1.0}}, "logit_bias key 'abc'"),
        ({"logit_bias": {"999999999": 1.0}}, "logit_bias key '999999999'"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "Only one of"),
    ]:
        r = _post(engine_url, input_ids=prompt, sampling_params={**params, "max_new_tokens": 2})
        assert r.status_code == 400, r.text
        assert needle in r.text
    negative = _post(engine_url, input_ids=prompt, top_logprobs_num=-1)
    assert negative.status_code == 400 and "top_logprobs_num" in negative.text
