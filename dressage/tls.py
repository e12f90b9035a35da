"""One TLS client context per process, shared by every HTTP client the project builds.

    httpx.AsyncClient(..., verify=tls_context())

Building an HTTP client builds a TLS context by loading the system's certificate store: about
27 ms of CPU each time. Agents get a fresh client per run and evaluation items one each, so on
the embedded default (32 two-turn agents a step) that was a third of a step's wall time. A
context is safe to share between connections and threads; it only matters for ``https://``.
"""

from __future__ import annotations

import functools
import ssl

__all__ = ["tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's default TLS client context (system certificates, hostname checks)."""
    return ssl.create_default_context()
