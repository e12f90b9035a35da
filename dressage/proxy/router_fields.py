"""Whether the engine URL forwards the sampling keys that constrain a call, checked by probing.

    fields = RouterFieldCheck(engine)
    await fields.verified(sampling)   # raises ConstraintDropped (501) naming a key that is lost

Why: sglang-router 0.3.2 re-serialises ``/generate`` through a typed ``sampling_params`` that
has no ``structural_tag`` and no ``logit_bias`` (docs/sglang.md section 6.1), and drops them
without a word. Behind it a call asking for ``tool_choice: "required"``, a strict tool, a
``response_format`` (all ``structural_tag`` on Qwen families) or a ``logit_bias`` would be
sampled unconstrained and recorded as if it had been constrained. The proxy refuses such a call
instead; calls that send none of these keys never probe and keep working.

How: the router's version says too little (slime runs a patched fork of 0.3.2, SMG changes its
structs from release to release), so the proxy asks the behaviour itself, once per key, the first
time a call needs that key. The probe is a ``/generate`` that SGLang refuses with a 400 when it
sees the key (section 1.2: two grammars at once; a ``logit_bias`` id outside the vocabulary) and
that is valid once the key is gone. A 4xx means the key arrived; a generation (one token) means
something between the proxy and the engine dropped it. Any other failure (no engine yet, a 503)
is raised as the engine error it is and decides nothing, so a later call probes again.

Why 501 and not a 4xx: the request is valid and would be honoured by a plain SGLang server; what
cannot honour it is this deployment, so the status says the server side lacks the function, and
an agent framework does not take it as a fault of its own request to rewrite.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from dressage.proxy.engine_answers import EngineRejectedError
from dressage.proxy.engine_client import EngineClient, PromptIds
from dressage.proxy.errors import ConstraintDropped

__all__ = ["CHECKED_KEYS", "RouterFieldCheck", "probe_sampling"]

log = logging.getLogger(__name__)

_OBJECT = json.dumps({"type": "object"})
_TAG = json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "{}"}})
_PROBES: dict[str, dict[str, Any]] = {
    # Two grammars at once is a 400; with structural_tag gone, json_schema alone is valid.
    "structural_tag": {"json_schema": _OBJECT, "structural_tag": _TAG},
    # The same with regex as the survivor.
    "json_schema": {"regex": "[a-z]", "json_schema": _OBJECT},
    # An id outside every vocabulary is a 400; without logit_bias the call is plain.
    "logit_bias": {"logit_bias": {"-1": 0.0}},
}
CHECKED_KEYS = tuple(_PROBES)
"""The sampling keys the proxy sends whose loss would change what is sampled."""

_PARAM = {"structural_tag": None, "json_schema": "response_format", "logit_bias": "logit_bias"}
"""The request field a refusal names as its ``param`` (structural_tag has no single one)."""
_WHAT = {
    "structural_tag": "it carries the call's tool_choice, parallel_tool_calls, strict tools or "
    "response_format",
    "json_schema": "it carries the call's response_format",
    "logit_bias": "it carries the call's logit_bias",
}


def probe_sampling(key: str) -> dict[str, Any]:
    """The probe's ``sampling_params`` for ``key``: refused by an engine that sees ``key``."""
    return {"max_new_tokens": 1, "temperature": 0.0, **_PROBES[key]}


class RouterFieldCheck:
    """Which :data:`CHECKED_KEYS` reach the engine behind ``engine.url`` (module docstring)."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine
        self._lock = asyncio.Lock()
        self.kept: dict[str, bool] = {}
        """Decided keys: True when the engine saw the key, False when it was dropped."""

    async def _probe(self, key: str) -> bool:
        rid = f"dressage-field-probe-{key}-{uuid.uuid4().hex[:12]}"
        try:
            await self._engine.generate(PromptIds.of([0]), probe_sampling(key), rid=rid)
        except EngineRejectedError as exc:
            if 400 <= exc.status < 500:
                return True
            raise
        return False

    def _refusal(self, key: str) -> str:
        return (
            f"sampling_params.{key} ({_WHAT[key]}) does not reach the engine: the router or "
            f"gateway at {self._engine.url} drops it from the /generate requests it forwards "
            "(as sglang-router 0.3.2 does), so this call would run unconstrained; point the "
            "proxy at an SGLang server directly or at a router that forwards the key, or send "
            "the call without this constraint."
        )

    async def verified(self, sampling: dict[str, Any]) -> None:
        """Raise :class:`ConstraintDropped` when a key of ``sampling`` is known to be dropped,
        probing each key the first time it is sent."""
        for key in CHECKED_KEYS:
            if sampling.get(key) is None:
                continue
            if key not in self.kept:
                async with self._lock:
                    if key not in self.kept:
                        self.kept[key] = await self._probe(key)
                        if not self.kept[key]:
                            log.error("%s", self._refusal(key))
            if not self.kept[key]:
                raise ConstraintDropped(self._refusal(key), param=_PARAM[key])
