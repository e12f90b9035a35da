"""The chat request as the proxy's OpenAPI document describes it (``GET /openapi.json``).

    add_chat_to_openapi(app)      # create_app does this

The chat routes are plain Starlette routes (the hot path skips FastAPI's parameter solving) and
their bodies are checked by hand (:mod:`~dressage.proxy.openai_api`), so FastAPI cannot see them.
These pydantic models exist only to describe the body in the document, for clients and for the
schema fuzzer (tests/proxy/test_proxy_fuzz.py); they accept what ``parse_chat_request`` accepts
and give the same bounds (tests/proxy/test_proxy_openapi_truth.py sends framework-style bodies
to both), but nothing parses requests with them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatCompletionBody", "add_chat_to_openapi"]

_SESSION_ID = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "pattern": "^[A-Za-z0-9._:-]+$",
    "description": "1-128 characters of [A-Za-z0-9._:-], not '.' or '..'",
}


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Loose(BaseModel):
    """What agents echo back may carry more keys (``refusal``, ``annotations``, ...): the
    server reads the ones below and passes over the rest, which change no token."""

    model_config = ConfigDict(extra="allow")


class TextPart(_Loose):
    type: Literal["text"]
    text: str


class FunctionCall(_Loose):
    name: str
    arguments: str | dict[str, Any] = "{}"
    """A JSON object, as text (OpenAI's form) or as an object."""


class ToolCall(_Loose):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    """``developer`` is rendered as ``system``."""
    content: str | list[TextPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDefinition(_Open):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON Schema object."""
    strict: bool | None = None
    """True: the call's arguments are constrained to ``parameters``."""


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(_Open):
    mode: Literal["auto", "required"] = "auto"
    tools: Annotated[list[NamedToolChoice], Field(min_length=1)]


class AllowedToolsChoice(_Open):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class StreamOptions(_Open):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatTemplateKwargs(_Open):
    enable_thinking: bool | None = None


class TextFormat(_Open):
    type: Literal["text"]


class JSONObjectFormat(_Open):
    type: Literal["json_object"]


class JSONSchemaSpec(_Open):
    name: str
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class JSONSchemaFormat(_Open):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


class Prediction(_Open):
    type: Literal["content"]
    content: str | list[TextPart]


_StopString = Annotated[str, Field(min_length=1)]
_TokenId = Annotated[str, Field(pattern="^[0-9]+$")]


class ChatCompletionBody(_Open):
    """``POST /v1/chat/completions`` (and ``/sessions/{session_id}/v1/chat/completions``).

    Exactly the fields the server reads (docs/openai-api.md); any other is refused. Two rules
    the schema does not state: ``top_logprobs`` above 0 needs ``logprobs: true``, and a tool
    that ``tool_choice`` names must be in ``tools``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    stop: (
        str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=32)] | None
    ) = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**63)] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    n: Literal[1] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    logit_bias: dict[_TokenId, Annotated[float, Field(ge=-100, le=100)]] | None = None
    tools: list[Tool] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None
    ) = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    response_format: TextFormat | JSONObjectFormat | JSONSchemaFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    verbosity: Literal["medium"] | None = None
    modalities: list[Literal["text"]] | None = None
    audio: None = None
    web_search_options: None = None
    functions: None = None
    function_call: None = None
    prediction: Prediction | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None


def _chat_operation(*, by_path: bool) -> dict[str, Any]:
    if by_path:
        parameters = [{"name": "session_id", "in": "path", "required": True, "schema": _SESSION_ID}]
    else:
        parameters = [
            {"name": "X-Session-Id", "in": "header", "required": True, "schema": _SESSION_ID}
        ]
    parameters.append(
        {
            "name": "X-Dressage-Partial-Rollout",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["0", "1"]},
        }
    )
    return {
        "post": {
            "summary": "Chat completion (recorded)",
            "operationId": "chat_by_path" if by_path else "chat_by_header",
            "parameters": parameters,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/ChatCompletionBody"}
                    }
                },
            },
            "responses": {
                "200": {"description": "a chat.completion object, or an SSE stream of chunks"},
                "400": {"description": "a bad request; the error names the field"},
            },
        }
    }


def add_chat_to_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the chat routes and their request body."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema = ChatCompletionBody.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(schema.pop("$defs", {}))
            schemas["ChatCompletionBody"] = schema
            paths = document.setdefault("paths", {})
            paths["/v1/chat/completions"] = _chat_operation(by_path=False)
            paths["/sessions/{session_id}/v1/chat/completions"] = _chat_operation(by_path=True)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
