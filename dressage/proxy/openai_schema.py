"""The chat request as the proxy's OpenAPI document describes it (``GET /openapi.json``).

    add_chat_to_openapi(app)      # create_app does this

The chat routes are plain Starlette routes (the hot path skips FastAPI's parameter solving) and
their bodies are checked by hand (:mod:`~dressage.proxy.openai_api`), so FastAPI cannot see them.
These pydantic models exist only to describe the body in the document, for clients and for the
schema fuzzer (tests/proxy/test_proxy_fuzz.py); they accept what ``parse_chat_request`` accepts
and give the same bounds, but nothing parses requests with them.
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


class TextPart(_Open):
    type: Literal["text"]
    text: str


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] = "{}"
    """A JSON object, as text (OpenAI's form) or as an object."""


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "user", "assistant", "tool"]
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


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatTemplateKwargs(_Open):
    enable_thinking: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text"]


_StopString = Annotated[str, Field(min_length=1)]


class ChatCompletionBody(_Open):
    """``POST /v1/chat/completions`` (and ``/sessions/{session_id}/v1/chat/completions``)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
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
    top_logprobs: Literal[0] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    response_format: ResponseFormat | None = None


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
