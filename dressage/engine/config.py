"""The embedded engine's settings: one typed object, filled from CLI flags or keyword options.

Keys follow SGLang's ``--api-key`` / ``--admin-api-key`` (docs/sglang.md section 7.4): the API
key guards every route but health; the control routes (every route but the data routes listed
in :mod:`dressage.engine.server`) take the admin key when one is set, else the API key. Unlike
SGLang's, the control routes are never open by accident: a config without either key is refused
unless ``open_control_routes`` says so, and that opt-out (for tests and one-off local runs) only
holds on a loopback host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dressage.auth import check_key, is_loopback

ADMIN_KEY_ENV = "DRESSAGE_ENGINE_ADMIN_KEY"
API_KEY_ENV = "DRESSAGE_ENGINE_API_KEY"


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``dressage engine serve`` can be told. ``None`` means "derive a default"."""

    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (auto: fp32 on CPU)
    weight_version: str = "default"
    api_key: str | None = None
    admin_api_key: str | None = None
    open_control_routes: bool = False  # serve pause, abort, weight updates without a key
    served_model_name: str | None = None
    context_length: int | None = None  # default: the model's max_position_embeddings
    max_running_requests: int | None = None  # default: 64 on CPU, 256 on a GPU
    max_total_tokens: int | None = None  # KV budget in positions; default from memory
    max_prefill_tokens: int | None = None  # default: 8192 on CPU, 16384 on a GPU
    num_threads: int | None = None  # CPU threads of the sharded lm_head pass; default: all cores
    max_body_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.device not in {"auto", "cpu"} and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.dtype not in {"auto", "float32", "bfloat16", "float16"}:
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
        for name in ("context_length", "max_running_requests", "max_total_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        self._check_keys()

    @property
    def control_key(self) -> str | None:
        """The key the control routes take (SGLang: the admin key, else the API key)."""
        return self.admin_api_key or self.api_key

    def _check_keys(self) -> None:
        if self.api_key is not None:
            check_key(self.api_key, f"the API key (--api-key or {API_KEY_ENV})")
        if self.admin_api_key is not None:
            check_key(self.admin_api_key, f"the admin key (--admin-api-key or {ADMIN_KEY_ENV})")
        if self.control_key is not None:
            if self.open_control_routes:
                raise ValueError("open_control_routes (--open-control-routes) with a key: pick one")
            return
        if not is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is not a loopback address: set {ADMIN_KEY_ENV} before "
                "exposing the engine (its control routes pause, abort and replace the model)"
            )
        if not self.open_control_routes:
            raise ValueError(
                f"the engine's control routes (pause, abort, weight updates) need a key: set "
                f"{ADMIN_KEY_ENV} (and give the proxy and the trainer the same), or pass "
                "--open-control-routes to serve them without one on loopback"
            )


def default_num_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
