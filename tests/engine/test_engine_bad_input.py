"""Bad input over HTTP: each case is a clear 4xx in SGLang's shape, and the engine keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.engine_oracle import CONTEXT, MAX_BODY

pytestmark = pytest.mark.integration

OK = {"input_ids": [1000, 2000, 3000], "sampling_params": {"max_new_tokens": 2}}


def _post(url: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", timeout=60, **kwargs)


def _assert_serving(url: str) -> None:
    r = _post(url, "/generate", json=OK)
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 2


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2, 3]", "must be a JSON object"),
        (b'{"input_ids": "abc"}', "input_ids"),
        (b'{"input_ids": [1.5]}', "input_ids"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_malformed_bodies_are_400_object_errors(
    engine_url: str, content: bytes, needle: str
) -> None:
    r = _post(
        engine_url, "/generate", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    body = r.json()
    assert (body["object"], body["type"], body["code"]) == ("error", "Bad Request", 400)
    assert needle in body["message"]
    _assert_serving(engine_url)


def test_unknown_sampling_key_and_wrong_type_use_the_contract_shape(engine_url: str) -> None:
    r = _post(
        engine_url, "/generate", json={"input_ids": [5], "sampling_params": {"max_tokens": 5}}
    )
    assert r.status_code == 400 and r.json()["error"].startswith("unknown field `max_tokens`")
    r = _post(
        engine_url, "/generate", json={"input_ids": [5], "sampling_params": {"temperature": "hot"}}
    )
    assert r.status_code == 400 and r.json() == {
        "error": 'invalid type: string "hot", expected f64 (at `temperature`)'
    }


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            {"input_ids": [5], "sampling_params": {"max_new_tokens": -3}},
            "max_new_tokens must be at least 0",
        ),
        (
            {"input_ids": [5], "sampling_params": {"max_new_tokens": 10**12}},
            "maximum context length of 1024",
        ),
        ({"input_ids": [5], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
        (
            {"input_ids": [5], "sampling_params": {"temperature": -0.5}},
            "temperature must be a non-negative",
        ),
        ({"input_ids": [5, 248128]}, "outside the vocabulary [0, 248128)"),
        ({"input_ids": [-7]}, "outside the vocabulary"),
        (
            {"input_ids": [5] * CONTEXT},
            f"The input ({CONTEXT} tokens) is longer than the model's context length",
        ),
        ({"input_ids": []}, "input_ids cannot be empty."),
        ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
        ({"input_ids": [5], "sampling_params": {"n": 3}}, "not supported"),
        (
            {"input_ids": [5], "return_logprob": True, "logprob_start_len": 9},
            "logprob_start_len (9)",
        ),
    ],
)
def test_bad_values_are_400_with_a_message(
    engine_url: str, body: dict[str, Any], needle: str
) -> None:
    r = _post(engine_url, "/generate", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_oversized_body_is_413(engine_url: str) -> None:
    big = b'{"input_ids": [' + b"1," * (MAX_BODY // 2) + b"1]}"
    r = _post(engine_url, "/generate", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]["message"]
    _assert_serving(engine_url)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/abort_request", {"rid": "x", "typo": 1}),
        ("/abort_request", {"rid": 5}),
        ("/pause_generation", {"mode": "sideways"}),
        ("/continue_generation", {"torch_empty_cache": "yes"}),
        ("/update_weights_from_disk", {}),
        ("/update_weights_from_disk", {"model_path": "/x", "flush": True}),
    ],
)
def test_control_endpoints_refuse_unknown_fields_and_bad_types(
    engine_url: str, path: str, body: dict[str, Any]
) -> None:
    r = _post(engine_url, path, json=body)
    assert r.status_code == 400 and r.json()["object"] == "error", r.text
    assert httpx.get(f"{engine_url}/v1/loads").json()["loads"][0]["paused"] is None
    _assert_serving(engine_url)


@pytest.fixture(scope="module")
def secured(tiny_model_path: Path) -> Iterator[str]:
    from dressage.engine.testing import serve_engine

    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, api_key="k1", admin_api_key="adm"
    ) as url:
        yield url


def test_api_keys(secured: str) -> None:
    assert httpx.get(f"{secured}/health").status_code == 200  # always open
    r = _post(secured, "/generate", json=OK)
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    assert (
        _post(secured, "/generate", json=OK, headers={"Authorization": "Bearer k1"}).status_code
        == 200
    )
    assert (
        httpx.get(f"{secured}/model_info", headers={"Authorization": "Bearer k1"}).status_code
        == 200
    )
    # With an admin key set, only it opens the control endpoints.
    assert (
        _post(
            secured, "/abort_request", json={"rid": "x"}, headers={"Authorization": "Bearer k1"}
        ).status_code
        == 401
    )
    assert (
        _post(
            secured, "/abort_request", json={"rid": "x"}, headers={"Authorization": "Bearer adm"}
        ).status_code
        == 200
    )


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"text": "\\ud800x"}', "text holds a lone UTF-16 surrogate"),
        (b'{"text": ["ok", "\\udfffx"]}', "text[1] holds a lone UTF-16 surrogate"),
        (b'{"input_ids": [5], "rid": "\\ud800"}', "rid holds a lone UTF-16 surrogate"),
        (
            b'{"input_ids": [5], "sampling_params": {"stop": "\\udc00"}}',
            "sampling_params.stop holds a lone UTF-16 surrogate",
        ),
        (b'{"input_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeper than 64 levels"),
        (b'{"input_ids": [5], "x": ' + b"[" * 70 + b"]" * 70 + b"}", "deeper than 64 levels"),
    ],
)
def test_surrogates_and_deep_nesting_are_json_400s(
    engine_url: str, content: bytes, needle: str
) -> None:
    """Both made 500s (the tokenizer's TypeError, a RecursionError as plain text)."""
    for path in ("/generate", "/abort_request"):
        r = _post(engine_url, path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        body = r.json()
        assert (body["object"], body["code"]) == ("error", 400)
        if path == "/generate":
            assert needle in body["message"]
    _assert_serving(engine_url)
