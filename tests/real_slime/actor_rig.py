"""The MOPD actor inside slime's own ``MegatronTrainRayActor``, on one CPU process.

    python -m tests.real_slime.actor_rig '{"offload_train": true}' OUT.json

Runs in a process of its own (tests/real_slime/test_mopd_actor.py starts it): it initialises a gloo
world of one, megatron-core's parallel state and slime's accelerator registry (a CPU backend
registered through slime's own ``register_accelerator``), then runs slime's real control flow:
``TrainRayActor.init`` and ``MegatronTrainRayActor.init`` (backuper, weight updater, offload),
``sleep``/``wake_up``, ``train`` → ``_get_rollout_data`` → ``train_actor`` → the MOPD actor's
teacher passes through slime's real ``forward_only`` (Megatron's pipeline schedule, with
slime's ``get_batch`` and ``get_log_probs_and_entropy``) on a tiny real language model →
slime's ``compute_advantages_and_returns`` (the MOPD advantage hook) → the postprocess slot →
slime's train-side ``log_rollout_data``. The batch is real slime ``Sample`` objects through the
project's segment expansion and converter, split by slime's ``_split_train_data_by_dp``.

Stand-ins, each only for what needs a GPU, a Megatron-LM checkpoint or a cluster: Megatron-LM's
``initialize``/model building/checkpoint loading/optimizer step (``init``,
``initialize_model_and_optimizer``, ``load_checkpoint``, ``train``), global parameter naming,
``torch_memory_saver`` (records sleep and wake), pinned host memory in ``TensorBackuper`` and
``clear_memory`` (CUDA allocator caches), the
weight updaters (they talk to SGLang engines), Megatron's hard-coded ``device="cuda"`` token
counter in its schedules, and ``ray.get``/``ray.put`` (identity). The JSON report says what
happened, for the test to judge.
"""

from __future__ import annotations

import json
import os
import sys
import types
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

VOCAB = 1024
HIDDEN = 8
TEACHERS = {"calc": {"load": "/ckpt/calc"}, "look": {"load": "/ckpt/look", "ckpt_step": 7}}
ACTOR_CKPT = "/ckpt/actor"


def _weights_seed(path: str, step: Any) -> int:
    return sum(ord(c) for c in f"{path}@{step}") % 100_000


class TinyLM(torch.nn.Module):
    """What Megatron's schedule needs of a model chunk, over a real (tiny) embedding LM."""

    def __init__(self) -> None:
        super().__init__()
        from megatron.core.enums import ModelType
        from megatron.core.transformer import TransformerConfig

        self.config = TransformerConfig(
            num_layers=1, hidden_size=HIDDEN, num_attention_heads=1, use_cpu_initialization=True
        )
        self.model_type = ModelType.encoder_or_decoder
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2))

    def set_input_tensor(self, tensor: Any) -> None:
        return None

    def forward(self, input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        hidden = torch.tanh(self.embed(input_ids))
        for layer in self.layers:  # what a streamed restore streams, layer by layer
            hidden = hidden + torch.tanh(layer(hidden))
        return self.head(hidden).float()

    def load(self, path: str, step: Any) -> None:
        g = torch.Generator().manual_seed(_weights_seed(path, step))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))


class Saver:
    """torch_memory_saver: records pause (sleep) and resume (wake)."""

    def __init__(self, events: list[Any]) -> None:
        self.events, self.asleep = events, False

    def pause(self) -> None:
        self.asleep = True
        self.events.append("pause")

    def resume(self) -> None:
        self.asleep = False
        self.events.append("resume")

    def disable(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


def _cpu_accelerator() -> None:
    from slime.utils import accelerator
    from slime.utils.accelerator.base import Accelerator

    class Cpu(Accelerator):
        name, device_type, communication_backend_name = "cpu", "cpu", "gloo"

        def is_available(self) -> bool:
            return True

        def device(self, index: Any = None) -> torch.device:
            return torch.device("cpu")

        def device_name(self, index: Any = None) -> str:
            return "cpu"

        def set_device(self, index: Any) -> None:
            return None

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def synchronize(self, device: Any = None) -> None:
            return None

        def current_stream(self, device: Any = None) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def mem_get_info(self, device: Any = None) -> tuple[int, int]:
            return (1 << 30, 1 << 31)

        def memory_allocated(self, device: Any = None) -> int:
            return 0

        def memory_reserved(self, device: Any = None) -> int:
            return 0

    accelerator.register_accelerator("cpu", Cpu, lambda: True, communication_backends=("gloo",))
    os.environ["SLIME_ACCELERATOR"] = "cpu"
    accelerator.reset_accelerator()


class _TorchWithoutCuda(types.ModuleType):
    """``torch`` for Megatron's schedules: its token counter asks for ``device="cuda"``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return torch.zeros(*args, **kwargs)


class _TorchWithoutPinning(types.ModuleType):
    """``torch`` for slime's TensorBackuper: host copies, unpinned (no pinned allocator here)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty_like(*args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("pin_memory", None)
        return torch.empty_like(*args, **kwargs)


def slime_args(scenario: dict[str, Any], tmp: Path) -> Namespace:
    """The options slime's actor reads on this path, as slime's parser would leave them."""
    from dressage.tiny import tiny_model_dir
    from tests.real_slime.slime_parts import MOPD_LOSS_ARGS, SPLIT_AND_LOGGING_ARGS

    config = {
        "teachers": TEACHERS,
        "datasets": [
            {"name": n, "path": "x.jsonl", "teacher_id": n, "weight": 1, "agent_mode": "blackbox"}
            for n in TEACHERS
        ],
    }
    (tmp / "mopd.json").write_text(json.dumps(config))
    values: dict[str, Any] = dict(
        # slime's placement, parallelism and offload
        debug_rollout_only=False,
        debug_train_only=False,
        distributed_backend="nccl",
        distributed_timeout_minutes=5,
        num_gpus_per_node=1,
        colocate=False,
        offload_train=False,
        use_critic=False,
        keep_old_actor=False,
        vocab_size=None,
        update_weight_mode="full",
        update_weight_transport="nccl",
        model_name=None,
        rollout_data_postprocess_path=None,
        hf_checkpoint=str(tiny_model_dir()),
        load=ACTOR_CKPT,
        ref_load=ACTOR_CKPT,
        ref_ckpt_step=None,
        opd_teacher_load=None,
        opd_teacher_ckpt_step=None,
        ckpt_step=None,
        no_load_optim=False,
        no_load_rng=False,
        finetune=False,
        use_pytorch_profiler=False,
        record_memory_history=False,
        profile_target=[],
        # batching
        micro_batch_size=1,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        global_batch_size=3,
        n_samples_per_prompt=1,
        rollout_batch_size=3,
        data_pad_size_multiplier=4,
        seq_length=64,
        # the model, as Megatron's flags describe it (slime's FLOPs estimate reads them)
        hidden_size=HIDDEN,
        ffn_hidden_size=4 * HIDDEN,
        num_layers=1,
        num_attention_heads=1,
        num_query_groups=1,
        kv_channels=HIDDEN,
        num_experts=None,
        moe_ffn_hidden_size=None,
        moe_router_topk=None,
        moe_layer_freq=1,
        # log-probs and loss
        use_rollout_entropy=False,
        rollout_temperature=1.0,
        custom_megatron_before_log_prob_hook_path=None,
        compute_advantages_and_returns=True,
        use_routing_replay=False,
        use_rollout_routing_replay=False,
        get_mismatch_metrics=False,
        ref_update_interval=None,
        save_debug_train_data=None,
        # reward post-processing (the converter)
        rewards_normalization=False,
        grpo_std_normalization=False,
        reward_key=None,
        context_parallel_size=1,
        # MOPD
        mopd_config=str(tmp / "mopd.json"),
        mopd_advantage_clip=None,
        mopd_metrics_dir=str(tmp / "metrics"),
    )
    values.update(SPLIT_AND_LOGGING_ARGS, **MOPD_LOSS_ARGS)
    values.update(scenario.get("args", {}))
    return Namespace(**values)


class Rig:
    """The stand-ins, wired into slime's modules, and what they saw."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.saver = Saver(self.events)
        self.forward_passes: list[dict[str, Any]] = []
        self.logged: list[dict[str, Any]] = []
        self.trained: list[dict[str, Any]] = []
        self.loads: list[dict[str, Any]] = []

    def install(self, actor_mod: Any) -> None:
        import megatron.core.pipeline_parallel.schedules as schedules
        import slime.utils.tensor_backper as backper
        from megatron.core import parallel_state as mpu
        from slime.backends.megatron_utils import model as model_mod
        from slime.observability import logging_utils

        rig = self
        schedules.torch = _TorchWithoutCuda("torch")  # type: ignore[assignment]
        backper.torch = _TorchWithoutPinning("torch")  # type: ignore[assignment]
        actor_mod.torch_memory_saver = self.saver
        actor_mod.init = lambda args: mpu.initialize_model_parallel(1, 1)

        def initialize_model_and_optimizer(args: Any, role: str) -> Any:
            model = TinyLM()
            model.load(args.load, args.ckpt_step)
            rig.model = model
            return [model], None, None, -1

        def load_checkpoint(model: Any, *_: Any, **__: Any) -> Any:
            args = rig.args
            rig.loads.append(
                {"load": args.load, "ckpt_step": args.ckpt_step, "asleep": rig.saver.asleep}
            )
            model[0].load(args.load, args.ckpt_step)
            return 0, 0

        def named_params_and_buffers(args: Any, model: Any, **_: Any) -> Any:
            return list(model[0].named_parameters())

        class Updater:
            def __init__(self, args: Any, model: Any, **kwargs: Any) -> None:
                rig.events.append(f"updater:{type(self).__name__}")

            def pop_metrics(self) -> dict[str, float]:
                return {}

        def train(rollout_id: int, model: Any, *_: Any, **__: Any) -> None:
            data = rig.actor_data
            rig.trained.append(
                {
                    "rollout_id": rollout_id,
                    "keys": sorted(data),
                    "advantages": [t.tolist() for t in data["advantages"]],
                }
            )
            with torch.no_grad():  # as an optimizer step would: the student moves
                for param in model[0].parameters():
                    param.add_(0.25)

        original_forward_only = model_mod.forward_only

        def forward_only(f: Any, args: Any, model: Any, data_iterator: Any, *a: Any, **k: Any):
            indices = data_iterator[0].micro_batch_indices
            tags = rig.actor._active_model_tag
            tokens = data_iterator[0].rollout_data["tokens"]
            backup = rig.actor.weights_backuper.get(tags)
            rig.forward_passes.append(
                {
                    "prefix": k.get("store_prefix", ""),
                    "tag": tags,
                    "on_its_weights": all(
                        torch.equal(p, backup[n]) for n, p in model[0].named_parameters()
                    ),
                    "replay_stage": os.environ.get("ROUTING_REPLAY_STAGE"),
                    "micro_batches": [[int(tokens[i][0]) for i in mb] for mb in indices],
                }
            )
            return original_forward_only(f, args, model, data_iterator, *a, **k)

        actor_mod.initialize_model_and_optimizer = initialize_model_and_optimizer
        actor_mod.load_checkpoint = load_checkpoint
        actor_mod.named_params_and_buffers = named_params_and_buffers
        actor_mod.UpdateWeightFromTensor = type("UpdateWeightFromTensor", (Updater,), {})
        actor_mod.UpdateWeightFromDistributed = type("UpdateWeightFromDistributed", (Updater,), {})
        actor_mod.UpdateWeightFromDisk = type("UpdateWeightFromDisk", (Updater,), {})
        actor_mod.forward_only = forward_only
        model_mod.forward_only = forward_only  # where the MOPD actor's top-k pass imports it
        # the pinned-host allocator's cache exists only in CUDA builds of torch
        actor_mod.clear_memory = lambda clear_host_memory=False: None
        actor_mod.train = train
        logging_utils.log = lambda args, metrics, step_key: rig.logged.append(dict(metrics))


POSTPROCESS_SAW: list[list[str]] = []


def user_postprocess(args: Any, rollout_id: int, rollout_data: dict[str, Any]) -> None:
    """A user's ``--rollout-data-postprocess-path`` hook: records the keys it was given."""
    POSTPROCESS_SAW.append(sorted(rollout_data))


def _samples(args: Any) -> list[Any]:
    """Real slime Samples: 3 trajectories, 2 teachers, one trajectory in 2 segments."""
    from tests.rollout.factories import template, trajectory

    out: list[Any] = []
    for index, (teacher, split) in enumerate([("calc", [3]), ("look", [2, 4]), ("look", [5])]):
        tmpl = template(index, index, teacher_id=teacher)
        out += trajectory(args, tmpl, split, reward=float(index % 2))
    for s in out:
        s.tokens = [t % VOCAB for t in s.tokens]
        s.tokens[0] = 1 + len(out) + out.index(s)  # a tag: which sample a micro-batch holds
    return out


def _split(args: Any, train_data: dict[str, Any]) -> list[Any]:
    """slime's own ``_split_train_data_by_dp`` on the converter's output (one DP rank)."""
    import slime.ray.rollout as rollout_mod

    from tests.real_slime.slime_parts import bare_manager

    rollout_mod.ray = types.SimpleNamespace(put=lambda value, **_: value)  # type: ignore[assignment]
    refs: list[Any] = bare_manager(args)._split_train_data_by_dp(train_data)
    return refs


def run(scenario: dict[str, Any], tmp: Path) -> dict[str, Any]:
    import torch.distributed as dist

    from tests.helpers import free_port
    from tests.real_slime import standins

    standins.install()
    os.environ.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        SLIME_DESTROY_WORLD_PROCESS_GROUP="0",
    )
    _cpu_accelerator()
    import slime.backends.megatron_utils.actor as actor_mod
    import slime.utils.data as data_mod

    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from dressage.training.mopd_actor import make_mopd_actor_cls

    rig = Rig()
    rig.install(actor_mod)
    args = slime_args(scenario, tmp)
    rig.args = args
    data_mod.ray = types.SimpleNamespace(get=lambda value: value)  # type: ignore[assignment]

    cls = make_mopd_actor_cls()
    if scenario.get("streamed"):  # the streamed switches, their copies inline (no CUDA here)
        from dressage.training.weight_streaming import InlineCopies

        cls._mopd_copies = lambda self: InlineCopies()  # type: ignore[attr-defined]
    actor = cls.__new__(cls)
    actor._rank, actor._world_size = 0, 1
    rig.actor = actor
    report: dict[str, Any] = {"events": rig.events}
    start = actor.init(args, "actor", with_ref=bool(scenario.get("with_ref")))
    report["init"] = {
        "start_rollout_id": start,
        "asleep": rig.saver.asleep,
        "active": actor._active_model_tag,
        "tags": sorted(actor.weights_backuper.backup_tags),
        "loads": list(rig.loads),
        "ckpt_step_after": args.ckpt_step,
        "live_is_actor": _live_matches(actor, ACTOR_CKPT, None),
        "teacher_tags_hold": {
            tid: _tag_matches(actor, f"teacher:{tid}", spec["load"], spec.get("ckpt_step"))
            for tid, spec in TEACHERS.items()
        },
    }
    samples = _samples(args)
    teacher_of = {int(s.tokens[0]): s.metadata["teacher_id"] for s in samples}
    refs = _split(args, convert_samples_to_train_data(args, samples))

    original_train_actor = type(actor).train_actor

    def spy(self: Any, rollout_id: int, rollout_data: dict[str, Any], external_data: Any = None):
        rig.actor_data = rollout_data
        out = original_train_actor(self, rollout_id, rollout_data, external_data)
        report["left_in_rollout_data"] = sorted(rollout_data)
        teacher = rollout_data["teacher_log_probs"]
        report["teacher_log_probs"] = [t.tolist() for t in teacher]
        report["expected_teacher_log_probs"] = _expected(rollout_data, teacher_of)
        if getattr(args, "mopd_objective", "sampled") == "topk":
            report["teacher_supports"] = [_support_lists(t) for t in teacher]
            report["expected_teacher_supports"] = _expected_supports(
                rollout_data, teacher_of, int(args.mopd_topk)
            )
        return out

    type(actor).train_actor = spy  # type: ignore[method-assign]
    restores: list[str] = []
    restore = actor.weights_backuper.restore

    def counted(tag: str) -> None:
        restores.append(tag)
        restore(tag)

    actor.weights_backuper.restore = counted
    for step in range(int(scenario.get("steps", 1))):
        rig.events.append("train")
        actor.train(step, refs)
        refs = _split(args, convert_samples_to_train_data(args, samples))  # the step took them
    backup = actor.weights_backuper.get("actor")
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in actor.model[0].modules())
    report.update(
        hooks_left=hooks,
        restores=restores,
        live_is_trained_actor=all(torch.equal(p, backup[n]) for n, p in _live(actor).items()),
        forward_passes=rig.forward_passes,
        logged=rig.logged,
        trained=rig.trained,
        after_train={"asleep": rig.saver.asleep, "active": actor._active_model_tag},
        teacher_of_sample={str(k): v for k, v in teacher_of.items()},
        teachers_jsonl=_read_lines(tmp / "metrics" / "teachers.jsonl"),
        user_postprocess_saw=POSTPROCESS_SAW,
    )
    dist.destroy_process_group()
    return report


def _expected(rollout_data: dict[str, Any], teacher_of: dict[int, str]) -> list[list[float]]:
    """Each sample's response log-probs under its own teacher's weights, computed here directly
    (plain ``log_softmax`` over the tiny model's logits)."""
    out = []
    for tokens, resp in zip(rollout_data["tokens"], rollout_data["response_lengths"], strict=True):
        spec = TEACHERS[teacher_of[int(tokens[0])]]
        model = TinyLM()
        model.load(spec["load"], spec.get("ckpt_step"))
        with torch.no_grad():
            logp = torch.log_softmax(model(tokens.long()), -1)
        total = len(tokens)
        rows = torch.arange(total - resp - 1, total - 1)
        out.append(logp[rows, tokens[total - resp :].long()].tolist())
    return out


def _support_lists(teacher_log_probs: torch.Tensor) -> dict[str, Any] | None:
    from dressage.training.mopd_topk import support_of

    support = support_of(teacher_log_probs)
    if support is None:
        return None
    return {
        "ids": support.ids.tolist(),
        "log_probs": support.log_probs.tolist(),
        "tail": support.tail.tolist(),
    }


def _expected_supports(
    rollout_data: dict[str, Any], teacher_of: dict[int, str], k: int
) -> list[dict[str, Any]]:
    """Each sample's top-k support under its own teacher, computed here directly: the k most
    likely tokens of the full ``log_softmax`` and the log-mass of every token outside them and
    the sampled one."""
    out = []
    for tokens, resp in zip(rollout_data["tokens"], rollout_data["response_lengths"], strict=True):
        spec = TEACHERS[teacher_of[int(tokens[0])]]
        model = TinyLM()
        model.load(spec["load"], spec.get("ckpt_step"))
        total = len(tokens)
        with torch.no_grad():
            logp = torch.log_softmax(model(tokens.long()).double(), -1)
        rows = logp[total - resp - 1 : total - 1]
        top = rows.topk(k, dim=-1)
        outside = torch.ones_like(rows, dtype=torch.bool)
        outside.scatter_(-1, top.indices, False)
        outside.scatter_(-1, tokens[total - resp :].long()[:, None], False)
        tail = torch.logsumexp(rows.masked_fill(~outside, float("-inf")), -1)
        out.append(
            {"ids": top.indices.tolist(), "log_probs": top.values.tolist(), "tail": tail.tolist()}
        )
    return out


def _live(actor: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in actor.model[0].named_parameters()}


def _reference_weights(path: str, step: Any) -> dict[str, torch.Tensor]:
    model = TinyLM()
    model.load(path, step)
    return {n: p.detach() for n, p in model.named_parameters()}


def _live_matches(actor: Any, path: str, step: Any) -> bool:
    want = _reference_weights(path, step)
    return all(torch.equal(v, want[n]) for n, v in _live(actor).items())


def _tag_matches(actor: Any, tag: str, path: str, step: Any) -> bool:
    if tag not in actor.weights_backuper.backup_tags:
        return False
    want = _reference_weights(path, step)
    got = actor.weights_backuper.get(tag)
    return all(torch.equal(got[n], want[n]) for n in want)


def _read_lines(path: Path) -> list[Any]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    scenario = json.loads(sys.argv[1])
    out = Path(sys.argv[2])
    from tests.real_slime import (
        actor_rig,  # this file as a module (hooks slime loads by path see it)
    )

    report = actor_rig.run(scenario, out.parent)
    out.write_text(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
