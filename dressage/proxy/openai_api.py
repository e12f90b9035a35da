"""The OpenAI chat API as the proxy speaks it: request → sampling params, message → response.

Requests are checked by hand (no pydantic model of the message list: it is the hot path, and
TITO validates messages itself, naming the offending index). Mapping to SGLang sampling params:

    max_completion_tokens | max_tokens → max_new_tokens   (neither: the proxy's default, or
                                                            the engine's context limit)
    temperature, top_p, presence_penalty, frequency_penalty → same name
    stop (str | list) → stop;  seed → sampling_seed;  n must be 1
    SGLang extras: top_k (0 means off), min_p, repetition_penalty, min_tokens → min_new_tokens,
    stop_token_ids (added to the family's turn-end tokens), ignore_eos, chat_template_kwargs

Every field of OpenAI's request is accounted for in :mod:`~dressage.proxy.request_fields`
(``docs/openai-api.md``); a field in neither of its tables is refused, naming it. ``tool_choice``,
``response_format``, ``parallel_tool_calls`` and strict tools become the engine's constraint
(:mod:`~dressage.proxy.constraints`). ``top_p: 0`` is greedy (``top_k: 1``, as OpenAI reads it),
``developer`` messages are rendered as ``system``, ``top_logprobs`` is the engine's
``top_logprobs_num``, ``logit_bias`` its ``sampling_params.logit_bias``. A tool's
``parameters`` must be a JSON object (a JSON Schema), a message's ``role`` a string, and
``chat_template_kwargs.enable_thinking`` a boolean. The body's schema, for the OpenAPI document,
is in :mod:`~dressage.proxy.openai_schema`.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import TYPE_CHECKING, Any

from dressage.http_json import dumps as fast_dumps
from dressage.proxy.errors import BadRequest
from dressage.proxy.request_fields import unknown_fields

if TYPE_CHECKING:
    from dressage.proxy.generation_controller import GoneSignal

__all__ = [
    "SSE_DONE",
    "ChatRequest",
    "completion_response",
    "dumps",
    "new_completion_id",
    "parse_chat_request",
    "sse_chunk",
    "sse_tool_call_deltas",
    "usage_block",
]

_TOOL_CHOICES = ("none", "auto", "required")
_REASONING_EFFORTS = {"none": False, "minimal": False, "low": True, "medium": True,
                      "high": True, "xhigh": True}  # fmt: skip
MAX_TOP_LOGPROBS = 20
"""OpenAI's bound on ``top_logprobs``."""


def dumps(obj: Any) -> bytes:
    """Compact JSON in UTF-8 (:func:`dressage.http_json.dumps`: orjson where it writes the same)."""
    return fast_dumps(obj)


def new_completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(16)}"


class ChatRequest:
    """A checked ``POST /v1/chat/completions`` body."""

    __slots__ = (
        "chat_template_kwargs",
        "client_gone",
        "include_usage",
        "logprobs",
        "messages",
        "model",
        "parallel_tool_calls",
        "partial_rollout",
        "response_format",
        "sampling",
        "stream",
        "tool_choice",
        "tools",
        "top_logprobs",
    )

    def __init__(
        self,
        *,
        messages: list[dict[str, Any]],
        model: str,
        stream: bool,
        include_usage: bool,
        tools: list[dict[str, Any]] | None,
        tool_choice: str | dict[str, Any] | None,
        chat_template_kwargs: dict[str, Any],
        sampling: dict[str, Any],
        logprobs: bool,
        partial_rollout: bool = False,
        top_logprobs: int = 0,
        parallel_tool_calls: bool = True,
        response_format: dict[str, Any] | None = None,
    ) -> None:
        self.messages = messages
        self.model = model
        self.stream = stream
        self.include_usage = include_usage
        self.tools = tools
        self.tool_choice = tool_choice
        self.chat_template_kwargs = chat_template_kwargs
        self.sampling = sampling
        """SGLang ``sampling_params`` (the session adds the family's stop tokens)."""
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        """Candidates per position in the answer's log-probs (the engine's top_logprobs_num)."""
        self.parallel_tool_calls = parallel_tool_calls
        self.response_format = response_format
        """``json_schema`` or ``json_object`` (checked); None for text."""
        self.partial_rollout = partial_rollout
        """The call's ``X-Dressage-Partial-Rollout: 1`` header (set by the server, not the body)."""
        self.client_gone: GoneSignal | None = None
        """Set by the server when the agent's connection closes (see ``sessions``)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _number(body: dict[str, Any], key: str, lo: float, hi: float, *, lo_open: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if not _is_number(value) or value > hi or value < lo or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise BadRequest(f"{key} must be a number in {bound}, got {value!r}", param=key)
    return value


def _int(body: dict[str, Any], key: str, lo: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < lo:
        raise BadRequest(f"{key} must be an integer >= {lo}, got {value!r}", param=key)
    return int(value)


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(
            f"stop must be a string or a list of strings, got {value!r:.100}", param="stop"
        )
    if len(stops) > 32:
        raise BadRequest(f"stop has {len(stops)} strings; at most 32 are allowed", param="stop")
    return stops


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest("tools must be a list of function tools", param="tools")
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise BadRequest(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}, "
                f"got {tool!r:.200}",
                param=f"tools[{i}]",
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise BadRequest(
                f"tools[{i}].function.parameters must be a JSON Schema object, got "
                f"{type(parameters).__name__} {parameters!r:.100}",
                param=f"tools[{i}].function.parameters",
            )
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise BadRequest(
                f"tools[{i}].function.strict must be true or false, got {strict!r:.100}",
                param=f"tools[{i}].function.strict",
            )
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(
                f"tools[{i}].function.description must be a string, got {description!r:.100}",
                param=f"tools[{i}].function.description",
            )
    return value or None


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any] | None:
    if value is None or value in _TOOL_CHOICES:
        return value
    names = [t["function"]["name"] for t in tools or ()]
    kind = value.get("type", "function") if isinstance(value, dict) else None
    if kind == "allowed_tools":
        allowed = value.get("allowed_tools")
        refs = allowed.get("tools") if isinstance(allowed, dict) else None
        mode = allowed.get("mode", "auto") if isinstance(allowed, dict) else None
        if not isinstance(refs, list) or not refs or mode not in ("auto", "required"):
            raise BadRequest(
                "tool_choice allowed_tools must be {'mode': 'auto' | 'required', 'tools': "
                f"[{{'type': 'function', 'function': {{'name': ...}}}}, ...]}}, got {value!r:.200}",
                param="tool_choice",
            )
        for ref in refs:
            function = ref.get("function") if isinstance(ref, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str):
                raise BadRequest(
                    f"tool_choice allowed_tools entry {ref!r:.100} names no function",
                    param="tool_choice",
                )
            _check_named(name, names)
        return value
    function = value.get("function") if isinstance(value, dict) else None
    if kind == "function" and isinstance(function, dict) and isinstance(function.get("name"), str):
        _check_named(function["name"], names)
        return value
    raise BadRequest(
        f"tool_choice must be one of {_TOOL_CHOICES}, "
        "{'type': 'function', 'function': {'name': ...}} or "
        f"{{'type': 'allowed_tools', 'allowed_tools': {{...}}}}, got {value!r:.200}",
        param="tool_choice",
    )


def _check_named(name: str, names: list[str]) -> None:
    if name not in names:
        raise BadRequest(
            f"tool_choice names the tool {name!r}, which is not in tools ({names})",
            param="tool_choice",
        )


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return value
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if (
            isinstance(spec, dict)
            and isinstance(spec.get("name"), str)
            and (schema is None or isinstance(schema, dict))
        ):
            return value
        raise BadRequest(
            "response_format json_schema must be {'type': 'json_schema', 'json_schema': "
            f"{{'name': ..., 'schema': {{...}}, 'strict': ...}}}}, got {value!r:.200}",
            param="response_format",
        )
    raise BadRequest(
        "response_format must be {'type': 'text' | 'json_object' | 'json_schema', ...}, got "
        f"{value!r:.200}",
        param="response_format",
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    unknown = unknown_fields(body)
    if unknown:
        raise BadRequest(
            f"unknown field {unknown[0]!r}: the proxy reads OpenAI's chat fields and a few of "
            "SGLang's (see docs/openai-api.md), and drops none silently",
            param=unknown[0],
        )
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest(f"n must be 1 (one engine call per chat call), got {n!r}", param="n")
    if body.get("functions") is not None or body.get("function_call") is not None:
        param = "functions" if body.get("functions") is not None else "function_call"
        raise BadRequest("functions/function_call are deprecated: use tools", param=param)
    modalities = body.get("modalities")
    if modalities is not None and (
        not isinstance(modalities, list) or any(m != "text" for m in modalities)
    ):
        raise BadRequest(
            f"modalities {modalities!r:.100} is not supported (only 'text': no audio output)",
            param="modalities",
        )
    for key, allowed, why in (
        ("audio", (None,), "no audio output: a text model is served"),
        ("verbosity", (None, "medium"), "only 'medium': the model has no verbosity control"),
        ("web_search_options", (None,), "no web search: the proxy answers from the model alone"),
    ):
        if body.get(key) not in allowed:
            raise BadRequest(f"{key} {body[key]!r:.100} is not supported ({why})", param=key)


def _sampling(body: dict[str, Any], default_max_tokens: int | None) -> dict[str, Any]:
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    sampling: dict[str, Any] = {
        "max_new_tokens": max_tokens if max_tokens is not None else default_max_tokens
    }
    for key, lo, hi, lo_open, target in (
        ("temperature", 0.0, 2.0, False, "temperature"),
        ("top_p", 0.0, 1.0, False, "top_p"),
        ("min_p", 0.0, 1.0, False, "min_p"),
        ("presence_penalty", -2.0, 2.0, False, "presence_penalty"),
        ("frequency_penalty", -2.0, 2.0, False, "frequency_penalty"),
        ("repetition_penalty", 0.0, 2.0, True, "repetition_penalty"),
    ):
        value = _number(body, key, lo, hi, lo_open=lo_open)
        # Penalties at their neutral value are left out: some engines refuse the key at all.
        neutral = 1.0 if key == "repetition_penalty" else 0.0
        if value is not None and not (key.endswith("penalty") and value == neutral):
            sampling[target] = value
    if sampling.get("top_p") == 0:  # OpenAI reads top_p 0 as greedy; SGLang wants (0, 1]
        del sampling["top_p"]
        sampling["top_k"] = 1
    top_k = body.get("top_k")
    if top_k is not None and sampling.get("top_k") != 1:
        if not _is_int(top_k) or top_k < -1:
            raise BadRequest(f"top_k must be -1, 0 (off) or >= 1, got {top_k!r}", param="top_k")
        if top_k > 0:
            sampling["top_k"] = top_k
    min_tokens = _int(body, "min_tokens", 0)
    if min_tokens:
        sampling["min_new_tokens"] = min_tokens
    stop = _stop(body.get("stop"))
    if stop:
        sampling["stop"] = stop
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed) or not -(2**63) <= seed < 2**63:
            raise BadRequest(f"seed must be a 64-bit integer, got {seed!r}", param="seed")
        sampling["sampling_seed"] = seed
    extra_stops = body.get("stop_token_ids")
    if extra_stops is not None:
        if not isinstance(extra_stops, list) or not all(_is_int(t) for t in extra_stops):
            raise BadRequest("stop_token_ids must be a list of integers", param="stop_token_ids")
        sampling["stop_token_ids"] = list(extra_stops)
    logit_bias = body.get("logit_bias")
    if logit_bias is not None:
        sampling["logit_bias"] = _logit_bias(logit_bias)
    ignore_eos = body.get("ignore_eos")
    if ignore_eos is not None:
        if not isinstance(ignore_eos, bool):
            raise BadRequest("ignore_eos must be a boolean", param="ignore_eos")
        sampling["ignore_eos"] = ignore_eos
    return sampling


def _logit_bias(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise BadRequest("logit_bias must be a map of token id to bias", param="logit_bias")
    out = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise BadRequest(
                f"logit_bias key {key!r:.50} is not a token id (a decimal string)",
                param="logit_bias",
            )
        if not _is_number(bias) or not -100 <= bias <= 100:
            raise BadRequest(
                f"logit_bias[{key!r}] must be a number in [-100, 100], got {bias!r:.50}",
                param="logit_bias",
            )
        out[str(int(key))] = float(bias)
    return out


def _thinking(body: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``reasoning_effort`` as the chat template's ``enable_thinking``."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return kwargs
    if not isinstance(effort, str) or effort not in _REASONING_EFFORTS:  # a dict is unhashable
        raise BadRequest(
            f"reasoning_effort must be one of {sorted(_REASONING_EFFORTS)}, got {effort!r:.50}",
            param="reasoning_effort",
        )
    thinking = _REASONING_EFFORTS[effort]
    given = kwargs.get("enable_thinking")
    if given is not None and given is not thinking:
        raise BadRequest(
            f"reasoning_effort {effort!r} asks thinking {'on' if thinking else 'off'}, "
            f"chat_template_kwargs.enable_thinking says {given}",
            param="reasoning_effort",
        )
    return {**kwargs, "enable_thinking": thinking}


def _developer_as_system(messages: list[Any]) -> list[Any]:
    if not any(isinstance(m, dict) and m.get("role") == "developer" for m in messages):
        return messages
    return [
        {**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer" else m
        for m in messages
    ]


def _top_logprobs(body: dict[str, Any], logprobs: bool) -> int:
    top = body.get("top_logprobs")
    if top is None:
        return 0
    if not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise BadRequest(
            f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r:.50}",
            param="top_logprobs",
        )
    if top and not logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return int(top)


def parse_chat_request(body: Any, *, default_max_tokens: int | None = None) -> ChatRequest:
    """Check a chat body; :class:`~dressage.proxy.errors.BadRequest` names the field."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(
                f"messages[{i}] must be an object, got {message!r:.100}", param="messages"
            )
        role = message.get("role")
        if not isinstance(role, str):
            raise BadRequest(
                f"messages[{i}].role must be a string, got {type(role).__name__} {role!r:.100}",
                param=f"messages[{i}].role",
            )
    _refuse_unsupported(body)
    model = body.get("model", "")
    stream = body.get("stream")
    stream = False if stream is None else stream  # null: the default, as OpenAI reads it
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise BadRequest(
            f"chat_template_kwargs.enable_thinking must be true or false, got {thinking!r:.100}",
            param="chat_template_kwargs.enable_thinking",
        )
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise BadRequest("logprobs must be a boolean", param="logprobs")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    tools = _tools(body.get("tools"))
    return ChatRequest(
        messages=_developer_as_system(messages),
        model=model if isinstance(model, str) else str(model),
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        chat_template_kwargs=_thinking(body, kwargs),
        sampling=_sampling(body, default_max_tokens),
        logprobs=logprobs,
        top_logprobs=_top_logprobs(body, logprobs),
        parallel_tool_calls=parallel is not False,
        response_format=_response_format(body.get("response_format")),
    )


# ------------------------------------------------------------------------------ responses
def usage_block(prompt_tokens: int, completion_tokens: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def completion_response(
    *,
    completion_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    usage: dict[str, Any],
    weight_version: str,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": logprobs} if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
        "metadata": {"weight_version": weight_version},
    }


def sse_chunk(
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, Any] | None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    with_usage_key: bool = False,
    logprobs: list[dict[str, Any]] | None = None,
) -> bytes:
    """One ``data: {...}\\n\\n`` event of a ``chat.completion.chunk`` stream. ``delta=None``
    is the usage-only chunk (``choices: []``) sent last when ``include_usage`` is set;
    ``logprobs`` are the entries of the tokens this chunk stands for (when asked)."""
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": []
        if delta is None
        else [
            {
                "index": 0,
                "delta": delta,
                "logprobs": {"content": logprobs} if logprobs else None,
                "finish_reason": finish_reason,
            }
        ],
    }
    if with_usage_key or usage is not None:
        chunk["usage"] = usage
    return b"data: " + dumps(chunk) + b"\n\n"


def sse_tool_call_deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One delta per tool call, whole (id, name and all arguments in one piece)."""
    calls = message.get("tool_calls") or ()
    return [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(calls)]


SSE_DONE = b"data: [DONE]\n\n"
