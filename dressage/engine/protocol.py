"""The SGLang ``/generate`` wire format: request parsing, validation and response shaping.

Three kinds of rejection, each with SGLang's error shape (docs/sglang.md section 7):

- :class:`BodyError`: the body is not JSON or fails the top-level schema,
  ``{"object": "error", "message", "type": "Bad Request", "param": null, "code": 400}``;
- :class:`ContractError`: an unknown ``sampling_params`` key or a wrongly typed value (0.5.23's
  JSON contract), ``{"error": "<message>"}``;
- :class:`RequestError`: a value SGLang's normalisation refuses (range checks, context length,
  empty input, duplicate rid), ``{"error": {"message": "<message>"}}``.

Top-level keys this engine does not know are ignored, as SGLang does; known SGLang features that
the engine does not implement are refused with a :class:`RequestError` naming them. Strings that
are not Unicode text (a lone surrogate escape) and nesting past 64 levels are refused while the
body is read (:mod:`dressage.http_json`). :func:`generate_openapi` describes the body for the
OpenAPI document (the route reads it by hand).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError

from dressage.engine.grammar import GRAMMAR_KEYS, GrammarError, Grammars
from dressage.engine.request import Request
from dressage.engine.sampling import SamplingParams

_INT64 = (-(2**63), 2**63 - 1)
_MAX_STOP_STRINGS = 32


class BodyError(ValueError):
    pass


class ContractError(ValueError):
    pass


class RequestError(ValueError):
    pass


# ------------------------------------------------------------------------------ sampling params
# key -> (type name in serde's words, default that means "not used")
_SAMPLING_KEYS: dict[str, tuple[str, Any]] = {
    "max_new_tokens": ("u32", 128),
    "min_new_tokens": ("u32", 0),
    "temperature": ("f64", 1.0),
    "top_p": ("f64", 1.0),
    "top_k": ("i32", -1),
    "min_p": ("f64", 0.0),
    "frequency_penalty": ("f64", 0.0),
    "presence_penalty": ("f64", 0.0),
    "repetition_penalty": ("f64", 1.0),
    "stop": ("a string or a sequence of strings", None),
    "stop_token_ids": ("a sequence of integers", None),
    "stop_regex": ("a string or a sequence of strings", None),
    "ignore_eos": ("a boolean", False),
    "skip_special_tokens": ("a boolean", True),
    "spaces_between_special_tokens": ("a boolean", True),
    "no_stop_trim": ("a boolean", False),
    "n": ("u32", 1),
    "json_schema": ("a string", None),
    "regex": ("a string", None),
    "ebnf": ("a string", None),
    "structural_tag": ("a string", None),
    "logit_bias": ("a map", None),
    "sampling_seed": ("i64", None),
    "stream_interval": ("u32", None),
    "custom_params": ("a map", None),
}
# Known to SGLang, not implemented here: any value other than the default is refused.
_UNSUPPORTED = (
    "min_new_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "stop_regex",
    "n",
)  # fmt: skip


def _describe(value: Any) -> str:
    """A JSON value the way serde's error messages name it."""
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "a sequence"
    if isinstance(value, dict):
        return "a map"
    return "null"


def _check_type(key: str, value: Any, expected: str) -> Any:
    ok: bool
    if expected in {"u32", "i32", "i64"}:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected == "f64":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif expected == "a boolean":
        ok = isinstance(value, bool)
    elif expected == "a string":
        ok = isinstance(value, str)
    elif expected == "a map":
        ok = isinstance(value, dict)
    elif expected == "a sequence of integers":
        ok = isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        )
    else:  # a string or a sequence of strings
        ok = isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        )
    if not ok:
        raise ContractError(f"invalid type: {_describe(value)}, expected {expected} (at `{key}`)")
    return value


def parse_sampling_params(raw: Any, *, vocab_size: int) -> SamplingParams:
    """Check one ``sampling_params`` object: contract (keys, types), then values."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ContractError(
            f"invalid type: {_describe(raw)}, expected a map (at `sampling_params`)"
        )
    unknown = sorted(set(raw) - set(_SAMPLING_KEYS))
    if unknown:
        expected = ", ".join(f"`{k}`" for k in _SAMPLING_KEYS)
        raise ContractError(f"unknown field `{unknown[0]}`, expected one of {expected}")
    values = {}
    for key, value in raw.items():
        if value is not None:  # null means "the default"
            values[key] = _check_type(key, value, _SAMPLING_KEYS[key][0])
    _verify(values, vocab_size)
    logit_bias = _logit_bias(values.get("logit_bias"), vocab_size)
    grammar = next(((k, values[k]) for k in GRAMMAR_KEYS if k in values), None)
    stop = values.get("stop") or ()
    # An explicit null max_new_tokens means "up to the context length"; absent means 128.
    unlimited = "max_new_tokens" in raw and raw["max_new_tokens"] is None
    return SamplingParams(
        max_new_tokens=None if unlimited else values.get("max_new_tokens", 128),
        temperature=float(values.get("temperature", 1.0)),
        top_p=float(values.get("top_p", 1.0)),
        top_k=int(values.get("top_k", -1)),
        min_p=float(values.get("min_p", 0.0)),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=frozenset(values.get("stop_token_ids") or ()),
        ignore_eos=values.get("ignore_eos", False),
        skip_special_tokens=values.get("skip_special_tokens", True),
        spaces_between_special_tokens=values.get("spaces_between_special_tokens", True),
        no_stop_trim=values.get("no_stop_trim", False),
        sampling_seed=values.get("sampling_seed"),
        stream_interval=values.get("stream_interval") or 1,
        logit_bias=logit_bias,
        grammar=grammar,
    )


def _logit_bias(raw: dict[str, Any] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """SGLang's ``logit_bias``: token id (a decimal string) -> a finite number added to its
    logit; the ids must lie in the vocabulary."""
    out = []
    for key, value in (raw or {}).items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else -1
        if not 0 <= token < vocab_size:
            raise RequestError(
                f"logit_bias key {key!r} is not a token id in the vocabulary [0, {vocab_size})."
            )
        if not _finite_number(value):
            raise RequestError(f"logit_bias[{key!r}] must be a finite number, got {value!r}.")
        out.append((token, float(value)))
    return tuple(out)


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _verify(v: dict[str, Any], vocab_size: int) -> None:
    """SGLang's ``SamplingParams.verify`` messages, plus this engine's unsupported features."""
    temperature = v.get("temperature", 1.0)
    if not math.isfinite(temperature) or temperature < 0:
        raise RequestError(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = v.get("top_p", 1.0)
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {top_p}.")
    top_k = v.get("top_k", -1)
    if top_k != -1 and top_k < 1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    min_p = v.get("min_p", 0.0)
    if not 0 <= min_p <= 1:
        raise RequestError(f"min_p must be in [0, 1], got {min_p}.")
    max_new = v.get("max_new_tokens")
    if max_new is not None and max_new < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {max_new}.")
    stop = v.get("stop")
    if isinstance(stop, list) and len(stop) > _MAX_STOP_STRINGS:
        raise RequestError(
            f"at most {_MAX_STOP_STRINGS} stop strings are allowed, got {len(stop)}."
        )
    if stop is not None and any(s == "" for s in ([stop] if isinstance(stop, str) else stop)):
        raise RequestError("stop strings must not be empty.")
    bad_ids = [t for t in v.get("stop_token_ids") or () if not 0 <= t < vocab_size]
    if bad_ids:
        raise RequestError(
            f"stop_token_ids {bad_ids[:5]} are outside the vocabulary [0, {vocab_size})."
        )
    seed = v.get("sampling_seed")
    if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
        raise RequestError(f"sampling_seed must fit in int64, got {seed}.")
    interval = v.get("stream_interval")
    if interval is not None and interval < 1:
        raise RequestError(f"stream_interval must be at least 1, got {interval}.")
    grammars = [k for k in ("json_schema", "regex", "ebnf", "structural_tag") if k in v]
    if len(grammars) > 1:
        raise RequestError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    for key in _UNSUPPORTED:
        if key in v and v[key] not in (_SAMPLING_KEYS[key][1], [], {}):
            raise RequestError(
                f"sampling_params.{key}={v[key]!r} is not supported by the embedded engine "
                f"(only the default {_SAMPLING_KEYS[key][1]!r})."
            )


# ------------------------------------------------------------------------------ /generate body
class GenerateBody(BaseModel):
    """Top-level ``/generate`` fields (unknown ones are ignored, as SGLang does)."""

    model_config = ConfigDict(extra="ignore")

    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    input_embeds: Any = None
    sampling_params: Any = None
    rid: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: StrictInt | list[StrictInt] = -1
    top_logprobs_num: StrictInt | list[StrictInt] = 0
    token_ids_logprob: Any = None
    return_text_in_logprobs: StrictBool = False
    return_prompt_token_ids: StrictBool = False
    return_hidden_states: Any = False
    return_routed_experts: Any = False
    session_params: Any = None
    session_id: Any = None
    lora_path: Any = None
    custom_logit_processor: Any = None
    priority: Any = None


_UNSUPPORTED_TOP = (
    "input_embeds", "token_ids_logprob", "return_hidden_states", "return_routed_experts",
    "session_params", "session_id", "lora_path", "custom_logit_processor", "priority",
)  # fmt: skip


_SCHEMA_TYPES: dict[str, dict[str, Any]] = {
    "u32": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
    "i32": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
    "i64": {"type": "integer", "minimum": _INT64[0], "maximum": _INT64[1]},
    "f64": {"type": "number"},
    "a boolean": {"type": "boolean"},
    "a string": {"type": "string"},
    "a map": {"type": "object"},
    "a sequence of integers": {"type": "array", "items": {"type": "integer"}},
    "a string or a sequence of strings": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
    },
}


def generate_openapi() -> dict[str, Any]:
    """The ``/generate`` request body for the OpenAPI document (``openapi_extra``)."""
    sampling = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            key: {"anyOf": [_SCHEMA_TYPES[kind], {"type": "null"}]}
            for key, (kind, _) in _SAMPLING_KEYS.items()
        },
    }
    body = GenerateBody.model_json_schema()
    body["properties"]["sampling_params"] = {
        "anyOf": [sampling, {"type": "array", "items": sampling}, {"type": "null"}]
    }
    content = {"application/json": {"schema": body}}
    return {"requestBody": {"required": True, "content": content}}


def parse_body(payload: Any) -> GenerateBody:
    if not isinstance(payload, dict):
        raise BodyError(f"the request body must be a JSON object, got {type(payload).__name__}")
    try:
        return GenerateBody.model_validate(payload)
    except ValidationError as exc:
        raise BodyError(_pydantic_message(exc)) from None


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class EngineLimits:
    """What request validation needs to know about the serving engine."""

    vocab_size: int
    context_length: int
    max_total_tokens: int


def _pick(value: Any, i: int, n: int, name: str) -> Any:
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{name} has {len(value)} entries for a batch of {n}.")
        return value[i]
    return value


def build_requests(
    body: GenerateBody, tokenizer: Any, limits: EngineLimits, grammars: Grammars | None = None
) -> list[Request]:
    """Normalise a body into one :class:`Request` per prompt (SGLang's checks and messages).
    A grammar (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``) is compiled here, so
    one that cannot be is refused before anything is generated."""
    for key in _UNSUPPORTED_TOP:
        value = getattr(body, key)
        if value not in (None, False):
            raise RequestError(f"{key} is not supported by the embedded engine.")
    if any(t < 0 for t in _as_list(body.top_logprobs_num)):
        raise RequestError(f"top_logprobs_num must be at least 0, got {body.top_logprobs_num}.")
    if (body.text is None) == (body.input_ids is None):
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    prompts = _prompts(body, tokenizer)
    n = len(prompts)
    if n == 0:
        raise RequestError("the batch is empty.")
    if body.stream and n > 1:
        raise RequestError("streaming a batch is not supported by the embedded engine.")
    rids = _rids(body.rid, n)
    requests = []
    for i, ids in enumerate(prompts):
        params = parse_sampling_params(
            _pick(body.sampling_params, i, n, "sampling_params"), vocab_size=limits.vocab_size
        )
        matcher = None
        if params.grammar is not None:
            if grammars is None:
                raise RequestError("this engine was started without a grammar backend.")
            try:
                matcher = grammars.matcher(grammars.compile(*params.grammar))
            except GrammarError as exc:
                raise RequestError(str(exc)) from None
        requests.append(
            _one_request(
                rid=rids[i],
                ids=ids,
                params=params,
                return_logprob=bool(_pick(body.return_logprob, i, n, "return_logprob")),
                logprob_start_len=int(_pick(body.logprob_start_len, i, n, "logprob_start_len")),
                stream=body.stream,
                limits=limits,
            )
        )
        requests[-1].grammar = matcher
        requests[-1].top_logprobs_num = int(_pick(body.top_logprobs_num, i, n, "top_logprobs_num"))
    return requests


def is_batch(body: GenerateBody) -> bool:
    """A list of texts or of id lists is a batch (answered with a JSON array), even of one."""
    ids: list[Any] | None = body.input_ids
    return isinstance(body.text, list) or bool(ids and isinstance(ids[0], list))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _prompts(body: GenerateBody, tokenizer: Any) -> list[list[int]]:
    if body.text is not None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        return [list(tokenizer.encode(t)) for t in texts]
    ids: list[Any] | None = body.input_ids
    assert ids is not None
    return [list(p) for p in ids] if is_batch(body) else [list(ids)]


def _rids(rid: str | list[str] | None, n: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(rid, list):
        if len(rid) != n:
            raise RequestError(f"rid has {len(rid)} entries for a batch of {n}.")
        return rid
    return [rid] if n == 1 else [f"{rid}_{i}" for i in range(n)]


def _one_request(
    *,
    rid: str,
    ids: list[int],
    params: SamplingParams,
    return_logprob: bool,
    logprob_start_len: int,
    stream: bool,
    limits: EngineLimits,
) -> Request:
    if not ids:
        raise RequestError("input_ids cannot be empty.")
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise RequestError(
            f"The input_ids {bad[:5]} contain values outside the vocabulary "
            f"[0, {limits.vocab_size})."
        )
    context, n = limits.context_length, len(ids)
    if n >= context:
        raise RequestError(
            f"The input ({n} tokens) is longer than the model's context length ({context} tokens)."
        )
    max_new = params.max_new_tokens if params.max_new_tokens is not None else context - n
    if n + max_new > context:
        raise RequestError(
            "Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {n + max_new} tokens: {n} tokens from "
            f"the input messages and {max_new} tokens for the completion. Please reduce the number "
            "of tokens in the input messages or the completion to fit within the limit."
        )
    if n + max_new > limits.max_total_tokens:
        raise RequestError(
            f"The request needs {n + max_new} KV positions ({n} prompt + {max_new} new tokens), "
            f"more than the engine's KV budget of {limits.max_total_tokens} (--max-total-tokens)."
        )
    if return_logprob and logprob_start_len > n:
        raise RequestError(
            f"logprob_start_len ({logprob_start_len}) is larger than the prompt length ({n})."
        )
    return Request(
        rid=rid,
        prompt_ids=ids,
        params=params,
        max_new_tokens=max_new,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        stream=stream,
    )


# ------------------------------------------------------------------------------ responses
def output_json(
    req: Request,
    tokenizer: Any,
    *,
    final: bool,
    weight_version: str,
    return_text_in_logprobs: bool = False,
    return_prompt_token_ids: bool = False,
) -> dict[str, Any]:
    """One ``/generate`` result object (a whole response, or a cumulative stream chunk)."""
    n = len(req.output_ids)  # read first: logprobs are appended before ids
    ids = req.output_ids[:n]
    finish = req.finish if final else None
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": finish.to_json() if finish is not None else None,
        "weight_version": (req.finish_version if final else None) or weight_version,
        "completion_tokens": n,
    }
    if req.started or finish is None or finish.type != "abort":
        meta |= {
            "prompt_tokens": len(req.prompt_ids),
            "cached_tokens": 0,
            "reasoning_tokens": 0,
            "num_retractions": req.num_retractions,
        }
    meta["weight_versions"] = [
        {"version": v, "start": start, "end": end} for v, start, end in req.weight_spans
    ]
    if final and req.finished_at is not None:
        meta["e2e_latency"] = req.finished_at - req.created
    if req.return_logprob:
        decode_one = (
            (lambda t: tokenizer.decode([t], skip_special_tokens=False))
            if return_text_in_logprobs
            else (lambda t: None)
        )
        meta["output_token_logprobs"] = [
            [lp, tok, decode_one(tok)] for lp, tok in zip(req.output_logprobs[:n], ids, strict=True)
        ]
        meta["output_token_logprobs_length"] = n
        start = len(req.prompt_ids) if req.logprob_start_len < 0 else req.logprob_start_len
        meta["input_token_logprobs"] = [
            [lp, tok, decode_one(tok)]
            for lp, tok in zip(req.input_logprobs or [], req.prompt_ids[start:], strict=False)
        ]
        if req.top_logprobs_num > 0:  # prompt positions' candidates are not computed: null
            meta["input_top_logprobs"] = [None] * len(meta["input_token_logprobs"])
            meta["output_top_logprobs"] = [
                [[lp, tok, decode_one(tok)] for lp, tok in top]
                for top in req.output_top_logprobs[:n]
            ]
    out: dict[str, Any] = {"text": _text(ids, tokenizer, req, final), "output_ids": ids}
    out["meta_info"] = meta
    if return_prompt_token_ids:
        out["prompt_token_ids"] = req.prompt_ids
    return out


def _text(ids: list[int], tokenizer: Any, req: Request, final: bool) -> str:
    params, finish = req.params, req.finish if final else None
    skip = params.skip_special_tokens
    if finish is not None and finish.type == "stop" and not params.no_stop_trim:
        if isinstance(finish.matched, int):
            return str(tokenizer.decode(ids[:-1], skip_special_tokens=skip))
        text = str(tokenizer.decode(ids, skip_special_tokens=skip))
        cut = text.find(str(finish.matched))
        return text[:cut] if cut >= 0 else text
    text = str(tokenizer.decode(ids, skip_special_tokens=skip))
    # An unfinished stream may end inside a multi-byte character; hold that piece back.
    return text if final else text.rstrip("\ufffd")
