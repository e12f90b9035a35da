"""Every field of OpenAI's chat-completions request, and SGLang's extras, as the proxy treats
them: honoured (how), passed to the engine (as what), refused (why), or ignored because it
cannot change the answer (why). ``docs/openai-api.md`` shows this table and a test holds the
two equal (tests/proxy/test_proxy_request_fields.py), each row checked against the server.

A body with a field that is in neither table is refused, naming it: a field the proxy does
not know might change the answer, and none may be dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FIELDS", "KNOWN_FIELDS", "RequestField", "unknown_fields"]

Handling = Literal["honoured", "engine", "refused", "ignored"]


@dataclass(frozen=True)
class RequestField:
    name: str
    handling: Handling
    how: str
    """How it is honoured, what the engine gets, why it is refused or why it cannot change
    the answer (one sentence, as the docs table shows it)."""
    probe: Any = None
    """A value the table's test sends: it lands in the engine body at ``engine`` (engine),
    leaves the engine body as it was (ignored) or gets a 400 naming the field (refused)."""
    engine: str | None = None
    """Where ``probe`` lands in the engine's ``/generate`` body (``a.b``), for engine fields."""
    sglang: bool = False
    """An SGLang extra, not one of OpenAI's fields."""


def _f(name: str, handling: Handling, how: str, probe: Any = None, engine: str | None = None,
       *, sglang: bool = False) -> RequestField:  # fmt: skip
    return RequestField(name, handling, how, probe, engine, sglang)


FIELDS: tuple[RequestField, ...] = (
    _f("messages", "honoured", "Rendered token-exact by TITO; `developer` messages as `system` (the Qwen and Llama templates have no developer role); unknown roles and non-text parts are a 400 naming them."),
    _f("model", "ignored", "One model is served; the name is echoed in the answer and recorded in the step.", "any-name"),
    _f("audio", "refused", "No audio output: a text model is served.", {"voice": "alloy", "format": "wav"}),
    _f("frequency_penalty", "engine", "`sampling_params.frequency_penalty` (0 is left out); the embedded engine refuses other values.", 0.5, "sampling_params.frequency_penalty"),
    _f("function_call", "refused", "Deprecated by OpenAI: use `tool_choice`.", "auto"),
    _f("functions", "refused", "Deprecated by OpenAI: use `tools`.", [{"name": "f"}]),
    _f("logit_bias", "engine", "`sampling_params.logit_bias` (token id -> bias in [-100, 100], added to the logit before sampling; ids checked against the tokenizer).", {"13": -100}, "sampling_params.logit_bias"),
    _f("logprobs", "honoured", "The answer carries `logprobs.content` (the sampled tokens' log-probs, the ones recorded), streamed too; the engine is always asked for them."),
    _f("max_completion_tokens", "engine", "`sampling_params.max_new_tokens`.", 5, "sampling_params.max_new_tokens"),
    _f("max_tokens", "engine", "`sampling_params.max_new_tokens` (when `max_completion_tokens` is not given).", 6, "sampling_params.max_new_tokens"),
    _f("metadata", "ignored", "Labels for OpenAI's dashboards; the proxy records every call anyway.", {"k": "v"}),
    _f("modalities", "refused", "Only `[\"text\"]` (or null) is accepted: no audio output.", ["text", "audio"]),
    _f("n", "refused", "Only 1: one engine call per chat call, one recorded step.", 2),
    _f("parallel_tool_calls", "honoured", "`false`: at most one tool call, enforced by constrained decoding (`sampling_params.structural_tag`)."),
    _f("prediction", "ignored", "Predicted outputs only make an answer faster, never different.", {"type": "content", "content": "x"}),
    _f("presence_penalty", "engine", "`sampling_params.presence_penalty` (0 is left out); the embedded engine refuses other values.", 0.5, "sampling_params.presence_penalty"),
    _f("prompt_cache_key", "ignored", "A cache-routing hint; the engine's prefix cache needs none.", "k"),
    _f("prompt_cache_retention", "ignored", "A cache-lifetime hint; it cannot change tokens.", "24h"),
    _f("reasoning_effort", "honoured", "`none` or `minimal` render with thinking off, `low` to `xhigh` with thinking on (`chat_template_kwargs.enable_thinking`); a contradicting `enable_thinking` is a 400."),
    _f("response_format", "honoured", "`json_schema` (strict or not) and `json_object` by constrained decoding (`sampling_params.structural_tag`, or `json_schema` for families without a reasoning block); `text` is no constraint."),
    _f("safety_identifier", "ignored", "An end-user id for OpenAI's abuse checks.", "u-1"),
    _f("seed", "engine", "`sampling_params.sampling_seed`.", 7, "sampling_params.sampling_seed"),
    _f("service_tier", "ignored", "A billing and latency tier; the same model answers.", "flex"),
    _f("stop", "engine", "`sampling_params.stop` (the matched string is cut from the text, kept in the recorded ids).", ["zz"], "sampling_params.stop"),
    _f("store", "ignored", "OpenAI-side storage; the proxy records every call itself.", True),
    _f("stream", "honoured", "Server-sent events; content is sent once it is certain to be part of the recorded message."),
    _f("stream_options", "honoured", "`include_usage` adds the usage chunk; `include_obfuscation` is ignored (padding only)."),
    _f("temperature", "engine", "`sampling_params.temperature`.", 0.5, "sampling_params.temperature"),
    _f("tool_choice", "honoured", "`none`, `required`, a named function and `allowed_tools` by constrained decoding (`sampling_params.structural_tag`); `auto` leaves the model free; a name not in `tools` is a 400."),
    _f("tools", "honoured", "Rendered by the chat template (always, so that changing `tool_choice` never rewrites the prompt); calls are parsed; `function.strict: true` constrains that tool's arguments to its schema."),
    _f("top_logprobs", "engine", "Top-level `top_logprobs_num`; the answer's `top_logprobs` lists (needs `logprobs: true`).", 2, "top_logprobs_num"),
    _f("top_p", "engine", "`sampling_params.top_p`; `0` is greedy, as OpenAI reads it (`top_k: 1`).", 0.5, "sampling_params.top_p"),
    _f("user", "ignored", "An end-user id for OpenAI's abuse checks.", "u-1"),
    _f("verbosity", "refused", "Only `medium` (or null): the model has no verbosity control, and rewriting the prompt would break the recording.", "low"),
    _f("web_search_options", "refused", "No web search: the proxy answers from the model alone.", {}),
    _f("top_k", "engine", "`sampling_params.top_k` (0 and -1 mean off).", 3, "sampling_params.top_k", sglang=True),
    _f("min_p", "engine", "`sampling_params.min_p`.", 0.1, "sampling_params.min_p", sglang=True),
    _f("repetition_penalty", "engine", "`sampling_params.repetition_penalty` (1 is left out); the embedded engine refuses other values.", 1.1, "sampling_params.repetition_penalty", sglang=True),
    _f("min_tokens", "engine", "`sampling_params.min_new_tokens`; the embedded engine refuses it.", 2, "sampling_params.min_new_tokens", sglang=True),
    _f("stop_token_ids", "engine", "`sampling_params.stop_token_ids`, added to the family's turn-end tokens.", [13], "sampling_params.stop_token_ids", sglang=True),
    _f("ignore_eos", "engine", "`sampling_params.ignore_eos`.", True, "sampling_params.ignore_eos", sglang=True),
    _f("chat_template_kwargs", "honoured", "Passed to the chat template (`enable_thinking` must be a boolean).", sglang=True),
)  # fmt: skip

KNOWN_FIELDS = frozenset(f.name for f in FIELDS)


def unknown_fields(body: dict[str, Any]) -> list[str]:
    """The body's top-level keys that neither table names."""
    return sorted(key for key in body if key not in KNOWN_FIELDS)
