"""Bearer keys: one rule for the engine and the proxy, checked per request and at start.

    if not key_matches(request.headers.get("authorization"), (admin_key,)):
        ...  # 401
    check_key(os.environ["DRESSAGE_ENGINE_ADMIN_KEY"], "DRESSAGE_ENGINE_ADMIN_KEY")  # at start

A key travels as ``Authorization: Bearer <key>`` (what the OpenAI SDK and slime send). The
scheme's case is free (``Bearer``, ``bearer``, ``BEARER``: RFC 9110 makes schemes
case-insensitive, and SGLang accepts any case too); one space follows it and the rest of the
header is the key. Spaces and tabs around the whole value are not part of it (RFC 9110's OWS;
uvicorn's parser keeps trailing ones, h11 drops them, so they are dropped here), while any
other whitespace is part of what was sent and does not match. Keys are compared as
bytes with :func:`hmac.compare_digest`, so the time an answer takes does not tell how much of a
guess was right.

:func:`check_key` refuses, at start, a key that could never match or that means nothing: empty
(an unset ``$KEY`` expanded by a shell), or with characters a header cannot carry as sent
(whitespace, control characters, anything outside printable ASCII).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence

__all__ = ["bearer_token", "check_key", "is_loopback", "key_matches"]

_SCHEME = "bearer "


def bearer_token(header: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; None for any other header."""
    if header is None:
        return None
    value = header.strip(" \t")
    if value[: len(_SCHEME)].lower() != _SCHEME:
        return None
    return value[len(_SCHEME) :]


def key_matches(header: str | None, keys: Sequence[str]) -> bool:
    """Whether the header carries one of ``keys`` (timing-safe; an empty key never matches)."""
    token = bearer_token(header)
    if not token:
        return False
    sent = token.encode("utf-8", "replace")
    found = False
    for key in keys:  # every key is compared: which one matched takes no less time
        found |= bool(key) and hmac.compare_digest(sent, key.encode())
    return found


def check_key(value: str, what: str) -> str:
    """``value`` if it can serve as a key, else a ValueError naming ``what`` (flag or variable).

    The message never repeats the key itself.
    """
    if not value.strip():
        raise ValueError(f"{what} is empty: an empty key is not 'no key'; give a key or unset it")
    if not all("!" <= c <= "~" for c in value):
        raise ValueError(
            f"{what} must be printable ASCII without spaces (it travels in an HTTP header); "
            f"the key given has {len(value)} characters, some of them not"
        )
    return value


def is_loopback(host: str) -> bool:
    """Whether a listen address is loopback only (``localhost``, ``127.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
