"""MOPD learns through slime's Megatron actor on the GPU (issue 27 part 3).

    python -m tests.real_slime.gpu_learn WORK_DIR OBJECTIVE     # after gpu_rig's convert phase
    python -m tests.real_slime.gpu_learn plot OUT.png WORK_DIR/learn_*.json

Trains the embedded config's student (``WORK/torch_dist``, made by gpu_rig's ``convert``) for
:data:`STEPS` MOPD steps through slime's real ``MegatronTrainRayActor`` with the project's MOPD
actor (started as gpu_rig's ``train`` phase starts it, same stand-ins), on-policy:

1. the actor's current weights leave Megatron through slime's own Hugging Face saver
   (``save_hf_model_to_path``, the code behind ``--save-hf``);
2. that student samples a first assistant turn for :data:`PROMPTS` training rows of each task
   (``configs/mopd/data``), on the prompt the tool agent sends through the proxy (the task's
   system prompt, question and tool schemas, rendered by the proxy's own chat-format code).
   Hugging Face ``generate`` samples in SGLang's place (SGLang does not run here), at
   temperature 1;
3. each turn becomes a segment, then a slime sample (``expand_segments_to_samples``), then train
   data (``convert_samples_to_train_data``), and the actor trains on it: each teacher restored
   from slime's ``TensorBackuper`` to score its samples, the student restored, Megatron's
   distributed optimizer steps.

Every :data:`EVAL_EVERY` steps and after the last, the held-out measure of the embedded runs
(:func:`dressage.training.embedded.probe.exact_reverse_kl`: ``KL(student || teacher)`` over the
whole vocabulary at every response token) is taken on fixed contexts: the initial student's
first turns on every held-out row (``eval_path``), scored by the exported student and the
teachers' Hugging Face checkpoints. Writes ``WORK/learn_OBJECTIVE.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tests.real_slime import gpu_rig

STEPS = 30
PROMPTS = 8
"""Training rows per task and step (one sample each)."""
LR = 5e-4
"""Adam's learning rate: the rate at which the embedded MOPD job lowered the held-out KL over 60
steps on the GPU (bench/results/mopd_job_60steps_lr5e-4_cuda.log)."""
EVAL_EVERY = 5
MAX_NEW_TOKENS = 48
DATA = gpu_rig.EMBEDDED.parent


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def prompt_ids(tito: Any, row: dict[str, Any]) -> list[int]:
    """The token ids of the tool agent's first request for ``row``, as the proxy encodes it."""
    from dressage.agents.base import AgentTask
    from dressage.agents.tools import environment_for

    meta = row.get("metadata") or {}
    task = AgentTask(prompt=row["input"], task=meta.get("task"), metadata=meta)
    env = environment_for(task.task, task.prompt_text, task.metadata)
    turn = tito.start(
        task.initial_messages(),
        tools=env.specs,
        chat_template_kwargs=dict(task.chat_template_kwargs),
    )
    return list(turn.delta_ids)


def sample_turns(
    model: Any, prompts: list[list[int]], stop_ids: list[int], pad_id: int
) -> list[tuple[list[int], list[float], str]]:
    """One sampled turn per prompt (temperature 1, no truncation of the distribution): its ids
    up to and including the first stop token, their log-probs, and the finish reason."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=MAX_NEW_TOKENS,
            eos_token_id=stop_ids,
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    turns = []
    for row, lps in zip(out.sequences[:, width:].tolist(), scores.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row) if t in stop_ids), None)
        cut = end if end is not None else len(row)
        turns.append((row[:cut], [float(x) for x in lps[:cut]], "stop" if end else "length"))
    return turns


def make_samples(
    args: Any,
    tokenizer: Any,
    batch: list[dict[str, Any]],
    prompts: list[list[int]],
    turns: list[tuple[list[int], list[float], str]],
    step: int,
) -> list[Any]:
    """Each sampled turn as a one-segment trajectory, expanded into slime samples."""
    from dressage.rollout.multi_segment import expand_segments_to_samples
    from dressage.trajectory import NO_VERSION, Segment
    from dressage.types import Sample

    out: list[Any] = []
    for i, (row, prompt, (ids, lps, finish)) in enumerate(zip(batch, prompts, turns, strict=True)):
        task = (row.get("metadata") or {}).get("task")
        segment = Segment(
            session_id=f"learn-{step}-{i}",
            segment_index=0,
            tokens=prompt + ids,
            full_loss_mask=[0] * len(prompt) + [1] * len(ids),
            full_logprobs=[0.0] * len(prompt) + lps,
            messages=[{"role": "user", "content": row["input"]}],
            finish_reason=finish,
            full_versions=[NO_VERSION] * len(prompt) + [step] * len(ids),
            prompt_length=len(prompt),
        )
        template = Sample(
            index=step * len(batch) + i,
            group_index=step * len(batch) + i,
            prompt=row["input"],
            label=row.get("label"),
            metadata={"instance_id": row["id"], "task": task, "teacher_id": task},
        )
        text = tokenizer.decode(ids, skip_special_tokens=True)
        samples = expand_segments_to_samples(template, [segment], args=args, agent_response=text)
        samples[-1].reward = 0.0  # MOPD's signal is the teachers'; no reward enters the loss
        out += samples
    return out


def export(args: Any, actor: Any, out: Path) -> Any:
    """The actor's current weights through slime's Hugging Face saver, loaded for sampling."""
    from slime.backends.megatron_utils.hf_checkpoint_saver import save_hf_model_to_path
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(args.hf_checkpoint))
    save_hf_model_to_path(args, out, actor.model, model_name=type(config).__name__.lower())
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    return model.to("cuda").eval()


def learn(work: Path, objective: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dressage.proxy.tito import create_tito_tokenizer
    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from dressage.training.embedded.probe import exact_reverse_kl
    from tests.real_slime.slime_parts import bare_manager

    started = time.perf_counter()
    batch_size = 2 * PROMPTS
    flags = ["--num-rollout", str(STEPS), "--lr", str(LR)]
    flags += ["--rollout-batch-size", str(batch_size), "--global-batch-size", str(batch_size)]
    scenario = {"name": f"learn_{objective}", "objective": objective}
    args, actor, report, logged = gpu_rig.start_actor(work, scenario, flags)
    ckpts = gpu_rig._checkpoints()
    tokenizer = AutoTokenizer.from_pretrained(str(ckpts["student"]))
    tito = create_tito_tokenizer(tokenizer, "qwen3.5")
    stop_ids = sorted(tito.closer_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    teachers = {
        tid: AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).to("cuda").eval()
        for tid, path in ckpts.items()
        if tid != "student"
    }
    config = json.loads(gpu_rig.EMBEDDED.read_text())
    train_rows = {d["name"]: rows(DATA / d["path"]) for d in config["datasets"]}
    eval_rows = [r for d in config["datasets"] for r in rows(DATA / d["eval_path"])]
    torch.manual_seed(0)

    live = work / f"hf_live_{objective}"
    student = export(args, actor, live)
    eval_prompts = [prompt_ids(tito, r) for r in eval_rows]
    eval_turns = sample_turns(student, eval_prompts, stop_ids, pad_id)
    held_out = make_samples(args, tokenizer, eval_rows, eval_prompts, eval_turns, 0)
    curve: list[dict[str, float]] = []
    steps: list[dict[str, float]] = []
    for step in range(STEPS + 1):
        if step % EVAL_EVERY == 0 or step == STEPS:
            kl = exact_reverse_kl(student, teachers, held_out)
            curve.append({"step": step, **kl})
            print(f"step {step}: held-out reverse KL {json.dumps(kl)}", flush=True)
        if step == STEPS:
            break
        batch = [r for name in sorted(train_rows) for r in _window(train_rows[name], step)]
        prompts = [prompt_ids(tito, r) for r in batch]
        turns = sample_turns(student, prompts, stop_ids, pad_id)
        samples = make_samples(args, tokenizer, batch, prompts, turns, step)
        data = convert_samples_to_train_data(args, samples)
        before = len(logged)
        actor.train(step, bare_manager(args)._split_train_data_by_dp(data))
        metrics = next((m for m in logged[before:] if "train/mopd_loss" in m), {})
        steps.append(
            {
                "step": step,
                "response_tokens": sum(len(t[0]) for t in turns),
                **{k: metrics[k] for k in sorted(metrics) if k.startswith("train/")},
            }
        )
        student = export(args, actor, live)  # the weights the next step samples with
    report.update(
        objective=objective,
        steps=STEPS,
        lr=LR,
        prompts_per_task=PROMPTS,
        max_new_tokens=MAX_NEW_TOKENS,
        held_out_rows=len(eval_rows),
        held_out_tokens=sum(len(t[0]) for t in eval_turns),
        heldout=curve,
        train=steps,
        seconds=round(time.perf_counter() - started, 1),
    )
    return report


def _window(data: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Step ``step``'s rows of one task: the next :data:`PROMPTS`, wrapping around."""
    start = (step * PROMPTS) % len(data)
    return [data[(start + i) % len(data)] for i in range(PROMPTS)]


def plot(reports: list[dict[str, Any]], out: Path) -> None:
    """The held-out reverse KL per teacher against the step, one panel per objective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(reports), figsize=(5 * len(reports), 3.6), sharey=True)
    for ax, report in zip([axes] if len(reports) == 1 else axes, reports, strict=True):
        steps = [h["step"] for h in report["heldout"]]
        for key in sorted(k for k in report["heldout"][0] if k != "step"):
            style = "k--" if key == "all" else "-o"
            ax.plot(steps, [h[key] for h in report["heldout"]], style, label=key, markersize=3)
        ax.set_title(f"{report['objective']}: slime's Megatron actor, lr {report['lr']}")
        ax.set_xlabel("MOPD step")
        ax.grid(alpha=0.3)
    first = [axes] if len(reports) == 1 else axes
    first[0].set_ylabel("held-out reverse KL to the teacher (nats/token)")
    first[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    if sys.argv[1] == "plot":  # plot OUT.png REPORT.json...
        plot([json.loads(Path(f).read_text()) for f in sys.argv[3:]], Path(sys.argv[2]))
        return 0
    work, objective = Path(sys.argv[1]), sys.argv[2]
    try:
        report = learn(work, objective)
    except Exception:
        import traceback

        report = {"error": traceback.format_exc()[-6000:]}
    (work / f"learn_{objective}.json").write_text(json.dumps(report, indent=1, default=str))
    print(report["error"][-3000:] if "error" in report else json.dumps(report["heldout"]))
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
