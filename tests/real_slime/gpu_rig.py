"""The MOPD actor inside slime's ``MegatronTrainRayActor`` on a real GPU, with real Megatron.

    python -m tests.real_slime.gpu_rig all WORK_DIR         # every phase, a report per phase
    python -m tests.real_slime.gpu_rig train WORK_DIR SCENARIO_JSON
    python -m tests.real_slime.gpu_rig record WORK_DIR      # train data recorded through the proxy

Needs CUDA, slime (``SLIME_ROOT``) and Megatron-LM's training code (``MEGATRON_LM_ROOT``) on
``PYTHONPATH``, numpy 1.x (Megatron refuses 2.x), and the embedded config's tiny checkpoints in
the asset cache. Phases, each in a process of its own (Megatron's state is global):

1. ``convert``: the student and both teachers to ``torch_dist`` with
   :mod:`dressage.slime.torch_dist` (slime's Hugging Face loader, Megatron's ``save_checkpoint``),
   and the student back to Hugging Face with slime's saver; the round trip must give the
   checkpoint's weights rounded to bf16, bit for bit.
2. ``train``: slime's real ``MegatronTrainRayActor.init`` with the project's MOPD actor class
   (Megatron's initialisation, ``get_model``, the distributed optimizer in bf16, slime's
   ``load_checkpoint`` of the student, each teacher into slime's ``TensorBackuper`` in pinned
   host memory), then ``train`` on one rollout.

Stand-ins, each only for a package that cannot run or travel here: ``sglang`` and
``sglang_router`` (import-only placeholders: nothing here talks to an engine; the one sglang call
on this path, its patch of torch's tensor pickling for engine processes that slime's Hugging Face
saver makes first, does nothing), ``ray`` when it is not installed (its wheel does not travel
whole: ``ray.remote`` leaves a class as it is, ``ray.get``/``ray.put`` are the identity on
slime's data path, as in the CPU rig), and ``wandb`` when it is not installed (no run is
tracked). The model is built with :mod:`dressage.slime.layer_spec` (Megatron's local spec with
TE's names and packed-sequence attention), since Transformer Engine does not travel either.
Everything of Megatron, slime's actor, its ``TensorBackuper`` and its offload is the real code.

3. ``embedded``: the embedded trainer's first step on a scenario's slime arguments, batch and
   weights (bf16 as slime trains, and float32 on the same bf16 values), for the numerics
   comparison of test_megatron_gpu.py.
4. ``learn`` (tests/real_slime/gpu_learn.py): 30 on-policy MOPD steps through the actor per
   objective, with the held-out reverse KL to each teacher along the way.

After ``convert``, ``all`` runs every other phase at once (processes of their own on the one
GPU; nothing here is timed against anything else).

Train data: the ``train`` phase's scenarios train on the converter's output for factory-made
segments, except ``plain_recorded``, which trains on samples recorded as a run records them: the
``record`` phase runs the student's agent sessions through the recording proxy in front of the
embedded engine (``MopdDataSource``, the black-box dispatch, the reward hook) and saves the
samples. The proxy's store needs polars, whose wheel does not travel beside the tier's to the GPU
machine; there ``all`` takes the samples that ``record`` wrote on another machine, from the file
``DRESSAGE_RECORDED_SAMPLES`` names. The token ids are the embedded student's either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

import torch

EMBEDDED = Path(__file__).resolve().parents[2] / "configs" / "mopd" / "embedded.json"


def _checkpoints() -> dict[str, Path]:
    """The embedded config's student and teachers as Hugging Face folders (built if missing)."""
    from dressage.tiny.checkpoints import resolve_checkpoint

    config = json.loads(EMBEDDED.read_text())
    out = {"student": Path(resolve_checkpoint(config["student"]["hf_checkpoint"]))}
    for tid, spec in sorted(config["teachers"].items()):
        out[tid] = Path(resolve_checkpoint(spec["load"]))
    return out


SCENARIOS: tuple[dict[str, Any], ...] = (
    {"name": "plain_sampled"},
    {"name": "plain_topk", "objective": "topk"},
    {"name": "colocate_offload", "objective": "topk", "extra": ["--colocate"]},
    {"name": "plain_sampled_fp32", "fp32": True},
    {
        "name": "plain_recorded",
        "objective": "topk",
        "data": "recorded",
        # the record phase's 4 sessions (2 per task), one step over all of them
        "extra": ["--rollout-batch-size", "4", "--global-batch-size", "4"],
    },
)
"""The layouts and objectives ``all`` runs: plain, and colocated with slime's offload of the
actor (``--colocate`` turns ``--offload-train`` on), through torch_memory_saver; and plain in
float32."""
COMPARED = ("plain_sampled", "plain_sampled_fp32")
"""The scenarios whose first step the embedded trainer also takes (the numerics comparison)."""
LEARNED = ("sampled", "topk")
"""The objectives ``all`` trains for 20+ steps (tests/real_slime/gpu_learn.py)."""


def _offload_env() -> dict[str, str]:
    """What slime's actor group puts in a train actor's environment under ``--offload-train``
    (slime/ray/actor_group.py): torch_memory_saver's preload hook and its switches."""
    import torch_memory_saver

    folder = Path(torch_memory_saver.__file__).resolve().parents[1]
    for name in (
        "torch_memory_saver_hook_mode_preload_cu13.abi3.so",
        "torch_memory_saver_hook_mode_preload_cu12.abi3.so",
        "torch_memory_saver_hook_mode_preload.abi3.so",
    ):
        if (folder / name).exists():
            break
    else:
        raise FileNotFoundError(f"no torch_memory_saver preload library in {folder}")
    return {
        "LD_PRELOAD": str(folder / name),
        "TMS_INIT_ENABLE": "1",
        "TMS_INIT_ENABLE_CPU_BACKUP": "1",
        "NCCL_CUMEM_ENABLE": os.environ.get("NCCL_CUMEM_ENABLE", "0"),
    }


Job = tuple[list[str], Path, float, dict[str, str]]
"""A phase to run: its command, its log, its time limit (s) and environment additions."""


def _run(
    argv: list[str], log: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> dict[str, Any]:
    return _run_all({"job": (argv, log, timeout, env or {})})["job"]


def _run_all(jobs: dict[str, Job]) -> dict[str, dict[str, Any]]:
    """Run the phases at once (each a process of its own, on the one GPU; none is timed here)
    and report each one's exit code, seconds and the tail of its log."""
    started = time.perf_counter()
    running = {}
    for name, (argv, log, timeout, env) in jobs.items():
        f = log.open("w")
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env})
        running[name] = (proc, f, log, timeout)
    out: dict[str, dict[str, Any]] = {}
    for name, (proc, f, log, timeout) in running.items():
        try:
            rc = proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        f.close()
        tail = log.read_text().splitlines()[-25:]
        out[name] = {
            "rc": rc,
            "seconds": round(time.perf_counter() - started, 1),
            "tail": tail if rc else tail[-3:],
        }
    return out


_CONVERT = [sys.executable, "-m", "tests.real_slime.gpu_rig", "torch-dist"]
"""dressage.slime.torch_dist's command line, with the stand-ins in place."""


def convert(work: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    report: dict[str, Any] = {}
    ckpts = _checkpoints()
    report["hf"] = {k: str(v) for k, v in ckpts.items()}
    jobs: dict[str, Job] = {
        f"to_torch_dist:{name}": (
            [*_CONVERT, "to-torch-dist", str(hf), str(work / "torch_dist" / name)],
            work / f"convert_{name}.log",
            600,
            {},
        )
        for name, hf in ckpts.items()
    }
    report.update(_run_all(jobs))
    back = work / "hf_back" / "student"
    report["to_hf:student"] = _run(
        [
            *_CONVERT, "to-hf",
            str(work / "torch_dist" / "student"), str(ckpts["student"]), str(back),
        ],
        work / "convert_back.log",
    )  # fmt: skip
    if report["to_hf:student"]["rc"] == 0:
        want = load_file(str(ckpts["student"] / "model.safetensors"))
        got: dict[str, torch.Tensor] = {}
        for f in sorted(back.glob("*.safetensors")):
            got.update(load_file(str(f)))
        diffs = {}
        for key, value in want.items():
            other = got.get(key)
            if other is None:
                diffs[key] = "missing"
            elif not torch.equal(other.to(torch.bfloat16), value.to(torch.bfloat16)):
                diffs[key] = float((other.float() - value.float()).abs().max())
        report["round_trip"] = {
            "keys_want": len(want),
            "keys_got": len(got),
            "extra": sorted(set(got) - set(want))[:10],
            "differ": diffs,
            "dtypes": sorted({str(t.dtype) for t in got.values()}),
        }
    return report


def _stand_ins() -> list[str]:
    """Answer the imports of the packages that cannot run or travel here; returns their names."""
    import importlib

    from tests.real_slime import standins
    from tests.real_slime.standins import _Finder

    missing = list(standins.install())
    absent: tuple[str, ...] = ()
    for name in ("ray", "wandb"):
        try:
            importlib.import_module(name)
        except ImportError:
            absent += (name,)
    if absent:
        sys.meta_path.insert(0, _Finder(absent))
        missing += absent
    if "ray" in absent:
        import ray

        def remote(*args: Any, **kwargs: Any) -> Any:  # @ray.remote and @ray.remote(...)
            if len(args) == 1 and not kwargs and callable(args[0]):
                return args[0]
            return lambda target: target

        ray.remote = remote
        ray.get = ray.put = lambda value, **_: value  # the object store is this process
    if "sglang" in missing:
        # sglang's patch of torch's multiprocessing reductions lets CUDA tensors travel to an
        # engine process; slime's Hugging Face saver applies it first. No engine runs here.
        patch_torch = importlib.import_module("sglang.srt.utils.patch_torch")
        patch_torch.monkey_patch_torch_reductions = lambda: None
    if "wandb" in absent:
        import wandb

        wandb.run = None  # no tracker: slime and the MOPD metrics check this before logging
    return missing


def write_mopd_config(work: Path, teachers: dict[str, str]) -> Path:
    """``WORK/mopd.json``: each teacher (id -> torch_dist folder) with one dataset routed to it
    (its prompts are never read: the rig trains on samples it makes)."""
    config = {
        "teachers": {tid: {"load": load} for tid, load in teachers.items()},
        "datasets": [
            {"name": t, "path": "x.jsonl", "teacher_id": t, "weight": 1, "agent_mode": "blackbox"}
            for t in teachers
        ],
    }
    path = work / "mopd.json"
    path.write_text(json.dumps(config))
    return path


def _train_argv(work: Path, scenario: dict[str, Any]) -> list[str]:
    from dressage.slime.model_flags import megatron_model_flags
    from dressage.slime.torch_dist import _RUN_FLAGS

    ckpts = _checkpoints()
    write_mopd_config(
        work, {tid: str(work / "torch_dist" / tid) for tid in ckpts if tid != "student"}
    )
    run = [f for f in _RUN_FLAGS]
    run[run.index("--num-rollout") + 1] = "1"
    run[run.index("--rollout-batch-size") + 1] = "3"
    run[run.index("--global-batch-size") + 1] = "3"
    argv = [*megatron_model_flags(ckpts["student"]), *run]
    argv += ["--hf-checkpoint", str(ckpts["student"])]
    # as a slime user starts from a converted model: --ref-load names it, --load the run's own
    # (empty) checkpoint folder, so slime loads the weights with --finetune and no optimizer
    argv += ["--ref-load", str(work / "torch_dist" / "student"), "--load", str(work / "save")]
    argv += ["--save", str(work / "save"), "--save-interval", "100"]
    argv += ["--mopd-config", str(work / "mopd.json")]
    argv += ["--mopd-metrics-dir", str(work / "metrics"), "--n-samples-per-prompt", "1"]
    argv += ["--optimizer", "adam", "--lr", "1e-4", "--lr-decay-style", "constant"]
    argv += ["--weight-decay", "0.0", "--adam-beta1", "0.9", "--adam-beta2", "0.98"]
    argv += ["--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"]
    argv += ["--mopd-objective", scenario.get("objective", "sampled")]
    argv += list(scenario.get("extra", []))
    return argv


RECORDED = "recorded_samples.pt"
PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 48}


def record(work: Path, per_task: int = 2) -> dict[str, Any]:
    """Train data as a run makes it: the student serves on the embedded engine (CPU) behind the
    recording proxy; the embedded config's datasets give the prompts (``MopdDataSource``); the
    black-box dispatch (``--custom-generate-function-path``) runs the tool agent through the
    proxy and expands each session into samples; the reward hook scores the anchors. The
    samples are saved to ``WORK/recorded_samples.pt`` for the ``train`` phase."""
    import asyncio
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from dressage.engine.testing import serve_engine
    from dressage.proxy.tito import create_tito_tokenizer
    from dressage.reward.custom_rm import custom_rm
    from dressage.rollout.data_source import MopdDataSource
    from dressage.rollout.generate.blackbox_dispatch import generate
    from tests.proxy.conftest import running_proxy

    student = _checkpoints()["student"]
    tito = create_tito_tokenizer(AutoTokenizer.from_pretrained(str(student)), "qwen3.5")
    config = json.loads(EMBEDDED.read_text())
    args = SimpleNamespace(
        mopd_config=str(EMBEDDED),
        n_samples_per_prompt=1,
        rollout_seed=0,
        dressage_agent="tool_user",
        dressage_agent_attempts=1,
        reward_modules=config.get("reward_modules"),
    )
    samples: list[Any] = []
    with (
        serve_engine(student, device="cpu", num_threads=1, context_length=2048) as engine,
        running_proxy(engine, work / "store", tito, engine_retries=0) as url,
    ):
        args.dressage_proxy_url = url
        groups = MopdDataSource(args).get_samples(per_task * len(config["datasets"]))
        for (prompt,) in groups:
            expanded = asyncio.run(generate(args, prompt, dict(PARAMS)))
            anchor = expanded[-1]
            anchor.reward = asyncio.run(custom_rm(args, anchor))
            samples += expanded
    torch.save(samples, work / RECORDED)
    return {
        "samples": len(samples),
        "sessions": len({s.session_id for s in samples}),
        "teachers": sorted({s.metadata.get("teacher_id") for s in samples}),
        "response_tokens": sum(int(sum(s.loss_mask or [])) for s in samples),
        "rewards": [s.reward for s in samples if s.reward is not None],
    }


RECORDED_ENV = "DRESSAGE_RECORDED_SAMPLES"
"""Names a ``recorded_samples.pt`` that the ``record`` phase wrote elsewhere."""


def recorded_samples(work: Path) -> dict[str, Any]:
    """``WORK/recorded_samples.pt`` for the ``plain_recorded`` scenario: recorded here when the
    proxy's packages import, else copied from the file :data:`RECORDED_ENV` names."""
    import importlib.util
    import shutil

    given = os.environ.get(RECORDED_ENV)
    if all(importlib.util.find_spec(m) for m in ("polars", "fastapi", "uvicorn")):
        return {"recorded_here": True, **record(work)}
    if given and Path(given).is_file():
        shutil.copyfile(given, work / RECORDED)
        return {"recorded_here": False, "from": given}
    raise FileNotFoundError(
        f"no recorded samples: the proxy's packages (polars, fastapi, uvicorn) are not installed "
        f"and {RECORDED_ENV} names no file; run `python -m tests.real_slime.gpu_rig record DIR` "
        f"where they are and set {RECORDED_ENV}=DIR/{RECORDED}"
    )


def _samples(args: Any, vocab: int) -> list[Any]:
    from tests.rollout.factories import template, trajectory

    out: list[Any] = []
    teachers = sorted(json.loads(Path(args.mopd_config).read_text())["teachers"])
    for index, (teacher, split) in enumerate(
        [(teachers[0], [3]), (teachers[1], [2, 4]), (teachers[1], [5])]
    ):
        tmpl = template(index, index, teacher_id=teacher)
        out += trajectory(args, tmpl, split, reward=float(index % 2))
    for s in out:
        s.tokens = [t % vocab for t in s.tokens]
    return out


def start_actor(
    work: Path, scenario: dict[str, Any], argv: list[str] | None = None
) -> tuple[Any, Any, dict[str, Any], list[dict[str, Any]]]:
    """slime's ``MegatronTrainRayActor.init`` with the MOPD actor class on ``scenario``'s
    arguments (``argv``: more flags after them). Returns the arguments, the actor, the init
    report and the list that collects every metrics dict slime logs.

    ``"fp32": true`` trains in float32: slime sets ``--bf16`` itself, so the arguments are
    changed after parsing (the model, Megatron's optimizer and the loaded bf16 checkpoints in
    float32)."""
    report: dict[str, Any] = {"stood_in": _stand_ins()}
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    from tests.helpers import free_port

    os.environ["MASTER_PORT"] = str(free_port())
    import slime.ray.rollout as rollout_mod
    import slime.utils.data as data_mod
    from slime.observability import logging_utils

    from dressage.training.mopd_actor import make_mopd_actor_cls
    from dressage.training.mopd_train import parse_mopd_args

    args = parse_mopd_args([*_train_argv(work, scenario), *(argv or [])])
    if scenario.get("fp32"):
        args.bf16, args.params_dtype = False, torch.float32
    report["args"] = {
        k: str(getattr(args, k, None))
        for k in (
            "bf16",
            "params_dtype",
            "use_distributed_optimizer",
            "padded_vocab_size",
            "load",
            "finetune",
        )  # fmt: skip
    }
    logged: list[dict[str, Any]] = []
    original_log = logging_utils.log

    def log(args: Any, metrics: dict[str, Any], step_key: str) -> None:
        logged.append({k: float(v) for k, v in metrics.items() if isinstance(v, int | float)})
        original_log(args, metrics, step_key)

    logging_utils.log = log
    data_mod.ray = types.SimpleNamespace(get=lambda value: value)  # type: ignore[assignment]
    rollout_mod.ray = types.SimpleNamespace(put=lambda value, **_: value)  # type: ignore[assignment]

    cls = make_mopd_actor_cls()
    actor = cls.__new__(cls)
    actor._rank, actor._world_size = 0, 1
    started = time.perf_counter()
    start = actor.init(args, "actor")
    backuper = actor.weights_backuper
    report["init"] = {
        "seconds": round(time.perf_counter() - started, 1),
        "start_rollout_id": start,
        "tags": sorted(backuper.backup_tags),
        "active": actor._active_model_tag,
        "optimizer": type(actor.optimizer).__name__,
        "optimizers": [
            type(o).__name__
            for o in getattr(actor.optimizer, "chained_optimizers", [actor.optimizer])
        ],
        "param_dtypes": sorted({str(p.dtype) for p in actor.model[0].parameters()}),
        "pinned": {
            tag: all(t.is_pinned() for t in backuper.get(tag).values())
            for tag in backuper.backup_tags
        },
        "gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
        "offload_train": bool(getattr(args, "offload_train", False)),
        "gpu_gb_after_init": round(torch.cuda.memory_allocated() / 1e9, 3),
    }
    return args, actor, report, logged


def main_params(actor: Any) -> list[torch.Tensor]:
    """The distributed optimizer's float32 main parameters (its shards of the model)."""
    out: list[torch.Tensor] = []
    for opt in getattr(actor.optimizer, "chained_optimizers", [actor.optimizer]):
        for attr in ("shard_fp32_from_float16_groups", "shard_fp32_groups"):
            for group in getattr(opt, attr, None) or []:
                out += [t for t in group if t is not None]
    return out


def _held_weights(actor: Any, out: Path) -> dict[str, Any]:
    """What the actor's model holds now, written through slime's Hugging Face saver and compared
    with the teacher's own checkpoint rounded to bf16 (the active tag names the teacher)."""
    from safetensors.torch import load_file
    from slime.backends.megatron_utils.hf_checkpoint_saver import save_hf_model_to_path
    from transformers import AutoConfig

    tid = str(actor._active_model_tag).removeprefix("teacher:")
    config = AutoConfig.from_pretrained(str(actor.args.hf_checkpoint))
    save_hf_model_to_path(actor.args, out, actor.model, model_name=type(config).__name__.lower())
    want = load_file(str(_checkpoints()[tid] / "model.safetensors"))
    got: dict[str, torch.Tensor] = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(load_file(str(f)))
    differ = {
        key: float((got[key].float() - value.to(torch.bfloat16).float()).abs().max())
        for key, value in want.items()
        if key in got and not torch.equal(got[key].float(), value.to(torch.bfloat16).float())
    }
    return {"keys": len(got), "missing": sorted(set(want) - set(got)), "differ": differ}


def train(work: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from tests.real_slime.slime_parts import bare_manager

    args, actor, report, logged = start_actor(work, scenario)
    if scenario.get("data") == "recorded":
        samples = torch.load(work / RECORDED, weights_only=False)
    else:
        samples = _samples(args, int(args.vocab_size))
    refs = bare_manager(args)._split_train_data_by_dp(convert_samples_to_train_data(args, samples))
    seen: dict[str, Any] = {}
    original_train_actor = type(actor).train_actor

    def spy(self: Any, rollout_id: int, rollout_data: dict[str, Any], external_data: Any = None):
        # awake here (under --offload-train slime's train has woken the actor up)
        before = {n: p.detach().clone() for n, p in self.model[0].named_parameters()}
        mains = main_params(self)
        mains_before = [t.detach().clone() for t in mains]
        restored: dict[str, bool] = {}
        mains_kept: dict[str, bool] = {}
        held: dict[str, dict[str, Any]] = {}
        original_switch = self._switch_model
        original_log_prob = self.compute_log_prob
        pending: list[str] = []

        def check(tag: str) -> None:
            # before the optimizer step, with each teacher in and after the student is back:
            # the optimizer's float32 main parameters as they were (in float32 training they
            # are views of the model's own buffers, so only the student's turns are checked)
            if tag == "actor" or self.args.bf16:
                mains_kept[f"{len(mains_kept)}:{tag}"] = all(
                    torch.equal(a, b) for a, b in zip(mains, mains_before, strict=True)
                )
            if tag != "actor":  # the teacher's weights as they leave through slime's saver
                held[tag] = _held_weights(self, work / f"held_{scenario.get('name')}" / tag)
            if tag == "actor":  # back from a teacher: the student bit for bit
                restored[str(len(restored))] = all(
                    torch.equal(p, before[n]) for n, p in self.model[0].named_parameters()
                )

        def checked() -> None:
            # each switch checked once the pass after it has run: a streamed restore
            # (--mopd-restore streamed) lands layer by layer under that pass
            self._mopd_settle()
            while pending:
                check(pending.pop(0))

        def switch(tag: str) -> None:
            checked()
            original_switch(tag)
            pending.append(tag)

        def log_prob(*args: Any, **kwargs: Any) -> Any:
            out = original_log_prob(*args, **kwargs)
            checked()
            return out

        self._switch_model = switch
        self.compute_log_prob = log_prob
        out = original_train_actor(self, rollout_id, rollout_data, external_data)
        seen["teacher_log_probs"] = [t.float().tolist() for t in rollout_data["teacher_log_probs"]]
        seen["log_probs"] = [t.float().tolist() for t in rollout_data.get("log_probs", [])]
        tokens = [t.tolist() for t in rollout_data["tokens"]]
        seen["keyed"] = {
            key: _keyed(tokens, seen[key]) for key in ("teacher_log_probs", "log_probs")
        }
        seen["student_restored_bitwise"] = restored
        seen["teacher_weights"] = held
        seen["main_params"] = {
            "count": len(mains),
            "dtypes": sorted({str(t.dtype) for t in mains}),
            "untouched_by_teachers": mains_kept,
            "stepped": any(not torch.equal(a, b) for a, b in zip(mains, mains_before, strict=True)),
        }
        seen["changed_params"] = sum(
            not torch.equal(p, before[n]) for n, p in self.model[0].named_parameters()
        )
        return out

    type(actor).train_actor = spy  # type: ignore[method-assign]
    started = time.perf_counter()
    actor.train(0, refs)
    torch.cuda.synchronize()
    report["train"] = {
        "seconds": round(time.perf_counter() - started, 1),
        "asleep_after": bool(args.offload_train),
        "gpu_gb_after": round(torch.cuda.memory_allocated() / 1e9, 3),
        "logged": logged,
        **seen,
    }
    return report


def _keyed(tokens: list[Any], values: list[Any]) -> dict[str, list[float]]:
    """Per-sample values keyed by the sample's tokens, so that two passes that order the batch
    differently can be compared sample by sample."""
    return {
        ",".join(str(int(t)) for t in tok): [float(v) for v in val]
        for tok, val in zip(tokens, values, strict=True)
    }


def bf16_rounded(hf_dir: Path, out: Path) -> Path:
    """A copy of a Hugging Face folder whose float weights are rounded to bf16 and kept in their
    dtype: what a float32 model loading the bf16 ``torch_dist`` checkpoint holds."""
    import shutil

    from safetensors.torch import load_file, save_file

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(hf_dir, out)
    for f in out.glob("*.safetensors"):
        tensors = load_file(str(f))
        rounded = {
            k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v
            for k, v in tensors.items()
        }
        save_file(rounded, str(f), metadata={"format": "pt"})
    return out


def embedded(work: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    """The embedded trainer's first step on what the ``train`` phase gives slime's actor: the
    same slime arguments, the same batch (the converter's train data from the same samples) and
    the same weights (the Hugging Face folders the torch_dist checkpoints were converted from).
    Reports the teacher log-probs, the student's old log-probs (per sample, keyed by tokens),
    the MOPD loss and the gradient norm, for issue 27's part 2 (test_megatron_gpu.py)."""
    _stand_ins()
    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from dressage.training.embedded.trainer import EmbeddedTrainer
    from dressage.training.mopd_train import parse_mopd_args

    args = parse_mopd_args(_train_argv(work, scenario))
    if scenario.get("data") == "recorded":
        samples = torch.load(work / RECORDED, weights_only=False)
    else:
        samples = _samples(args, int(args.vocab_size))
    data = convert_samples_to_train_data(args, samples)
    ckpts = _checkpoints()
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if scenario.get("fp32"):
        # slime's actor in float32 holds the bf16 torch_dist weights widened: the same here
        args.bf16 = False
        ckpts = {name: bf16_rounded(path, work / "hf_bf16" / name) for name, path in ckpts.items()}
    # slime trains in bf16 (it sets --bf16 itself): the same bf16 weights here, bf16 autocast
    trainer = EmbeddedTrainer(
        args,
        model_path=ckpts["student"],
        teachers={tid: path for tid, path in ckpts.items() if tid != "student"},
        dtype=torch.bfloat16 if args.bf16 else torch.float32,
    )
    seen: dict[str, Any] = {}
    original = trainer._log_probs

    def log_probs(rollout_data: dict[str, Any]) -> None:
        original(rollout_data)
        tokens = [t.tolist() for t in rollout_data["tokens"]]
        for key in ("teacher_log_probs", "log_probs"):
            seen[key] = _keyed(tokens, [v.float().tolist() for v in rollout_data[key]])

    trainer._log_probs = log_probs  # type: ignore[method-assign]
    metrics = trainer.train(0, data)
    return {
        "device": args.device,
        "bf16": bool(args.bf16),
        **seen,
        "mopd_loss": metrics.get("train/mopd_loss"),
        "grad_norm": metrics.get("train/grad_norm"),
    }


def main() -> int:
    if sys.argv[1] == "embedded":
        work = Path(sys.argv[2])
        scenario = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
        report = embedded(work, scenario)
        (work / f"embedded_{scenario.get('name', 'train')}.json").write_text(json.dumps(report))
        print(json.dumps({k: v for k, v in report.items() if not isinstance(v, dict)}))
        return 0
    if sys.argv[1] == "record":
        work = Path(sys.argv[2])
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(record(work)))
        return 0
    if sys.argv[1] == "torch-dist":
        _stand_ins()
        from dressage.slime import torch_dist

        return torch_dist.main(sys.argv[2:])
    mode, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    if mode == "train":
        scenario = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
        try:
            report = train(work, scenario)
        except Exception:
            report = {"error": traceback.format_exc()[-6000:]}
        name = scenario.get("name", "train")
        (work / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
        print(report["error"][-3000:] if "error" in report else json.dumps(report)[:4000])
        return 0 if "error" not in report else 1
    report: dict[str, Any] = {"convert": convert(work)}
    print(json.dumps(report["convert"], default=str)[:3000], flush=True)
    try:
        report["recorded"] = recorded_samples(work)
    except (FileNotFoundError, ImportError) as exc:
        report["recorded"] = {"error": str(exc)}
    jobs: dict[str, Job] = {}
    rig = [sys.executable, "-m", "tests.real_slime.gpu_rig"]
    for scenario in SCENARIOS:
        env = _offload_env() if "--colocate" in scenario.get("extra", []) else {}
        name = scenario["name"]
        if scenario.get("data") == "recorded" and "error" in report["recorded"]:
            report[name] = {"error": report["recorded"]["error"]}
            (work / f"{name}.json").write_text(json.dumps(report[name]))
            continue
        argv = [*rig, "train", str(work), json.dumps(scenario)]
        jobs[name] = (argv, work / f"{name}.log", 600, env)
        if name in COMPARED:
            argv = [*rig, "embedded", str(work), json.dumps(scenario)]
            jobs[f"embedded_{name}"] = (argv, work / f"embedded_{name}.log", 600, {})
    for objective in LEARNED:
        argv = [sys.executable, "-m", "tests.real_slime.gpu_learn", str(work), objective]
        jobs[f"learn_{objective}"] = (argv, work / f"learn_{objective}.log", 1200, {})
    report.update(_run_all(jobs))
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, default=str)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
