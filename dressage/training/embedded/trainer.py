"""The embedded trainer: slime's actor semantics in one process, on a transformers causal LM.

It consumes slime's ``train_data`` dict exactly as slime's actor does and drives the same hooks
with the same ``args`` (slime's flag names, see ``embedded.args``)::

    from dressage.training.embedded import EmbeddedTrainer, trainer_args
    args = trainer_args(
        hf_checkpoint="/ckpt/student", global_batch_size=8, lr=1e-5,
        custom_advantage_function_path="dressage.training.mopd_loss.compute_mopd_advantages",
        loss_type="custom_loss",
        custom_loss_function_path="dressage.training.mopd_loss.mopd_policy_loss",
    )
    trainer = EmbeddedTrainer(args, teachers={"math": "/ckpt/math", "code": "/ckpt/code"})
    metrics = trainer.train(rollout_id, train_data)   # one rollout's batch: 1+ optimizer steps
    trainer.save_weights("/run/weights/v1")           # what /update_weights_from_disk loads

Checkpoints (``--save``, ``--save-interval``, ``--load``): :mod:`.checkpoint`.

Per ``train`` call, as slime's ``train_actor``: check the data (before any forward); keep the
samples of whole steps (``global_batch_size`` rollouts each, trailing rollouts dropped); score
log-probs without gradient (student, each sample's teacher via a :class:`TeacherBank`, the
reference model when a KL needs it; with ``--mopd-objective dense`` also each teacher's whole
log-softmax at the response positions, ``teacher_full_log_probs``; with ``topk`` each teacher's
top-``--mopd-topk`` support riding on ``teacher_log_probs``, nothing ``[R, V]`` kept);
advantages (custom hook or built-in estimator); then per step: per micro-batch packed logits
``[1, T, V]``, the loss hook with slime's reducer, backward of ``loss / G`` (``G`` = rollouts
per step; ``/ tokens`` with ``--calculate-per-token-loss``), so the gradient is ``(1/G) sum over
rollouts of each rollout's token-mean loss``; grad clip; AdamW.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from argparse import Namespace
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dressage.causal_lm import output_embedding_module
from dressage.slime.hooks import load_function
from dressage.slime.train_args import (
    actor_args,
    advantage_args,
    log_prob_args,
    optimizer_args,
    policy_loss_args,
)
from dressage.training.embedded.advantages import compute_advantages_and_returns
from dressage.training.embedded.args import LR_DECAY_STYLES, SLIME_TRAIN_DEFAULTS
from dressage.training.embedded.data import check_train_data, select
from dressage.training.embedded.schedule import Schedule, TrainStep, build_schedule
from dressage.training.log_probs import causal_lm_packed_logits, causal_lm_response_log_probs
from dressage.training.losses import policy_loss, sft_loss
from dressage.training.mopd_dense import mopd_objective
from dressage.training.mopd_metrics import pop_rollout_metrics
from dressage.training.mopd_topk import mopd_topk
from dressage.training.reducer import get_sum_of_sample_mean
from dressage.training.teacher_rotation import TeacherBank, plan_micro_batches

__all__ = ["EmbeddedTrainer", "resolve_device"]

_TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "vocab", "merges", "chat_template", "added")
_OPD_TAG, _REF_TAG = "opd_teacher", "ref"


def resolve_device(name: str | None) -> torch.device:
    """``auto`` -> CUDA when available, else CPU."""
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _teacher_tag(teacher_id: str) -> str:
    return f"teacher:{teacher_id}"


def _loss_function(args: Namespace) -> Any:
    view = actor_args(args)
    loss_type = view.loss_type
    if loss_type == "policy_loss":
        return policy_loss
    if loss_type == "sft_loss":
        return sft_loss
    if loss_type == "custom_loss":
        path = view.custom_loss_function_path
        if not path:
            raise ValueError("--loss-type custom_loss needs --custom-loss-function-path")
        return load_function(path)
    raise ValueError(
        f"unknown loss_type {loss_type!r}; expected policy_loss, sft_loss, custom_loss"
    )


class EmbeddedTrainer:
    """One process, one transformers causal LM, AdamW; see the module docstring.

    Args:
        args: slime-named options (``trainer_args``); missing ones get slime's defaults.
        model_path: the student (Hugging Face folder); default ``args.hf_checkpoint``.
        teachers: ``teacher_id -> checkpoint folder`` for MOPD; each sample's ``prompt`` entry
            names its teacher.
        dtype: parameter dtype (default float32; ``args.bf16`` adds bfloat16 autocast on CUDA).
    """

    def __init__(
        self,
        args: Namespace,
        *,
        model_path: str | Path | None = None,
        teachers: Mapping[str, str | Path] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoModelForCausalLM

        for name, default in SLIME_TRAIN_DEFAULTS.items():  # slime's args carry every flag
            if not hasattr(args, name):
                setattr(args, name, default)
        self.args = args
        optimizer, view = optimizer_args(args), actor_args(args)
        if optimizer.lr_decay_style not in LR_DECAY_STYLES:
            raise ValueError(
                f"lr_decay_style {optimizer.lr_decay_style!r}: expected one of {LR_DECAY_STYLES}"
            )
        if view.save_interval is not None and not view.save:
            raise ValueError(f"--save-interval {view.save_interval} needs --save (as slime's)")
        # dense MOPD: the teachers' whole log-softmax at response positions goes to the loss;
        # topk: their top-K supports, on the teacher log-probs
        objective = mopd_objective(args)
        self.dense = objective == "dense"
        self.topk = mopd_topk(args) if objective == "topk" else 0
        path = model_path or view.hf_checkpoint
        if path is None:
            raise ValueError("no student model: pass model_path or set args.hf_checkpoint")
        self.model_path = Path(path)
        self.teachers = dict(teachers or {})
        self._check_sources()
        self.device = resolve_device(view.device)
        torch.manual_seed(view.seed)
        model: nn.Module = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=dtype)
        self.model = model.to(self.device).eval()  # no dropout: old == new log-probs at step 0
        self._check_topk()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=optimizer.lr,
            betas=(optimizer.adam_beta1, optimizer.adam_beta2),
            eps=optimizer.adam_eps,
            weight_decay=optimizer.weight_decay,
        )
        self.loss_fn = _loss_function(args)
        self.bank = self._build_bank()
        self.num_steps = 0

    # -- setup ---------------------------------------------------------------------------------

    def _opd_teacher(self) -> str | None:
        view = actor_args(self.args)
        if view.use_opd and view.opd_type == "megatron":
            path = view.opd_teacher_load
            if not path:
                raise ValueError("--use-opd --opd-type megatron needs --opd-teacher-load")
            return str(path)
        return None

    def _needs_ref(self) -> bool:
        return policy_loss_args(self.args).use_kl_loss or advantage_args(self.args).kl_coef != 0.0

    def _check_sources(self) -> None:
        # Fail on every missing checkpoint before spending time on the student.
        if not self.model_path.exists():
            raise FileNotFoundError(f"student checkpoint {self.model_path} does not exist")
        for tid, path in self.teachers.items():
            if not Path(path).exists():
                raise FileNotFoundError(f"teacher {tid!r}: checkpoint {path} does not exist")

    def _check_topk(self) -> None:
        vocab = int(output_embedding_module(self.model).get_parameter("weight").shape[0])
        if self.topk > vocab:
            raise ValueError(
                f"--mopd-topk {self.topk} exceeds the student's vocabulary of {vocab} tokens "
                f"(its output embedding rows); use at most {vocab}"
            )

    def _build_bank(self) -> TeacherBank | None:
        opd = self._opd_teacher()
        if not (self.teachers or opd or self._needs_ref()):
            return None
        log_probs = log_prob_args(self.args)
        bank = TeacherBank(
            self.model,
            temperature=log_probs.rollout_temperature,
            chunk_tokens=log_probs.chunk_tokens,
        )
        for tid, path in sorted(self.teachers.items()):
            bank.add_teacher(_teacher_tag(tid), path)
        if opd:
            bank.add_teacher(_OPD_TAG, opd)
        if self._needs_ref():
            ref = actor_args(self.args).ref_load
            if ref:
                bank.add_teacher(_REF_TAG, ref)
            else:  # slime's default reference: the initial student
                bank.backup(_REF_TAG)
        return bank

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        if actor_args(self.args).bf16 and self.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                yield
        else:
            yield

    # -- one rollout -----------------------------------------------------------------------------

    def train(self, rollout_id: int, train_data: Mapping[str, Any]) -> dict[str, float]:
        """Train on one rollout's ``train_data``; returns ``train/``, ``rollout/``, ``perf/``."""
        start = time.perf_counter()
        args = self.args
        check_train_data(train_data, teachers=set(self.teachers) if self.teachers else None)
        view = actor_args(args)
        batch = optimizer_args(args).global_batch_size
        if batch is None:
            raise ValueError("--global-batch-size is required: the samples of an optimizer step")
        schedule = build_schedule(
            train_data["rollout_ids"],
            [len(t) for t in train_data["tokens"]],
            global_batch_size=batch,
            micro_batch_size=view.micro_batch_size,
            max_tokens_per_gpu=view.max_tokens_per_gpu if view.use_dynamic_batch_size else None,
        )
        rollout_data = select(train_data, schedule.order, self.device)
        self._log_probs(rollout_data)
        scored = time.perf_counter()
        compute_advantages_and_returns(args, rollout_data)
        postprocess = view.rollout_data_postprocess_path
        if postprocess:
            load_function(postprocess)(args, rollout_id, rollout_data)
        metrics = self._rollout_metrics(rollout_data, schedule)
        per_step = [self._train_step(rollout_data, step) for step in schedule.steps]
        for key in per_step[0]:
            metrics[f"train/{key}"] = sum(m[key] for m in per_step) / len(per_step)
        metrics["train/num_steps"] = float(len(per_step))
        metrics["perf/log_probs_time"] = scored - start
        metrics["perf/train_time"] = time.perf_counter() - scored
        return metrics

    def _log_probs(self, rollout_data: dict[str, Any]) -> None:
        tokens, resp = rollout_data["tokens"], rollout_data["response_lengths"]
        n = len(tokens)
        # One scoring pass over (sample, model) pairs: the student first, then each sample's
        # teacher, then the reference; the bank orders them so each swap hides behind compute.
        keys, tags = ["log_probs"], [self.bank.student_tag if self.bank else ""] * n
        if self.teachers:
            keys.append("teacher_log_probs")
            tags += [_teacher_tag(t) for t in rollout_data["prompt"]]
        elif self._opd_teacher():
            keys.append("teacher_log_probs")
            tags += [_OPD_TAG] * n
        if self._needs_ref():
            keys.append("ref_log_probs")
            tags += [_REF_TAG] * n
        max_tokens = actor_args(self.args).log_probs_max_tokens
        # dense MOPD: each teacher's whole log-softmax, from which its sampled-token log-probs
        # are read, so a teacher still runs once; topk: its sampled-token log-probs carry its
        # top-K supports
        teacher_tags = set(tags[n : 2 * n]) if "teacher_log_probs" in keys else set()
        full = teacher_tags if self.dense else set()
        topk = teacher_tags if self.topk else set()
        with torch.no_grad(), self._autocast():
            if self.bank is None:
                out = self._score_student(tokens, resp, max_tokens)
            else:
                k = len(keys)
                out = self.bank.score(
                    list(tokens) * k,
                    list(resp) * k,
                    tags,
                    max_tokens=max_tokens,
                    full_tags=full,
                    topk_tags=topk,
                    topk=self.topk,
                )
        for j, key in enumerate(keys):
            rollout_data[key] = out[j * n : (j + 1) * n]
        if full:
            dists = rollout_data["teacher_log_probs"]
            rollout_data["teacher_full_log_probs"] = dists
            rollout_data["teacher_log_probs"] = [
                d.gather(-1, t[t.numel() - r :].to(d.device)[:, None]).squeeze(-1)
                for d, t, r in zip(dists, tokens, resp, strict=True)
            ]

    def _score_student(
        self, tokens: list[Tensor], resp: list[int], max_tokens: int
    ) -> list[Tensor]:
        out: list[Tensor] = [torch.zeros(0)] * len(tokens)
        log_probs = log_prob_args(self.args)
        chunk, temperature = log_probs.chunk_tokens, log_probs.rollout_temperature
        for mb in plan_micro_batches([int(t.numel()) for t in tokens], max_tokens):
            scored = causal_lm_response_log_probs(
                self.model,
                [tokens[i] for i in mb],
                [resp[i] for i in mb],
                temperature=temperature,
                chunk_tokens=chunk,
            )
            for i, logp in zip(mb, scored, strict=True):
                out[i] = logp
        return out

    def _rollout_metrics(
        self, rollout_data: dict[str, Any], schedule: Schedule
    ) -> dict[str, float]:
        metrics = pop_rollout_metrics(rollout_data)
        masks = rollout_data["loss_masks"]
        for key in ("log_probs", "teacher_log_probs", "ref_log_probs", "advantages"):
            values = rollout_data.get(key)
            if values is not None:
                num = sum(float((v.float() * m).sum()) for v, m in zip(values, masks, strict=True))
                den = sum(float(m.sum()) for m in masks)
                metrics[f"rollout/{key}"] = num / max(den, 1.0)
        raw = [r for r in rollout_data.get("raw_reward") or [] if r is not None]
        if raw:
            metrics["rollout/raw_reward"] = sum(float(r) for r in raw) / len(raw)
        metrics["rollout/num_samples"] = float(len(schedule.order))
        metrics["rollout/dropped_samples"] = float(len(schedule.dropped))
        return metrics

    # -- one optimizer step ----------------------------------------------------------------------

    def _batch(self, rollout_data: dict[str, Any], positions: list[int]) -> dict[str, Any]:
        """slime's loss batch for one micro-batch (absent keys are None, as in slime)."""
        unconcat = [rollout_data["tokens"][i] for i in positions]
        batch: dict[str, Any] = {
            "unconcat_tokens": unconcat,
            "tokens": torch.cat(unconcat).unsqueeze(0).to(self.device),
            "total_lengths": [rollout_data["total_lengths"][i] for i in positions],
            "response_lengths": [rollout_data["response_lengths"][i] for i in positions],
            "loss_masks": [rollout_data["loss_masks"][i] for i in positions],
            "multimodal_train_inputs": None,
            "packed_seq_params": None,
            "values": None,
        }
        for key in (
            "log_probs",
            "ref_log_probs",
            "advantages",
            "returns",
            "rollout_log_probs",
            "teacher_log_probs",
            "teacher_full_log_probs",
        ):
            values = rollout_data.get(key)
            batch[key] = None if values is None else [values[i] for i in positions]
        sums = rollout_data.get("rollout_mask_sums")
        batch["rollout_mask_sums"] = None if sums is None else sums[positions]
        return batch

    def _train_step(self, rollout_data: dict[str, Any], step: TrainStep) -> dict[str, float]:
        args = self.args
        per_token = actor_args(args).calculate_per_token_loss
        if per_token:
            tokens = sum(float(rollout_data["loss_masks"][i].sum()) for i in step.positions)
            denom = max(tokens, 1.0)
        else:
            denom = float(step.num_rollouts)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, Tensor] = {}
        for positions in step.micro_batches:
            batch = self._batch(rollout_data, positions)
            with self._autocast():
                logits = causal_lm_packed_logits(self.model, batch["unconcat_tokens"])
            reducer = get_sum_of_sample_mean(
                batch["total_lengths"],
                batch["response_lengths"],
                batch["loss_masks"],
                batch["rollout_mask_sums"],
                per_token,
            )
            loss, metrics = self.loss_fn(args, batch, logits, reducer)
            (loss / denom).backward()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + torch.as_tensor(value).detach().float() / denom
            del logits, loss
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = optimizer_args(args).clip_grad
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(f"step {self.num_steps}: gradient norm is {float(grad_norm)}")
        lr = self.learning_rate(self.num_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        if self.bank is not None:
            self.bank.mark_student_changed()
        self.num_steps += 1
        out = {key: float(value) for key, value in sums.items()}
        out["grad_norm"] = float(grad_norm)
        out["lr"] = lr
        return out

    def learning_rate(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based), Megatron's schedule: a linear
        warm-up over ``lr_warmup_iters`` steps to ``lr``, then ``lr_decay_style`` (``constant``,
        ``linear`` or ``cosine``) from ``lr`` to ``min_lr`` at step ``lr_decay_iters`` (default:
        the run's optimizer steps), ``min_lr`` after."""
        view = optimizer_args(self.args)
        peak, floor = view.lr, view.min_lr
        warmup = view.lr_warmup_iters
        if step < warmup:
            return peak * (step + 1) / warmup
        style = view.lr_decay_style
        if style == "constant":
            return peak
        total = self._decay_iters()
        if step >= total:
            return floor
        ratio = (step - warmup) / max(total - warmup, 1)
        if style == "linear":
            return peak - (peak - floor) * ratio
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * ratio))

    def _decay_iters(self) -> int:
        view = optimizer_args(self.args)
        if view.lr_decay_iters:
            return view.lr_decay_iters
        rollouts = view.num_rollout
        if not rollouts:
            raise ValueError(
                f"lr_decay_style {view.lr_decay_style!r} needs lr_decay_iters or num_rollout "
                "(the decay's length in optimizer steps)"
            )
        if not view.rollout_batch_size or not view.global_batch_size:
            raise ValueError(
                "the learning-rate decay needs rollout_batch_size and global_batch_size"
            )
        samples = view.rollout_batch_size * view.n_samples_per_prompt
        return rollouts * max(samples // view.global_batch_size, 1)

    # -- weights ---------------------------------------------------------------------------------

    def save_weights(self, path: str | Path, *, dtype: torch.dtype | None = None) -> Path:
        """Write the student as a Hugging Face folder (config, safetensors, tokenizer files).

        Written beside ``path`` and renamed into place, so a reader (the engine's
        ``/update_weights_from_disk``) never sees half a checkpoint. ``dtype`` casts the saved
        copy (e.g. ``torch.bfloat16`` for the engine); the live model is unchanged.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".{target.name}.tmp-{os.getpid()}"
        if staging.exists():
            shutil.rmtree(staging)
        state = None
        if dtype is not None:
            cast: dict[int, Tensor] = {}  # tied tensors stay one tensor
            state = {
                k: cast.setdefault(v.data_ptr(), v.detach().to(dtype))
                for k, v in self.model.state_dict().items()
            }
        self.model.save_pretrained(str(staging), state_dict=state)  # type: ignore[operator]
        if dtype is not None:
            _set_config_dtype(staging, dtype)
        for item in self.model_path.iterdir():
            if item.is_file() and item.name.startswith(_TOKENIZER_FILES):
                shutil.copy2(item, staging / item.name)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        return target

    def load_weights(self, path: str | Path) -> None:
        """Read a folder :meth:`save_weights` wrote (same architecture) into the live student.

        Raises:
            ValueError: a tensor the student lacks, or a student tensor the folder lacks (tied
                tensors aside); the message names the folder.
        """
        from safetensors.torch import load_file

        folder = Path(path)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{folder} holds no *.safetensors weights")
        state: dict[str, Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        live = self.model.state_dict()
        loaded_ptrs = {live[k].data_ptr() for k in state if k in live}
        missing = [k for k in live if k not in state and live[k].data_ptr() not in loaded_ptrs]
        extra = sorted(set(state) - set(live))
        if missing or extra:
            raise ValueError(
                f"{folder}: weights do not fit the student (missing {missing[:3]}, "
                f"unexpected {extra[:3]})"
            )
        self.model.load_state_dict(state, strict=False)
        if self.bank is not None:
            self.bank.mark_student_changed()


def _set_config_dtype(folder: Path, dtype: torch.dtype) -> None:
    import json

    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    name = str(dtype).removeprefix("torch.")
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
