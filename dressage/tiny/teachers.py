"""Tiny task teachers: a tiny model fine-tuned by plain next-token training on its task.

    from dressage.tiny.teachers import TinyTeacherSpec, tiny_teacher_dir
    path = tiny_teacher_dir(TinyTeacherSpec(task="calculator"))    # built once, then cached

    python -m dressage.tiny.teachers calculator lookup          # build, print the evidence

The MOPD config names one as ``tiny-sft:task=calculator[,base=generalist,steps=48,...]``
(resolved by :func:`dressage.tiny.checkpoints.resolve_checkpoint`). Keys: ``task``; the base:
``base=generalist`` (the shipped pre-trained base, :mod:`dressage.tiny.generalist`: what the
embedded default uses), another named base (``base=generalist-large``, pre-trained on first use:
:data:`~dressage.tiny.generalist.BASES`) or the fields of a seeded random
:class:`~dressage.tiny.TinyModelSpec`
(``seed``, ``vocab``, ``hidden_size``, ...); the recipe's ``steps``, ``lr``, ``warmup``,
``batch_size``, ``examples``, ``data_seed``. ``task=calculator+lookup`` fine-tunes on both
(the embedded default's student).

Recipe. ``examples`` instances of the task (:mod:`dressage.agents.tasks`) become the transcript
the built-in tool agent would leave at the proxy if it solved them perfectly: its system prompt,
the task, the task's tools, thinking off; the assistant calls the tool, the tool answers, the
assistant replies with the label. The token ids and the loss mask are built by the proxy's own
TITO tokenizer, so the teacher is trained on exactly the contexts the proxy will score (the mask
covers the assistant's tokens only). Then ``steps`` AdamW steps of mean next-token NLL over
masked tokens, ``batch_size`` transcripts each (the prompt prefix they share computed once:
:mod:`dressage.shared_prefix`), the learning rate warmed up over ``warmup`` steps then
cosine-decayed, seeded, on :func:`~dressage.tiny.model.build_device` (a GPU when there is
one): the same recipe gives the same weights on the same machine.
Teachers and student specialise the same base: that is what MOPD can reach on-policy (a teacher
from another init shares no embedding geometry with the student, and the student's samples say
little about it).

The folder holds the model, the tokenizer and ``sft_report.json``: the loss of every step, the
mean log-prob of the answer tokens on held-out instances for the base and the teacher, and
``agent_accuracy``: the share of held-out instances of every task the teacher solves through the
real agent loop (the embedded engine serving it, the recording proxy, the tool agent, the task's
tools and exact-match reward, greedy; :data:`AGENT_EVAL`). ``dressage_validate`` compares the
accuracy on a teacher's own task with a floor.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dressage.assets._cache import cached_build, cached_path
from dressage.tiny.model import (
    TinyModelSpec,
    build_device,
    generalist_spec,
    model_key,
    tiny_model_dir,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dressage.agents.tasks import TaskInstance
    from dressage.agents.tools import ToolEnvironment
    from dressage.proxy.tito import TITOTokenizer

__all__ = [
    "SPEC_PREFIX",
    "Transcript",
    "TinyTeacherSpec",
    "answer_log_prob",
    "cached_teacher_dir",
    "parse_teacher_spec",
    "teacher_transcripts",
    "tiny_teacher_dir",
]

SPEC_PREFIX = "tiny-sft:"
_RECIPE_VERSION = 3
_TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "chat_template", "added_tokens")
HELDOUT_SEED = 10_000
"""``data_seed`` offset of the held-out instances in the report (never trained on)."""
AGENT_EVAL: dict[str, Any] = {
    "items_per_task": 16,
    "max_turns": 2,
    "max_tokens": 64,
    "decoding": "greedy",
}
"""How ``sft_report.json``'s ``agent_accuracy`` is measured (:mod:`dressage.agents.evaluate`)."""


@dataclass(frozen=True)
class TinyTeacherSpec:
    """A teacher recipe: the base tiny model and the fine-tuning settings."""

    task: str
    base: TinyModelSpec = field(default_factory=TinyModelSpec)
    steps: int = 32
    lr: float = 6e-3
    batch_size: int = 4
    examples: int = 64
    data_seed: int = 0
    train_embeddings: bool = True
    warmup: int = 10

    def __post_init__(self) -> None:
        from dressage.agents.tasks import TASKS

        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise ValueError(
                f"task {self.task!r}: tasks must be one or more of {TASKS}, '+'-joined"
            )
        if min(self.steps, self.batch_size, self.examples) < 1 or not self.lr > 0:
            raise ValueError(f"teacher recipe needs positive steps/batch/examples/lr: {self}")

    @property
    def tasks(self) -> tuple[str, ...]:
        """``calculator+lookup`` -> both: a mixture, instances interleaved task by task."""
        return tuple(t for t in self.task.split("+") if t)


def parse_teacher_spec(text: str) -> TinyTeacherSpec:
    """``tiny-sft:task=lookup,seed=0,steps=24`` -> :class:`TinyTeacherSpec`."""
    if not text.startswith(SPEC_PREFIX):
        raise ValueError(f"{text!r} does not start with {SPEC_PREFIX!r}")
    base_types: dict[str, Callable[[str], Any]] = {
        f.name: type(f.default) for f in fields(TinyModelSpec)
    }
    own_types: dict[str, Callable[[str], Any]] = {
        "task": str,
        "steps": int,
        "lr": float,
        "batch_size": int,
        "examples": int,
        "data_seed": int,
        "train_embeddings": _flag,
        "warmup": int,
    }
    base: dict[str, Any] = {}
    own: dict[str, Any] = {}
    pretrained = ""
    for item in filter(None, text[len(SPEC_PREFIX) :].split(",")):
        key, sep, raw = item.partition("=")
        if key == "base":
            from dressage.tiny.generalist import BASES

            if raw not in BASES:
                raise ValueError(f"{text!r}: base={raw!r}; the named bases are {sorted(BASES)}")
            pretrained = raw
            continue
        kind = own_types.get(key) or base_types.get(key)
        if not sep or kind is None:
            known = ["base", *sorted(own_types), *sorted(base_types)]
            raise ValueError(f"{text!r}: {item!r} is not key=value with key in {known}")
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{text!r}: {key}={raw!r} is not a valid value") from None
        (own if key in own_types else base)[key] = value
    if "task" not in own:
        raise ValueError(f"{text!r}: a teacher needs task=... (one of calculator, lookup)")
    if pretrained and base:
        raise ValueError(
            f"{text!r}: base={pretrained} fixes the model; drop {sorted(base)} from the spec"
        )
    model = generalist_spec(pretrained) if pretrained else TinyModelSpec(**base)
    return TinyTeacherSpec(base=model, **own)


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"{text!r} is not a boolean")


# -- transcripts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Transcript:
    """Token ids of one ideal agent run and the mask of the assistant's tokens."""

    ids: list[int]
    loss_mask: list[int]


def _assistant_output(
    tito: TITOTokenizer, messages: list[dict[str, Any]], reply: dict[str, Any], options: Any
) -> list[int]:
    """Ids of ``reply`` as the model writes it: the rendered turn after the generation prompt,
    through the turn closer (the template's newline after it belongs to the next prompt)."""
    prompt = tito.render_conversation(messages, **options)
    whole = tito.render_conversation([*messages, reply], add_generation_prompt=False, **options)
    if not whole.startswith(prompt):
        raise RuntimeError("the chat template does not extend the generation prompt")
    text = whole[len(prompt) :]
    closer = text.rfind("<|im_end|>")
    return tito.encode(text[: closer + len("<|im_end|>")])


def tool_transcript(
    tito: TITOTokenizer,
    prompt: str,
    env: ToolEnvironment,
    tool: str,
    arguments: dict[str, Any],
    label: str,
) -> Transcript:
    """The transcript the proxy records when the built-in agent solves ``prompt`` perfectly: its
    system prompt, the prompt, ``env``'s tools, thinking off; one call of ``tool`` with
    ``arguments``, the tool's answer (which must be ``label``), then ``label`` as the reply."""
    from dressage.agents.base import AgentTask

    task = AgentTask(prompt=prompt)
    options: dict[str, Any] = {
        "tools": env.specs,
        "chat_template_kwargs": dict(task.chat_template_kwargs),
    }
    messages = task.initial_messages()
    state = tito.start(messages, **options).state
    arguments_json = json.dumps(arguments)
    function = {"name": tool, "arguments": arguments_json}
    call: dict[str, Any] = {"id": "call_0", "type": "function", "function": function}
    calling: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "",
        "tool_calls": [call],
    }
    tito.record_output(
        state, _assistant_output(tito, messages, calling, options), assistant_message=calling
    )
    result = env.call(tool, arguments_json)
    if result != label:
        raise RuntimeError(f"{prompt!r}: the tool answers {result!r}, the label is {label!r}")
    messages = [*messages, calling, {"role": "tool", "tool_call_id": "call_0", "content": result}]
    from dressage.proxy.tito.state import SegmentBoundary

    if isinstance(tito.extend(state, messages, **options), SegmentBoundary):
        raise RuntimeError(f"the ideal transcript of {prompt!r} is not append-only")
    answer: dict[str, Any] = {"role": "assistant", "content": label, "reasoning_content": ""}
    tito.record_output(
        state, _assistant_output(tito, messages, answer, options), assistant_message=answer
    )
    return Transcript(list(state.ids), list(state.loss_mask))


def _transcript(tito: TITOTokenizer, instance: TaskInstance) -> Transcript:
    from dressage.agents.tools import environment_for

    env = environment_for(instance.task, instance.prompt)
    return tool_transcript(
        tito, instance.prompt, env, instance.tool, instance.arguments, instance.label
    )


def teacher_transcripts(
    tasks: str | tuple[str, ...], n: int, *, seed: int, tokenizer_dir: str | Path
) -> list[Transcript]:
    """``n`` ideal transcripts through the proxy's TITO tokenizer (Qwen3.5), the tasks taking
    turns (``calculator``, ``lookup``, ``calculator``, ... for both)."""
    from dressage.agents.tasks import make_instances
    from dressage.assets.tokenizers import load_tokenizer
    from dressage.proxy.tito import create_tito_tokenizer

    names = (tasks,) if isinstance(tasks, str) else tasks
    tito = create_tito_tokenizer(load_tokenizer(str(tokenizer_dir)), "qwen3.5")
    per_task = [make_instances(t, -(-n // len(names)), seed=seed) for t in names]
    mixed = [inst for group in zip(*per_task, strict=True) for inst in group][:n]
    return [_transcript(tito, instance) for instance in mixed]


# -- training --------------------------------------------------------------------------------


def _masked_log_probs(
    model: nn.Module, batch: list[Transcript], *, shared_prefix: bool = True
) -> torch.Tensor:
    """Log-probs of every masked token of the batch, ``[N]`` (logits only where needed).

    ``shared_prefix``: the system prompt and tool list that a task's transcripts share run once
    per batch (:func:`dressage.shared_prefix.shared_prefix_hidden`, ~3x faster on CPU, same
    values); False: the plain padded forward."""
    import torch

    from dressage.causal_lm import causal_lm_hidden, output_embedding_module
    from dressage.shared_prefix import shared_prefix_hidden

    tokens = [torch.tensor(t.ids) for t in batch]
    hidden = (shared_prefix_hidden if shared_prefix else causal_lm_hidden)(model, tokens)
    rows, cols, targets = [], [], []
    for i, t in enumerate(batch):
        for p in range(1, len(t.ids)):
            if t.loss_mask[p]:
                rows.append(i)
                cols.append(p - 1)
                targets.append(t.ids[p])
    logits = output_embedding_module(model)(hidden[rows, cols]).float()
    index = torch.tensor(targets, device=logits.device)[:, None]
    return torch.log_softmax(logits, -1).gather(-1, index).squeeze(-1)


def answer_log_prob(model: nn.Module, transcripts: list[Transcript], batch_size: int = 8) -> float:
    """Mean log-prob per assistant token of ``transcripts`` under ``model`` (no gradient)."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(transcripts), batch_size):
            values = _masked_log_probs(model, transcripts[s : s + batch_size])
            total, count = total + float(values.sum()), count + values.numel()
    return total / max(count, 1)


def supervised_train(
    model: nn.Module,
    data: Sequence[Transcript],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup: int,
    seed: int,
    train_embeddings: bool = True,
    every: tuple[int, Callable[[int], None]] | None = None,
) -> list[float]:
    """AdamW on the mean NLL of the masked tokens of ``batch_size`` transcripts a step (epochs of
    a seeded permutation), learning rate warmed up over ``warmup`` steps then cosine-decayed to 0
    at ``steps``, gradient norm clipped at 1; ``every=(n, fn)`` calls ``fn(step)`` every ``n``
    steps. Returns the loss of every step."""
    import torch

    from dressage.causal_lm import input_embedding_module
    from dressage.tiny.generalist import cosine_schedule

    generator = torch.Generator().manual_seed(seed)
    if not train_embeddings:
        input_embedding_module(model).weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_schedule(steps, warmup))
    order: list[int] = []
    losses = []
    model.train()
    for step in range(steps):
        if len(order) < batch_size:  # epochs of a fresh permutation
            order += torch.randperm(len(data), generator=generator).tolist()
        picked, order = order[:batch_size], order[batch_size:]
        loss = -_masked_log_probs(model, [data[i] for i in picked]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if every and (step + 1) % every[0] == 0:
            every[1](step + 1)
    model.eval()
    return losses


def _fine_tune(model: nn.Module, data: list[Transcript], spec: TinyTeacherSpec) -> list[float]:
    return supervised_train(
        model,
        data,
        steps=spec.steps,
        batch_size=spec.batch_size,
        lr=spec.lr,
        warmup=spec.warmup,
        seed=spec.data_seed,
        train_embeddings=spec.train_embeddings,
    )


def _build(spec: TinyTeacherSpec, base_dir: Path, out: Path) -> None:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    data = teacher_transcripts(
        spec.tasks, spec.examples, seed=spec.data_seed, tokenizer_dir=base_dir
    )
    heldout = teacher_transcripts(
        spec.tasks, 16, seed=spec.data_seed + HELDOUT_SEED, tokenizer_dir=base_dir
    )
    device = build_device()
    rng_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec.data_seed)
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        cast("nn.Module", model).to(torch.device(device))
        before = answer_log_prob(model, heldout)
        losses = _fine_tune(model, data, spec)
        after = answer_log_prob(model, heldout)
    finally:
        torch.random.set_rng_state(rng_state)
    cast("nn.Module", model).to(torch.device("cpu"))
    model.save_pretrained(str(out), safe_serialization=True)
    for item in base_dir.iterdir():
        if item.is_file() and item.name.startswith(_TOKENIZER_FILES):
            shutil.copy2(item, out / item.name)
    report = {
        "spec": _spec_dict(spec),
        "losses": losses,
        "heldout_answer_log_prob": {"base": before, "teacher": after},
        "train_tokens_per_transcript": sum(sum(t.loss_mask) for t in data) / len(data),
        "device": device,
        **_agent_accuracy(out, seed=spec.data_seed + HELDOUT_SEED, device=device),
    }
    (out / "sft_report.json").write_text(json.dumps(report, indent=1))


def _agent_accuracy(model_dir: Path, *, seed: int, device: str = "cpu") -> dict[str, Any]:
    """Held-out accuracy on every task through the agent loop (engine, proxy, tools, reward)."""
    from dressage.agents.evaluate import EvalItem, checkpoint_accuracy
    from dressage.agents.tasks import TASKS, make_instances

    items = [
        EvalItem(i.task, i.prompt, i.label)
        for task in TASKS
        for i in make_instances(task, AGENT_EVAL["items_per_task"], seed=seed)
    ]
    measured = checkpoint_accuracy(
        model_dir,
        items,
        max_turns=AGENT_EVAL["max_turns"],
        max_tokens=AGENT_EVAL["max_tokens"],
        device=device,
    )
    if any(measured.errors.values()):
        raise RuntimeError(f"{model_dir}: the agent loop failed: {measured.first_errors}")
    return {"agent_accuracy": measured.accuracy, "agent_eval": {**AGENT_EVAL, "seed": seed}}


def _spec_dict(spec: TinyTeacherSpec) -> dict[str, Any]:
    return asdict(spec)


def _agent_fingerprint() -> str:
    """What the transcripts depend on besides the spec: the agent's prompt and tool specs."""
    from dressage.agents.base import DEFAULT_SYSTEM_PROMPT
    from dressage.agents.tools import CALCULATOR_TOOL, LOOKUP_TOOL

    blob = json.dumps([DEFAULT_SYSTEM_PROMPT, CALCULATOR_TOOL, LOOKUP_TOOL], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _recipe(spec: TinyTeacherSpec) -> dict[str, Any]:
    """What a teacher's cache key is made of (its base model's key names the base); computing it
    builds, trains and writes nothing."""
    return {
        "kind": "tiny-sft-teacher",
        "version": _RECIPE_VERSION,
        "base": model_key(spec.base),
        "agent": _agent_fingerprint(),
        **_spec_dict(spec),
    }


def tiny_teacher_dir(spec: TinyTeacherSpec) -> Path:
    """Folder of the fine-tuned teacher (Hugging Face layout), built (trained) when missing."""
    base_dir = tiny_model_dir(spec.base)
    return cached_build("teachers", _recipe(spec), lambda out: _build(spec, base_dir, out))


def cached_teacher_dir(spec: TinyTeacherSpec) -> Path | None:
    """Folder of the teacher when it is built, else None: builds, trains and writes nothing (not
    its base model or tokenizer either)."""
    return cached_path("teachers", _recipe(spec))


def main(argv: list[str] | None = None) -> int:
    """``python -m dressage.tiny.teachers TASK...``: build and print each report's summary."""
    parser = argparse.ArgumentParser(
        prog="python -m dressage.tiny.teachers",
        description="Build tiny teachers (cached) and print what their sft_report.json measured.",
    )
    parser.add_argument(
        "tasks",
        nargs="*",
        default=["calculator", "lookup"],
        metavar="TASK",
        help="a task name or a full tiny-sft: spec (default: calculator lookup)",
    )
    for task in parser.parse_args(argv).tasks:
        try:
            spec = (
                parse_teacher_spec(task) if task.startswith(SPEC_PREFIX) else TinyTeacherSpec(task)
            )
        except ValueError as exc:
            parser.error(str(exc))
        path = tiny_teacher_dir(spec)
        report = json.loads((path / "sft_report.json").read_text())
        losses, heldout = report["losses"], report["heldout_answer_log_prob"]
        accuracy = ", ".join(f"{t} {a:.0%}" for t, a in report["agent_accuracy"].items())
        print(
            f"{spec.task}: {path}\n  loss {losses[0]:.3f} -> {losses[-1]:.3f} over "
            f"{len(losses)} steps; held-out answer log-prob/token {heldout['base']:.3f} (base) "
            f"-> {heldout['teacher']:.3f} (teacher); agent-loop accuracy {accuracy}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
