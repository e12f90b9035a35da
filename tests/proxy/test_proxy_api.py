"""Unit tests: the proxy's config (flags over DRESSAGE_* over defaults) and the OpenAI request
mapping and response shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dressage.config.proxy import ProxyConfig, ProxyConfigError, config_from_argv, parser
from dressage.proxy.errors import BadRequest
from dressage.proxy.openai_api import (
    completion_response,
    parse_chat_request,
    sse_chunk,
    sse_tool_call_deltas,
    usage_block,
)

pytestmark = pytest.mark.unit

USER = [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------------------ config
def test_defaults_are_loopback_and_tito_qwen35(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DRESSAGE_PROXY_HOST", "DRESSAGE_PROXY_TITO_MODEL", "DRESSAGE_PROXY_PORT"):
        monkeypatch.delenv(name, raising=False)
    config, level = config_from_argv([])
    assert (config.host, config.port, config.tito_model, config.token_build_mode) == (
        "127.0.0.1",
        8000,
        "qwen3.5",
        "tito",
    )
    assert not config.partial_rollout and not config.record_token_versions
    assert level == "warning"


def test_flags_win_over_env_and_env_over_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_ENGINE_URL", "http://engine-from-env:1")
    monkeypatch.setenv("DRESSAGE_PROXY_RECORD_TOKEN_VERSIONS", "1")
    monkeypatch.setenv("DRESSAGE_PROXY_TITO_MODEL", "qwen3")
    monkeypatch.setenv("DRESSAGE_PROXY_STORE_FSYNC", "true")
    config, _ = config_from_argv(
        ["--engine-url", "http://flag:2", "--token-build-model", "llama3", "--no-store-fsync"]
    )
    assert config.engine_url == "http://flag:2"
    assert config.tito_model == "llama3"  # --token-build-model is --tito-model's alias
    assert config.store_fsync is False
    assert config.record_token_versions is True  # from the environment


def test_seed_flags_land_in_config_and_segment_flags() -> None:
    config, _ = config_from_argv(
        [
            "--tito-model", "qwen3.5", "--token-build-mode", "snapshot",
            "--dressage-partial-rollout", "--record-token-versions",
            "--mask-nonlast-version-tokens", "--tokenizer-path", "/tok",
        ]
    )  # fmt: skip
    assert config.segment_flags() == {
        "tito_model": "qwen3.5",
        "token_build_mode": "snapshot",
        "dressage_partial_rollout": True,
        "record_token_versions": True,
        "mask_nonlast_version_tokens": True,
    }
    assert config.tokenizer_path == "/tok"


@pytest.mark.parametrize("spelling", ["qwen3_5", "qwen3.5"])
def test_both_spellings_of_qwen35_are_kept_as_qwen35(
    monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    # the command of the design documents: both flags, the underscore spelling
    config, _ = config_from_argv(["--token-build-model", spelling, "--tito-model", spelling])
    assert config.tito_model == "qwen3.5" and config.segment_flags()["tito_model"] == "qwen3.5"
    monkeypatch.setenv("DRESSAGE_PROXY_TITO_MODEL", spelling)
    assert config_from_argv([])[0].tito_model == "qwen3.5"
    assert ProxyConfig(tito_model=spelling).tito_model == "qwen3.5"


def test_an_unknown_family_is_refused_naming_every_spelling(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRESSAGE_PROXY_TITO_MODEL", "qwen4")
    with pytest.raises(ProxyConfigError, match="_TITO_MODEL='qwen4': .*unknown TITO") as info:
        config_from_argv([])
    assert "['qwen3.5', 'qwen3_5', 'qwen3', 'llama3', 'deepseek', 'generic']" in str(info.value)
    with pytest.raises(SystemExit) as exit_info:
        config_from_argv(["--tito-model", "qwen4"])
    assert exit_info.value.code == 2 and "invalid choice: 'qwen4'" in capsys.readouterr().err
    help_text = " ".join(parser().format_help().split())
    assert "--tito-model {qwen3.5,qwen3_5,qwen3,llama3,deepseek,generic}" in help_text
    assert "qwen3.5 (also spelled qwen3_5)" in help_text


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--host", "0.0.0.0"], "not a loopback address"),
        (["--tito-model", "generic"], "needs tokenizer_path"),
        (["--engine-url", "ftp://x"], "http(s) URL"),
        (["--admin-key", "short"], "at least 8 characters"),
        (["--max-request-bytes", "10"], "--max-request-bytes should be greater than or equal"),
    ],
)
def test_invalid_settings_fail_with_the_field(argv: list[str], needle: str) -> None:
    with pytest.raises(ProxyConfigError, match="invalid proxy settings") as info:
        config_from_argv(argv)
    (sentence,) = info.value.sentences  # one sentence, naming the flag
    assert needle in sentence


def test_public_host_with_an_admin_key_is_allowed(tmp_path: Path) -> None:
    config, _ = config_from_argv(["--host", "0.0.0.0", "--admin-key", "k" * 16])
    assert config.host == "0.0.0.0"


# ------------------------------------------------------------------------------ requests
def test_sampling_params_mapping() -> None:
    request = parse_chat_request(
        {
            "model": "m",
            "messages": USER,
            "max_tokens": 50,
            "max_completion_tokens": 40,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "stop": "END",
            "seed": 7,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.5,
            "stop_token_ids": [5],
            "chat_template_kwargs": {"enable_thinking": False},
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert request.sampling == {
        "max_new_tokens": 40,  # max_completion_tokens wins over max_tokens
        "temperature": 0.7,
        "top_p": 0.9,
        "min_p": 0.05,
        "frequency_penalty": 0.5,  # presence_penalty at its neutral 0 is left out
        "top_k": 20,
        "stop": ["END"],
        "sampling_seed": 7,
        "stop_token_ids": [5],
    }
    assert request.stream and request.include_usage
    assert request.chat_template_kwargs == {"enable_thinking": False}


def test_defaults_leave_max_tokens_to_the_proxy_default() -> None:
    assert parse_chat_request({"messages": USER}).sampling == {"max_new_tokens": None}
    request = parse_chat_request({"messages": USER, "top_k": 0}, default_max_tokens=64)
    assert request.sampling == {"max_new_tokens": 64}  # top_k 0 means off


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages"),
        ({"messages": USER, "temperature": -1}, "temperature"),
        ({"messages": USER, "top_p": 1.5}, "top_p"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "max_tokens": True}, "max_tokens"),
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "stop": [1]}, "stop"),
        ({"messages": USER, "stop": ["x"] * 33}, "stop"),
        ({"messages": USER, "seed": 2**64}, "seed"),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0]"),
        ({"messages": USER, "tools": {"a": 1}}, "tools"),
        ({"messages": USER, "tool_choice": "always"}, "tool_choice"),
        ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": USER, "response_format": {"type": "xml"}}, "response_format"),
        ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"messages": USER, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),  # fmt: skip
        ({"messages": USER, "logit_bias": {"a": 1}}, "logit_bias"),
        ({"messages": USER, "logit_bias": {"5": 101}}, "logit_bias"),
        ({"messages": USER, "reasoning_effort": "max"}, "reasoning_effort"),
        ({"messages": USER, "reasoning_effort": {"level": "low"}}, "reasoning_effort"),  # fuzz
        ({"messages": USER, "reasoning_effort": ["low"]}, "reasoning_effort"),
        (
            {
                "messages": USER,
                "reasoning_effort": "none",
                "chat_template_kwargs": {"enable_thinking": True},
            },
            "reasoning_effort",
        ),  # fmt: skip
        ({"messages": USER, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"messages": USER, "modalities": ["audio"]}, "modalities"),
        ({"messages": USER, "verbosity": "high"}, "verbosity"),
        ({"messages": USER, "not_a_field": 1}, "not_a_field"),
        ({"messages": USER, "stream": "yes"}, "stream"),
        ({"messages": USER, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ],
)
def test_bad_requests_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_chat_request(body)
    assert info.value.param == param
    assert info.value.status == 400
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_tool_choice_forms_are_accepted() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [named]}}
    for choice in ("none", "auto", "required", named, allowed):
        body = {"messages": USER, "tools": tools, "tool_choice": choice}
        assert parse_chat_request(body).tool_choice == choice


def test_openai_spellings_the_proxy_reads() -> None:
    dev = [{"role": "developer", "content": "be brief"}, *USER]
    request = parse_chat_request({"messages": dev, "top_p": 0, "reasoning_effort": "none"})
    assert request.messages[0] == {"role": "system", "content": "be brief"}
    assert request.sampling["top_k"] == 1 and "top_p" not in request.sampling  # greedy
    assert request.chat_template_kwargs == {"enable_thinking": False}
    biased = parse_chat_request({"messages": USER, "logit_bias": {"007": -100}})
    assert biased.sampling["logit_bias"] == {"7": -100.0}
    top = parse_chat_request({"messages": USER, "logprobs": True, "top_logprobs": 3})
    assert top.top_logprobs == 3


# ------------------------------------------------------------------------------ responses
def test_completion_response_shape() -> None:
    message = {"role": "assistant", "content": "hi", "reasoning_content": "think"}
    body = completion_response(
        completion_id="chatcmpl-1",
        model="m",
        message=message,
        finish_reason="stop",
        usage=usage_block(10, 2, 4),
        weight_version="3",
    )
    assert body["object"] == "chat.completion"
    assert body["choices"][0] == {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert body["metadata"] == {"weight_version": "3"}


def test_sse_chunks() -> None:
    raw = sse_chunk("c1", 5, "m", {"content": "a"}, finish_reason=None, with_usage_key=True)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    chunk = json.loads(raw[6:])
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"] == {"content": "a"}
    assert "usage" in chunk and chunk["usage"] is None
    usage = json.loads(sse_chunk("c1", 5, "m", None, usage=usage_block(1, 1, None))[6:])
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 2
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    deltas = sse_tool_call_deltas({"tool_calls": [call, call]})
    assert [d["tool_calls"][0]["index"] for d in deltas] == [0, 1]
    assert deltas[0]["tool_calls"][0]["function"]["name"] == "f"
