"""The embedded engine's settings: one typed object, filled from CLI flags or keyword options."""

from __future__ import annotations

import os
from dataclasses import dataclass


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
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")


def default_num_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
