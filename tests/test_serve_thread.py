"""dressage.serve_thread: an ASGI app served on a thread answers at the URL it yields, is gone
after the block, and a server that dies while starting fails at once instead of timing out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from dressage.serve_thread import serve_on_thread

pytestmark = pytest.mark.integration


async def _health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def _echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.path_params["word"])


def _app() -> Starlette:
    return Starlette(routes=[Route("/health", _health), Route("/echo/{word}", _echo)])


def test_the_app_answers_on_its_loopback_url_until_the_block_ends() -> None:
    config = uvicorn.Config(_app(), log_level="warning", timeout_graceful_shutdown=1)
    with serve_on_thread(config, name="the echo", thread_name="echo", startup_timeout=10) as url:
        assert url.startswith("http://127.0.0.1:") and not url.endswith("/")
        assert httpx.get(f"{url}/echo/hello", timeout=5).text == "hello"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


# uvicorn ends a failed startup with sys.exit(3), which here ends the server thread
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_that_dies_while_starting_fails_at_once_naming_it() -> None:
    @asynccontextmanager
    async def broken(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("no model")
        yield  # pragma: no cover

    app = Starlette(routes=[Route("/health", _health)], lifespan=broken)
    config = uvicorn.Config(app, log_level="critical", lifespan="on")
    # a RuntimeError (the thread ended), not the TimeoutError of waiting out startup_timeout
    with pytest.raises(RuntimeError, match="the broken app at http://127.0.0.1:\\d+ stopped"):
        with serve_on_thread(config, name="the broken app", thread_name="b", startup_timeout=20):
            pass  # pragma: no cover
