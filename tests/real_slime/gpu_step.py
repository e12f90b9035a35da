"""Timed MOPD steps through slime's ``MegatronTrainRayActor`` on a GPU, at real model sizes.

    python -m tests.real_slime.gpu_step model HF_DIR SHAPE_JSON     # config.json + tokenizer
    python -m tests.real_slime.gpu_step random-torch-dist HF_DIR OUT
    python -m tests.real_slime.gpu_step measure WORK SPEC_JSON      # writes WORK/<name>.json

The benchmarks that cost the MOPD step on slime's path (``bench/mopd_objective_cost.py
--backend slime``, ``bench/teacher_rotation_slime.py``) run these phases, each in a process of
its own (Megatron's state is global). The stand-ins are gpu_rig.py's, for the reasons its
docstring gives; everything of Megatron, slime's actor, its ``TensorBackuper`` and the project's
MOPD actor is the real code.

``model`` writes a Hugging Face folder with a Qwen3 ``config.json`` of the given shape and the
embedded student's tokenizer files (slime's actor loads a tokenizer; nothing here decodes text).
``random-torch-dist`` builds that model with Megatron's own random initialisation and writes it
with Megatron's ``save_checkpoint``, as the student and every teacher of a measurement (random
weights are enough to time a step; each teacher is still loaded and backed up on its own).

``measure`` initialises the actor once (student, then every teacher into pinned host memory,
the pinned bytes read after each load) and runs its cases: each a batch of synthetic samples
(``samples`` of ``prompt`` + ``length`` tokens, spread over the first ``teachers`` teachers)
and its variants, each an objective (and K) and a placement of the teachers:

- ``rotate``: the actor as it runs, each teacher restored from pinned memory for its pass
  (``--mopd-restore streamed``: layer by layer under the pass, and no restore of the student
  that the weights already hold);
- ``rotate-slime``: the same passes, every switch through slime's own ``_switch_model`` (its
  ``TensorBackuper.restore``, whole before the pass, the student restored at the step's start);
- ``resident``: what teachers kept on the GPU would cost. Their weights are copied to the GPU
  (the memory they would hold; a case that does not fit is reported so) and the teacher passes
  run without any restore, on the weights in place (the same layers, the same work).

A case runs one warm-up round and ``repeats`` timed rounds, its variants taking turns in each
round (so that a drift of the machine meets them alike): a step is one ``actor.train`` (CUDA
synchronised); its peak GPU memory allocated is read per step.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from tests.real_slime.gpu_rig import _checkpoints, _stand_ins, write_mopd_config

GB = 1e9


def write_model(hf_dir: Path, shape: dict[str, Any]) -> Path:
    """A Hugging Face folder of a Qwen3 model of ``shape`` (no weights), with the embedded
    student's tokenizer."""
    hf_dir.mkdir(parents=True, exist_ok=True)
    heads = int(shape["num_attention_heads"])
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "num_key_value_heads": heads,
        "head_dim": 128,
        **shape,
    }
    (hf_dir / "config.json").write_text(json.dumps(config, indent=1))
    student = _checkpoints()["student"]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (student / name).exists():
            shutil.copy(student / name, hf_dir / name)
    return hf_dir


def random_torch_dist(hf_dir: Path, out: Path) -> Path:
    """``hf_dir``'s architecture with Megatron's random initialisation, saved as torch_dist."""
    _stand_ins()
    from slime.backends.megatron_utils.checkpoint import save_checkpoint
    from slime.backends.megatron_utils.initialize import init
    from slime.backends.megatron_utils.model import setup_model_and_optimizer
    from slime.utils.arguments import parse_args

    from dressage.slime.torch_dist import (
        _single_process_world,
        conversion_argv,
        megatron_iteration_dir,
    )

    _single_process_world()
    sys.argv = [sys.argv[0], *conversion_argv(hf_dir, hf_dir)]  # nothing is loaded
    args = parse_args()
    args.rank, args.world_size = 0, 1
    init(args)
    model, _, _ = setup_model_and_optimizer(args)
    args.save, args.no_save_optim, args.no_save_rng = str(out), True, True
    save_checkpoint(0, model, None, None, 0)
    megatron_iteration_dir(out)
    return out


def _argv(work: Path, spec: dict[str, Any]) -> list[str]:
    from dressage.slime.model_flags import megatron_model_flags
    from dressage.slime.torch_dist import _RUN_FLAGS

    write_mopd_config(work, {f"t{i}": spec["teacher_load"] for i in range(int(spec["teachers"]))})
    batch = str(int(spec["samples"]))
    run = list(_RUN_FLAGS)
    for flag, value in (
        ("--num-rollout", "1000"),
        ("--rollout-batch-size", batch),
        ("--global-batch-size", batch),
        ("--seq-length", str(int(spec["prompt"]) + max(spec["lengths"]))),
    ):
        run[run.index(flag) + 1] = value
    argv = [*megatron_model_flags(spec["hf"]), *run, "--hf-checkpoint", spec["hf"]]
    argv += ["--ref-load", spec["student_load"], "--load", str(work / "save")]
    argv += ["--save", str(work / "save"), "--save-interval", "100000"]
    argv += ["--mopd-config", str(work / "mopd.json"), "--n-samples-per-prompt", "1"]
    argv += ["--mopd-metrics-dir", str(work / "metrics")]
    argv += ["--optimizer", spec.get("optimizer", "adam"), "--lr", "1e-6"]
    argv += ["--lr-decay-style", "constant", "--weight-decay", "0.0"]
    argv += ["--attention-softmax-in-fp32", "--mopd-objective", spec.get("objective", "sampled")]
    if spec.get("topk"):
        argv += ["--mopd-topk", str(int(spec["topk"]))]
    return argv + list(spec.get("extra", []))


def _samples(args: Any, n: int, teachers: int, prompt: int, length: int, vocab: int) -> list[Any]:
    """``n`` one-segment trajectories of ``prompt`` + ``length`` tokens; sample ``i`` is
    teacher ``t{i % teachers}``'s."""
    from dressage.rollout.multi_segment import expand_segments_to_samples
    from tests.rollout.factories import segment, template

    out: list[Any] = []
    for i in range(n):
        tmpl = template(i, i, teacher_id=f"t{i % teachers}")
        seg = segment(f"sess-{i}", 0, prompt=prompt, runs=((1, length),), seed=i)
        seg.tokens = [(t * 7919 + i) % vocab for t in seg.tokens]
        samples = expand_segments_to_samples(tmpl, [seg], args=args, agent_response="x")
        samples[-1].reward = float(i % 2)
        out += samples
    return out


def _pinned_bytes() -> int | None:
    stats = getattr(torch.cuda.memory, "host_memory_stats", None)
    if stats is None:
        return None
    return int(stats().get("allocated_bytes.all.current", 0) or 0)


def _resident_copies(actor: Any, tags: list[str]) -> tuple[list[Any], str | None]:
    """The teachers' weights on the GPU, as resident teachers would hold them (none, and the
    reason, when they do not fit)."""
    held: list[Any] = []
    try:
        for tag in tags:
            held.append({k: v.to("cuda") for k, v in actor.weights_backuper.get(tag).items()})
    except torch.OutOfMemoryError as exc:
        held.clear()
        torch.cuda.empty_cache()
        return held, f"{len(tags)} resident teachers do not fit: {str(exc).splitlines()[0]}"
    return held, None


def _step(
    actor: Any,
    args: Any,
    data: dict[str, Any],
    variant: dict[str, Any],
    spec: dict[str, Any],
    tags: list[str],
    rollout_id: int,
) -> dict[str, Any]:
    """One timed ``actor.train`` of ``data`` under ``variant`` (objective, K, placement)."""
    import copy

    from slime.observability.timer import Timer

    from tests.real_slime.slime_parts import bare_manager

    args.mopd_objective = variant.get("objective", spec.get("objective", "sampled"))
    args.mopd_topk = variant.get("topk", spec.get("topk"))
    held: list[Any] = []
    out: dict[str, Any] = {}
    if variant.get("mode", "rotate") == "resident":
        held, why = _resident_copies(actor, tags[: int(variant["teachers"])])
        if why:  # timed all the same: the passes' work does not depend on where the weights live
            out["note"] = why

        def switch(tag: str, _actor: Any = actor) -> None:
            _actor._active_model_tag = tag  # the weights in place serve every pass

        actor._switch_model = switch
    elif variant.get("mode") == "rotate-slime":
        from slime.backends.megatron_utils.actor import MegatronTrainRayActor

        def slime_switch(tag: str, _actor: Any = actor) -> None:
            MegatronTrainRayActor._switch_model(_actor, tag)

        actor._switch_model = slime_switch
    try:
        refs = bare_manager(args)._split_train_data_by_dp(copy.deepcopy(data))
        Timer().reset()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        actor.train(rollout_id, refs)
        torch.cuda.synchronize()
        out.update(
            seconds=time.perf_counter() - t0,
            peak=torch.cuda.max_memory_allocated(),
            start=start,
            held=sum(t.nbytes for h in held for t in h.values()),
        )
    finally:
        actor.__dict__.pop("_switch_model", None)
        held.clear()
    return out


def _backup_bytes(backuper: Any) -> int:
    """The bytes of every backup held in pinned host memory."""
    return sum(
        t.nbytes
        for tag in backuper.backup_tags
        for t in backuper.get(tag).values()
        if t.is_pinned()
    )


def measure(work: Path, spec: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {"stood_in": _stand_ins(), "spec": spec}
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    from tests.helpers import free_port

    os.environ["MASTER_PORT"] = str(free_port())
    import slime.ray.rollout as rollout_mod
    import slime.utils.data as data_mod

    import dressage.training.mopd_actor as mopd_actor
    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from dressage.training.mopd_train import parse_mopd_args

    data_mod.ray = type("R", (), {"get": staticmethod(lambda v: v)})  # type: ignore[assignment]
    rollout_mod.ray = type("R", (), {"put": staticmethod(lambda v, **_: v)})  # type: ignore[assignment]
    args = parse_mopd_args(_argv(work, spec))
    pinned_after: list[int | None] = [_pinned_bytes()]
    backups_after: list[int] = []
    cls = mopd_actor.make_mopd_actor_cls()
    original_load = cls.load_other_checkpoint

    def load_other_checkpoint(self: Any, tag: str, path: str) -> Any:
        out = original_load(self, tag, path)
        torch.cuda.synchronize()
        pinned_after.append(_pinned_bytes())
        backups_after.append(_backup_bytes(self.weights_backuper))
        return out

    cls.load_other_checkpoint = load_other_checkpoint  # type: ignore[method-assign]
    actor = cls.__new__(cls)
    actor._rank, actor._world_size = 0, 1
    started = time.perf_counter()
    actor.init(args, "actor")
    backuper = actor.weights_backuper
    tags = sorted(t for t in backuper.backup_tags if t.startswith("teacher:"))
    model_bytes = sum(t.numel() * t.element_size() for t in backuper.get("actor").values())
    report["init"] = {
        "seconds": round(time.perf_counter() - started, 1),
        "parameters": sum(p.numel() for p in actor.model[0].parameters()),
        "model_bytes": model_bytes,
        "backup_bytes": {tag: sum(t.nbytes for t in backuper.get(tag).values()) for tag in tags},
        "pinned": all(t.is_pinned() for tag in tags for t in backuper.get(tag).values()),
        "host_pinned_bytes_after_each_load": pinned_after,
        "backup_pinned_bytes_after_each_load": backups_after,
        "gpu_bytes_after_init": torch.cuda.memory_allocated(),
        "padded_vocab_size": int(args.padded_vocab_size),
    }
    vocab = int(args.vocab_size)
    rollout_id = 0
    cases: list[dict[str, Any]] = []
    for case in spec["cases"]:
        variants = case.get("variants") or [{}]
        rows = [{**{k: v for k, v in case.items() if k != "variants"}, **v} for v in variants]
        samples = _samples(
            args,
            int(case.get("samples", spec["samples"])),
            int(case["teachers"]),
            int(spec["prompt"]),
            int(case["length"]),
            vocab,
        )
        data = convert_samples_to_train_data(args, samples)
        runs: list[dict[str, list[Any]]] = [
            {"seconds": [], "peak": [], "start": [], "held": []} for _ in rows
        ]
        for r in range(1 + int(spec.get("repeats", 3))):  # the variants take turns each round
            for row, run in zip(rows, runs, strict=True):
                if "refused" in row:
                    continue
                try:
                    measured = _step(actor, args, data, row, spec, tags, rollout_id)
                except torch.OutOfMemoryError as exc:
                    row["refused"] = f"CUDA out of memory: {str(exc).splitlines()[0]}"
                    continue
                finally:
                    rollout_id += 1
                    torch.cuda.empty_cache()
                if r:  # the first round warms up
                    for key, value in measured.items():
                        if key == "note":
                            row["resident_fits"], row["resident_note"] = False, value
                        else:
                            run[key].append(value)
        for row, run in zip(rows, runs, strict=True):
            if run["seconds"]:
                row.update(
                    seconds=statistics.median(run["seconds"]),
                    all_seconds=[round(t, 4) for t in run["seconds"]],
                    peak_bytes=max(run["peak"]),
                    start_bytes=max(run["start"]),
                    resident_teacher_bytes=max(run["held"]),
                )
                row.setdefault("resident_fits", row.get("mode") == "resident" or None)
            print(json.dumps(row), flush=True)
            cases.append(row)
    report["cases"] = cases
    return report


def main() -> int:
    mode = sys.argv[1]
    if mode == "model":
        print(write_model(Path(sys.argv[2]), json.loads(sys.argv[3])))
        return 0
    if mode == "random-torch-dist":
        print(random_torch_dist(Path(sys.argv[2]), Path(sys.argv[3])))
        return 0
    work = Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    spec = json.loads(sys.argv[3])
    try:
        report = measure(work, spec)
    except Exception:
        report = {"error": traceback.format_exc()[-6000:]}
    (work / f"{spec.get('name', 'measure')}.json").write_text(json.dumps(report, indent=1))
    print(report["error"][-3000:] if "error" in report else "measured", flush=True)
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())


def phase(*argv: str, log: Path, timeout: float = 1800) -> None:
    """Run one phase of this module in a process of its own (slime and Megatron-LM put on
    ``PYTHONPATH`` from ``SLIME_ROOT`` and ``MEGATRON_LM_ROOT``), its output in ``log``.

    Raises:
        RuntimeError: the phase failed; the message carries the log's last lines.
    """
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    paths = (str(repo), env.get("SLIME_ROOT"), env.get("MEGATRON_LM_ROOT"), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.real_slime.gpu_step", *argv],
            cwd=repo, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
        )  # fmt: skip
    if proc.returncode:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"gpu_step {argv[0]} failed ({proc.returncode}):\n{tail}")


def prepare(work: Path, shape: dict[str, Any]) -> tuple[Path, Path]:
    """The Hugging Face folder and a random torch_dist checkpoint of ``shape``, under ``work``."""
    hf = write_model(work / "hf", shape)
    out = work / "torch_dist"
    phase("random-torch-dist", str(hf), str(out), log=work / "random_torch_dist.log")
    return hf, out


def missing() -> str | None:
    """Why these phases cannot run here (None when they can)."""
    if not torch.cuda.is_available():
        return "no CUDA device: slime's Megatron actor runs on a GPU"
    for name in ("SLIME_ROOT", "MEGATRON_LM_ROOT"):
        if not os.environ.get(name):
            return (
                f"{name} is not set: slime's actor path needs slime and Megatron-LM's training code"
            )
    return None
