"""Load a transformers causal LM and run batched prefill / decode steps over the slot KV cache.

The model is an unmodified ``AutoModelForCausalLM``; the runner calls its base model (embeddings,
decoder layers, final norm) with our attention function (:mod:`dressage.engine.kv_cache`) and
applies the lm_head itself through :class:`~dressage.engine.sampling.VocabSampler`, so logits are
only computed where a token is sampled or a logprob is asked for.

Weight updates load the new checkpoint with ``from_pretrained`` (any HF folder that
``save_pretrained`` wrote), check names, shapes and tying against the running model, and only then
copy into the running parameters, so a bad checkpoint never touches what is serving.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from dressage.engine.kv_cache import ATTENTION_NAME, DecodePlan, PrefillPlan, Segment, SlotKVCache
from dressage.engine.sampling import RowSpec, TopLogprobs, VocabSampler

log = logging.getLogger(__name__)

# Logits held per lm_head chunk on CPU: 2^18 fp32 = 1 MiB, about one core's L2.
_CPU_CHUNK_ELEMENTS = 1 << 18
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightLoadError(ValueError):
    """A checkpoint that cannot replace the running weights (path, names, shapes, tying)."""


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device} asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device, config_dtype: object) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type == "cpu":
        return torch.float32  # logprob exactness; CPU matmuls in half precision are slow anyway
    return config_dtype if isinstance(config_dtype, torch.dtype) else torch.float32


@dataclass(frozen=True)
class PrefillItem:
    slot: int
    tokens: Sequence[int]


class ModelRunner:
    """Owns the model, its tokenizer, the KV cache and the sampler. Not thread-safe: only the
    scheduler thread calls ``prefill``/``decode``/``sample``/``apply_weights``."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        tokenizer_path: str | Path | None = None,
        device: str = "auto",
        dtype: str = "auto",
        cpu_workers: int = 1,
    ) -> None:
        hf_logging.disable_progress_bar()
        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.device = resolve_device(device)
        self.tokenizer = _load_tokenizer(self.tokenizer_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype="auto")
        self.dtype = resolve_dtype(dtype, self.device, getattr(model.config, "dtype", None))
        module: torch.nn.Module = model  # nn.Module.to is typed; transformers' wrapper is not
        module.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.model = model
        config = self.model.config.get_text_config()
        _check_supported(config)
        self.model.set_attn_implementation(ATTENTION_NAME)
        self.config = config
        self.architectures: list[str] = list(getattr(self.model.config, "architectures", []) or [])
        self.model_type: str = str(getattr(self.model.config, "model_type", ""))
        self.vocab_size = int(config.vocab_size)
        self.context_length = int(getattr(config, "max_position_embeddings", 0) or 32768)
        self.eos_token_ids = _eos_ids(self.model, self.tokenizer)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // (
            config.num_attention_heads
        )
        self.cache = SlotKVCache(
            num_layers=int(config.num_hidden_layers),
            num_kv_heads=int(getattr(config, "num_key_value_heads", config.num_attention_heads)),
            head_dim=int(head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        self.cache.attach(self.model)
        self.decoder = self.model.base_model
        lm_head = self.model.get_output_embeddings()
        if lm_head is None:
            raise ValueError(f"{self.model_path}: the model has no output embedding (lm_head)")
        cpu = self.device.type == "cpu"
        self.sampler = VocabSampler(
            lm_head,
            chunk_elements=_CPU_CHUNK_ELEMENTS if cpu else None,
            workers=cpu_workers if cpu else 1,
        )

    # ---------------------------------------------------------------------------- forward
    @torch.inference_mode()
    def prefill(self, items: Sequence[PrefillItem]) -> torch.Tensor:
        """Run the packed prompts of ``items`` and fill their slots. -> hidden [sum(len), H]."""
        segments, start = [], 0
        for item in items:
            segments.append(Segment(item.slot, start, len(item.tokens)))
            start += len(item.tokens)
        ids = torch.tensor([t for item in items for t in item.tokens], device=self.device)
        positions = torch.cat([torch.arange(len(item.tokens)) for item in items]).to(self.device)
        self.cache.plan = PrefillPlan(tuple(segments))
        try:
            out = self.decoder(input_ids=ids[None], position_ids=positions[None], use_cache=False)
        finally:
            self.cache.plan = None
        hidden: torch.Tensor = out.last_hidden_state[0]
        return hidden

    @torch.inference_mode()
    def decode(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One token per slot ``0 .. B-1`` at ``positions``. -> last hidden [B, H]."""
        batch, length = len(tokens), max(positions) + 1
        pos = torch.tensor(positions, device=self.device)
        mask = torch.arange(length, device=self.device)[None, :] <= pos[:, None]
        self.cache.plan = DecodePlan(
            positions=pos,
            rows=torch.arange(batch, device=self.device),
            mask=mask[:, None, None, :],
            length=length,
        )
        try:
            ids = torch.tensor(tokens, device=self.device)[:, None]
            out = self.decoder(input_ids=ids, position_ids=pos[:, None], use_cache=False)
        finally:
            self.cache.plan = None
        hidden: torch.Tensor = out.last_hidden_state[:, 0]
        return hidden

    @torch.inference_mode()
    def sample(
        self,
        hidden: torch.Tensor,
        rows: Sequence[RowSpec],
        interrupt: threading.Event | None = None,
    ) -> tuple[list[int], list[float]]:
        return self.sampler.sample(hidden, rows, interrupt)

    @torch.inference_mode()
    def sample_rows(
        self,
        hidden: torch.Tensor,
        rows: Sequence[RowSpec],
        interrupt: threading.Event | None = None,
    ) -> tuple[list[int], list[float], list[TopLogprobs | None]]:
        return self.sampler.sample_rows(hidden, rows, interrupt)

    @torch.inference_mode()
    def prompt_logprobs(self, hidden: torch.Tensor, targets: Sequence[int]) -> list[float]:
        return self.sampler.prompt_logprobs(hidden, targets)

    # ---------------------------------------------------------------------------- weights
    def load_weights(self, model_path: str) -> dict[str, torch.Tensor]:
        """Read and check a checkpoint on CPU (safe to call off the scheduler thread)."""
        if not Path(model_path).is_dir():
            raise WeightLoadError(f"model_path {model_path!r} is not a directory")
        try:
            candidate = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype)
        except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint is the caller's 400
            raise WeightLoadError(
                f"cannot load weights from {model_path!r}: {type(exc).__name__}: {exc}"
            ) from exc
        new = candidate.state_dict()
        running = self.model.state_dict()
        missing = sorted(set(running) - set(new))
        unexpected = sorted(set(new) - set(running))
        if missing or unexpected:
            raise WeightLoadError(
                f"{model_path!r} does not match the running model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        for name, tensor in running.items():
            if tuple(new[name].shape) != tuple(tensor.shape):
                raise WeightLoadError(
                    f"{model_path!r}: {name} has shape {tuple(new[name].shape)}, the running "
                    f"model has {tuple(tensor.shape)}"
                )
        _check_same_tying(running, new, model_path)
        return new

    @torch.no_grad()
    def apply_weights(self, weights: dict[str, torch.Tensor], model_path: str) -> None:
        """Copy checked weights into the running parameters (scheduler thread, between steps)."""
        running = self.model.state_dict()
        for name, tensor in running.items():
            tensor.copy_(weights[name])
        self.model_path = model_path


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Tokenizers are read-only and thread-safe; engines in one process (tests) share one."""
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
    return tokenizer


def _check_supported(config: object) -> None:
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        raise ValueError(
            "models that post-process logits (softcapping, logit scale) are not supported"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(
            f"only full-attention decoders are supported, got layer types {layer_types}"
        )


def _eos_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    sources = [getattr(model, "config", None), getattr(model, "generation_config", None)]
    for source in sources:
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    if isinstance(tokenizer.eos_token_id, int):
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def _check_same_tying(
    running: dict[str, torch.Tensor], new: dict[str, torch.Tensor], model_path: str
) -> None:
    """Names that share storage in the running model must share it in the checkpoint too,
    otherwise copying both into one tensor would silently keep only the last."""
    groups: dict[int, list[str]] = {}
    for name, tensor in running.items():
        groups.setdefault(tensor.data_ptr(), []).append(name)
    for names in groups.values():
        first = new[names[0]]
        for other in names[1:]:
            if new[other].data_ptr() != first.data_ptr() and not torch.equal(new[other], first):
                raise WeightLoadError(
                    f"{model_path!r}: {names[0]} and {other} are tied in the running model but "
                    "differ in the checkpoint"
                )
