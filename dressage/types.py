"""slime's rollout types: ``Sample`` (with ``Sample.Status``) and the rollout-function outputs.

When slime is importable (its image, a cluster) these are slime's own classes, so samples cross
into slime's RolloutManager unchanged. Elsewhere they are local classes that match slime's
``slime/utils/types.py`` and ``slime/rollout/base_types.py`` field for field (names, types,
defaults, ``Status`` values) and behave as described in docs/slime.md §1;
``tests/test_types.py`` holds the field list against that reference.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

__all__ = ["SLIME_AVAILABLE", "RolloutFnEvalOutput", "RolloutFnTrainOutput", "Sample"]


@dataclass
class _SpecInfo:
    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0

    @property
    def spec_accept_rate(self) -> float:
        if not self.spec_draft_token_num:
            return 0.0
        return self.spec_accept_token_num / self.spec_draft_token_num

    @property
    def spec_accept_length(self) -> float:
        return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct else 0.0

    def add(self, meta_info: dict[str, Any]) -> None:
        self.spec_accept_token_num += int(meta_info.get("spec_accept_token_num", 0) or 0)
        self.spec_draft_token_num += int(meta_info.get("spec_draft_token_num", 0) or 0)
        self.spec_verify_ct += int(meta_info.get("spec_verify_ct", 0) or 0)
        self.completion_token_num += int(meta_info.get("completion_tokens", 0) or 0)

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> _SpecInfo:
        return _SpecInfo(**{f.name: data.get(f.name, 0) for f in fields(_SpecInfo)})


@dataclass
class _PrefixCacheInfo:
    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens else 0.0

    def add(self, meta_info: dict[str, Any]) -> None:
        self.cached_tokens += int(meta_info.get("cached_tokens", 0) or 0)
        self.total_prompt_tokens += int(meta_info.get("prompt_tokens", 0) or 0)

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> _PrefixCacheInfo:
        return _PrefixCacheInfo(**{f.name: data.get(f.name, 0) for f in fields(_PrefixCacheInfo)})


_FINISH_TO_STATUS = {"length": "truncated", "abort": "aborted", "stop": "completed"}


@dataclass
class _LocalSample:
    """One rollout sample; field-for-field slime's ``Sample`` (docs/slime.md §1.1)."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"  # recoverable: tool/API/parse error; set by user code only

    SpecInfo = _SpecInfo
    PrefixCacheInfo = _PrefixCacheInfo

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: Any = None  # list[int] | torch.Tensor | None
    rollout_top_p_token_offsets: Any = None  # list[int] | torch.Tensor | None
    rollout_routed_experts: Any = None  # list[list[int]] | torch.Tensor | None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: _LocalSample.Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: _SpecInfo = field(default_factory=_SpecInfo)
    prefix_cache_info: _PrefixCacheInfo = field(default_factory=_PrefixCacheInfo)

    # -- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Shallow copy of the fields; ``status`` as its value, nested infos as dicts."""
        out = dict(self.__dict__)
        out["status"] = self.status.value
        out["spec_info"] = self.spec_info.to_dict()
        out["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> _LocalSample:
        """Inverse of :meth:`to_dict`; unknown keys become extra attributes, as in slime."""
        data = dict(data)
        known = {f.name for f in fields(_LocalSample)}
        if "status" in data and not isinstance(data["status"], _LocalSample.Status):
            data["status"] = _LocalSample.Status(data["status"])
        if isinstance(data.get("spec_info"), dict):
            data["spec_info"] = _SpecInfo.from_dict(data["spec_info"])
        if isinstance(data.get("prefix_cache_info"), dict):
            data["prefix_cache_info"] = _PrefixCacheInfo.from_dict(data["prefix_cache_info"])
        sample = _LocalSample(**{k: v for k, v in data.items() if k in known})
        for key, value in data.items():
            if key not in known:
                setattr(sample, key, value)
        return sample

    # -- reward and lengths ------------------------------------------------------------------

    def get_reward_value(self, args: Any) -> float:
        key = getattr(args, "reward_key", None)
        if key:
            if not isinstance(self.reward, dict):
                raise TypeError(
                    f"sample index={self.index}: --reward-key {key!r} set but reward is "
                    f"{type(self.reward).__name__}"
                )
            return float(self.reward[key])
        if not isinstance(self.reward, int | float):
            raise TypeError(
                f"sample index={self.index}: reward is {type(self.reward).__name__}, not a number"
            )
        return float(self.reward)

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    # -- growing a response ------------------------------------------------------------------

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: list[int] | None = None,
        log_probs: list[float] | None = None,
        trainable: bool = True,
        meta_info: dict[str, Any] | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Append response tokens with aligned mask and log-probs (docs/slime.md §1.3)."""
        tokens = list(tokens or [])
        n = len(tokens)
        if trainable and n and log_probs is None:
            raise ValueError(f"sample index={self.index}: trainable tokens need log_probs")
        if not trainable and log_probs is not None:
            raise ValueError(
                f"sample index={self.index}: non-trainable tokens must not carry log_probs"
            )
        if log_probs is not None and len(log_probs) != n:
            raise ValueError(
                f"sample index={self.index}: {n} tokens but {len(log_probs)} log_probs"
            )
        if self.loss_mask is None:
            self.loss_mask = [1] * self.response_length
        if self.rollout_log_probs is None:
            if trainable and n and self.response_length:
                raise ValueError(
                    f"sample index={self.index}: cannot back-fill rollout_log_probs for an "
                    "existing response while appending trainable tokens"
                )
            self.rollout_log_probs = [0.0] * self.response_length
        self.tokens = list(self.tokens) + tokens
        self.response_length += n
        self.loss_mask = list(self.loss_mask) + [1 if trainable else 0] * n
        self.rollout_log_probs = list(self.rollout_log_probs) + (
            [float(x) for x in log_probs] if log_probs is not None else [0.0] * n
        )
        if self.rollout_top_p_token_offsets is not None and not trainable:
            last = self.rollout_top_p_token_offsets[-1]
            self.rollout_top_p_token_offsets = list(self.rollout_top_p_token_offsets) + [last] * n
        if text:
            self.response += text
        if meta_info is not None:
            self._apply_meta_info(args, meta_info, n, update_terminal_info)
        self._validate_response_metadata_lengths()

    def _apply_meta_info(
        self, args: Any, meta_info: dict[str, Any], n: int, update_terminal_info: bool
    ) -> None:
        top_ids = meta_info.get("output_top_p_token_ids")
        top_offsets = meta_info.get("output_top_p_token_offsets")
        if top_ids is not None and top_offsets is not None:
            ids = list(self.rollout_top_p_token_ids or [])
            offsets = list(self.rollout_top_p_token_offsets or [0])
            base = offsets[-1]
            ids.extend(top_ids)
            offsets.extend(base + o for o in list(top_offsets)[1:])
            self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
        routed = meta_info.get("routed_experts")
        if routed is not None:
            self._decode_routed_experts(args, routed, meta_info)
        finish = meta_info.get("finish_reason")
        if finish and update_terminal_info:
            self.spec_info.add(meta_info)
            self.prefix_cache_info.add(meta_info)
            if "weight_version" in meta_info:  # as given: slime keeps the engine's value
                self.weight_versions.append(meta_info["weight_version"])
            if not isinstance(finish, dict):
                raise TypeError(
                    f"sample index={self.index}: meta_info finish_reason must be SGLang's "
                    f"{{'type': ...}} object, got {finish!r}"
                )
            kind = finish.get("type")
            if kind in _FINISH_TO_STATUS:
                self.status = _LocalSample.Status(_FINISH_TO_STATUS[kind])

    def _decode_routed_experts(self, args: Any, routed: Any, meta_info: dict[str, Any]) -> None:
        import numpy as np

        num_layers = getattr(args, "num_layers", None)
        topk = getattr(args, "moe_router_topk", None)
        if not num_layers or not topk:
            raise ValueError("routed_experts needs args.num_layers and args.moe_router_topk")
        flat = np.frombuffer(base64.b64decode(routed), dtype=np.int32)
        rows = flat.reshape(-1, num_layers, topk).tolist()
        start = int(meta_info.get("routed_experts_start_len", 0) or 0)
        existing = list(self.rollout_routed_experts or [])
        self.rollout_routed_experts = existing[:start] + rows

    def _validate_response_metadata_lengths(self) -> None:
        n = self.response_length
        if self.loss_mask is not None and len(self.loss_mask) != n:
            raise ValueError(
                f"sample index={self.index}: len(loss_mask)={len(self.loss_mask)} != "
                f"response_length={n}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != n:
            raise ValueError(
                f"sample index={self.index}: len(rollout_log_probs)="
                f"{len(self.rollout_log_probs)} != response_length={n}"
            )
        offsets = self.rollout_top_p_token_offsets
        if offsets is not None and len(offsets) != n + 1:
            raise ValueError(
                f"sample index={self.index}: len(rollout_top_p_token_offsets)={len(offsets)} "
                f"!= response_length+1={n + 1}"
            )


@dataclass
class _LocalRolloutFnTrainOutput:
    samples: list[list[Any]]
    metrics: dict[str, Any] | None = None


@dataclass
class _LocalRolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


try:  # slime's own classes when they are importable
    from slime.rollout.base_types import (
        RolloutFnEvalOutput,
        RolloutFnTrainOutput,
    )
    from slime.utils.types import Sample

    SLIME_AVAILABLE = True
except ImportError:
    Sample = _LocalSample
    RolloutFnTrainOutput = _LocalRolloutFnTrainOutput
    RolloutFnEvalOutput = _LocalRolloutFnEvalOutput
    SLIME_AVAILABLE = False
