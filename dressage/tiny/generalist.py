"""The generalist base: a tiny model pre-trained on auxiliary tool tasks, shipped with the package.

    from dressage.tiny.generalist import generalist_dir
    path = generalist_dir()                   # the shipped weights, with their tokenizer

    python -m dressage.tiny.generalist build --out DIR --device cuda     # how they were made

Why. A tiny model trained from a random init on one task's transcripts learns the task's
template but not the moves the task needs: read the tool's name from the tool list, copy an
argument span from the prompt into the call, copy the tool's answer into the reply. Research for
the embedded default (``bench/results/mopd_recipe/``) found that teachers fine-tuned from a
random init stall (a calculator teacher copies the numbers but writes one fixed operator), while
teachers fine-tuned from a base that already makes those moves on *other* tools learn their task
in a few hundred steps, and that on-policy distillation moves a skill only into a student that
starts from the same base. So, as with any real model family, the project's teachers and
students specialise one pre-trained base.

The base is trained here, by :func:`pretrain`, on four auxiliary tasks that never name the
embedded default's tools or prompts (:data:`AUX_TASKS`): the length of a word, the digits of a
number reversed, a number doubled, and ``echo``, which sends a code of numbers, symbols and short
words to the tool and answers the tool's check number (it teaches copying an arbitrary symbol:
the calculator's operator). Every instance gets a random tool name and parameter name, so the
base learns to read them from the tool list rather than memorise them. The transcripts are the
ones the proxy records for a perfect agent run (:func:`dressage.tiny.teachers.tool_transcript`).
The base solves neither embedded task (0% on both: its ``report.json``).

Pre-training takes about a minute on a GPU and tens of minutes on two CPU cores, more than the
demo's budget, so the weights ship in the package (:data:`SHIPPED`, about 2 MB with the task
vocabulary's tokenizer) the way a model hub ships a base: ``report.json`` beside them records the
recipe and what the base measured when it was built.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dressage.commands import DefaultsHelpFormatter, command_parser

if TYPE_CHECKING:
    from torch import nn

    from dressage.proxy.tito import TITOTokenizer
    from dressage.tiny.model import TinyModelSpec
    from dressage.tiny.teachers import Transcript

__all__ = [
    "AUX_TASKS",
    "GENERALIST",
    "SHIPPED",
    "BASES",
    "SHIPPED_BASES",
    "AuxInstance",
    "PretrainRecipe",
    "aux_instances",
    "aux_transcripts",
    "base_build_key",
    "base_dir",
    "base_recipe",
    "cached_base_dir",
    "generalist_dir",
    "greedy_exact",
    "pretrain",
]

SHIPPED = Path(__file__).parent / "pretrained" / "generalist"
"""The shipped base: model, config, tokenizer and ``report.json``."""
GENERALIST = "generalist"
"""The name a :class:`~dressage.tiny.TinyModelSpec` gives the shipped base (``pretrained=...``)."""
AUX_TASKS = ("length", "reverse", "double", "echo")
_TOOL_NAMES = (
    "helper", "tool", "compute", "worker", "engine", "oracle",
    "service", "agent", "runner", "probe", "finder", "solver",
)  # fmt: skip
_PARAM_NAMES = ("text", "input", "value", "query", "arg", "data")
_WORDS = (
    "apple", "fig", "grape", "kiwi", "lemon", "mango", "melon", "olive", "peach", "pear", "plum",
)  # fmt: skip
_ECHO_SYMBOLS = ("+", "-", "*", "/", "%", "=", "<", ">", "&", "^", "and", "or", "to", "of")
_SUFFIX = "Reply with the number only."
_DESCRIPTIONS = {
    "length": "Return the number of letters of a word.",
    "reverse": "Return the digits of a number in reverse order.",
    "double": "Return twice a number.",
    "echo": "Return the check number of a code.",
}


@dataclass(frozen=True)
class AuxInstance:
    """One auxiliary tool task: its prompt, its (randomly named) tool and the ideal call."""

    task: str
    prompt: str
    tool: str
    param: str
    value: str
    label: str

    @property
    def spec(self) -> dict[str, Any]:
        """The OpenAI tool spec the model is shown."""
        parameters = {
            "type": "object",
            "properties": {self.param: {"type": "string"}},
            "required": [self.param],
        }
        return {
            "type": "function",
            "function": {
                "name": self.tool,
                "description": _DESCRIPTIONS[self.task],
                "parameters": parameters,
            },
        }


def check_number(code: str) -> str:
    """The ``echo`` tool's answer: a position-weighted checksum of the code, mod 997."""
    return str(sum((i + 1) * ord(c) for i, c in enumerate(code)) % 997)


def _aux(task: str, rng: random.Random) -> AuxInstance:
    tool, param = rng.choice(_TOOL_NAMES), rng.choice(_PARAM_NAMES)
    if task == "length":
        word = rng.choice(_WORDS)
        prompt, value, label = f"How many letters are in the word {word}?", word, str(len(word))
    elif task == "reverse":
        number = str(rng.randint(10, 9999))
        prompt, value, label = f"Reverse the digits of {number}.", number, number[::-1]
    elif task == "double":
        n = rng.randint(2, 499)
        prompt, value, label = f"Double the number {n}.", str(n), str(2 * n)
    elif task == "echo":
        items = [str(rng.randint(1, 99)) for _ in range(3)]
        parts = [items[0]]
        for item in items[1 : rng.randint(2, 3)]:
            parts += [rng.choice(_ECHO_SYMBOLS), item]
        value = " ".join(parts)
        prompt, label = f"Send the code {value} to the tool.", check_number(value)
    else:
        raise ValueError(f"unknown auxiliary task {task!r}; expected one of {AUX_TASKS}")
    return AuxInstance(task, f"{prompt} {_SUFFIX}", tool, param, value, label)


def aux_instances(task: str, n: int, *, seed: int) -> list[AuxInstance]:
    """``n`` instances of an auxiliary task, the same for the same seed."""
    rng = random.Random(f"{task}:{seed}")
    return [_aux(task, rng) for _ in range(n)]


def _environment(instance: AuxInstance) -> Any:
    from dressage.agents.tools import ToolEnvironment

    def run(arguments: dict[str, Any]) -> str:
        value = str(arguments.get(instance.param, "")).strip()
        answers = {
            "length": lambda: str(len(value)),
            "reverse": lambda: value[::-1],
            "double": lambda: str(2 * int(value)),
            "echo": lambda: check_number(value),
        }
        return answers[instance.task]()

    return ToolEnvironment({instance.tool: run}, [instance.spec])


def aux_transcripts(
    tasks: Sequence[str], n: int, *, seed: int, tito: TITOTokenizer
) -> list[Transcript]:
    """``n`` ideal transcripts of the auxiliary ``tasks`` (repeats weight a task), interleaved."""
    from dressage.tiny.teachers import tool_transcript

    per_task = -(-n // len(tasks))
    groups = [aux_instances(t, per_task, seed=seed * 131 + k) for k, t in enumerate(tasks)]
    mixed = [inst for group in zip(*groups, strict=True) for inst in group][:n]
    return [
        tool_transcript(
            tito,
            inst.prompt,
            _environment(inst),
            inst.tool,
            {inst.param: inst.value},
            inst.label,
        )
        for inst in mixed
    ]


# -- training --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PretrainRecipe:
    """How the shipped base was made (``report.json`` records it)."""

    seed: int = 0
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    tasks: tuple[str, ...] = ("length", "reverse", "double", "echo", "echo")
    examples: int = 8192
    steps: int = 2000
    batch_size: int = 32
    lr: float = 5e-3
    warmup: int = 30
    data_seed: int = 0

    def model_spec(self, *, pretrained: str = "") -> TinyModelSpec:
        """The model this recipe trains (``pretrained=GENERALIST``: the shipped result)."""
        from dressage.tiny.model import TinyModelSpec
        from dressage.tiny.task_tokenizer import TASK_VOCAB

        return TinyModelSpec(
            vocab=TASK_VOCAB,
            seed=self.seed,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=4096,
            pretrained=pretrained,
        )


_RECIPE_HELP = {
    "seed": "seed of the model's initial weights",
    "hidden_size": "width of the model",
    "intermediate_size": "width of each MLP",
    "num_hidden_layers": "transformer layers",
    "num_attention_heads": "attention heads",
    "num_key_value_heads": "key/value heads (grouped-query attention)",
    "head_dim": "width of each attention head",
    "examples": "training examples drawn from the tasks",
    "steps": "optimizer steps",
    "batch_size": "examples a step",
    "lr": "peak learning rate (cosine decay after the warm-up)",
    "warmup": "steps of linear warm-up",
    "data_seed": "seed of the training examples",
}
"""Help of each ``build`` flag (one per numeric field of :class:`PretrainRecipe`)."""


def cosine_schedule(steps: int, warmup: int) -> Callable[[int], float]:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``steps``."""

    def factor(step: int) -> float:
        ramp = min(1.0, (step + 1) / max(warmup, 1))
        return ramp * 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(steps, 1)))

    return factor


def greedy_exact(
    model: nn.Module, transcripts: Sequence[Transcript], batch_size: int = 64
) -> float:
    """Share of transcripts whose every assistant token is the model's argmax in its context.

    With greedy decoding and deterministic tools that is exactly the share of instances the
    model solves through the agent loop: the greedy run then writes the ideal transcript token
    for token (the agent-loop measurement itself is :func:`dressage.agents.evaluate`'s).
    """
    import torch

    from dressage.causal_lm import causal_lm_hidden, output_embedding_module

    solved = 0
    with torch.no_grad():
        for s in range(0, len(transcripts), batch_size):
            batch = transcripts[s : s + batch_size]
            hidden = causal_lm_hidden(model, [torch.tensor(t.ids) for t in batch])
            logits = output_embedding_module(model)(hidden)
            guess = logits.argmax(-1).cpu()
            for i, t in enumerate(batch):
                ids = torch.tensor(t.ids)
                mask = torch.tensor(t.loss_mask[1:], dtype=torch.bool)
                solved += bool((guess[i, : len(t.ids) - 1][mask] == ids[1:][mask]).all())
    return solved / max(len(transcripts), 1)


def pretrain(
    recipe: PretrainRecipe, out: Path, *, device: str = "cpu", log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Pre-train the base per ``recipe`` into ``out`` (model, tokenizer, ``report.json``)."""

    import torch
    from transformers import AutoTokenizer

    from dressage.proxy.tito import create_tito_tokenizer
    from dressage.tiny.model import copy_tokenizer, init_tiny_model
    from dressage.tiny.task_tokenizer import task_tokenizer_dir
    from dressage.tiny.teachers import supervised_train, teacher_transcripts

    started = time.perf_counter()
    tok_dir = task_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    tito = create_tito_tokenizer(tokenizer, "qwen3.5")
    data = aux_transcripts(recipe.tasks, recipe.examples, seed=recipe.data_seed, tito=tito)
    heldout = {
        t: aux_transcripts((t,), 64, seed=recipe.data_seed + 10_000, tito=tito) for t in AUX_TASKS
    }
    targets = {
        t: teacher_transcripts(t, 64, seed=10_000, tokenizer_dir=tok_dir)
        for t in ("calculator", "lookup")
    }
    log(f"data: {len(data)} transcripts in {time.perf_counter() - started:.1f}s")
    model = init_tiny_model(recipe.model_spec())
    cast("nn.Module", model).to(torch.device(device))

    def measure(step: int) -> None:
        model.eval()
        scores = {t: greedy_exact(model, v) for t, v in {**heldout, **targets}.items()}
        model.train()
        log(f"step {step}: " + " ".join(f"{t} {v:.0%}" for t, v in scores.items()))

    losses = supervised_train(
        model,
        data,
        steps=recipe.steps,
        batch_size=recipe.batch_size,
        lr=recipe.lr,
        warmup=recipe.warmup,
        seed=recipe.data_seed,
        every=(max(recipe.steps // 4, 1), measure),
    )
    model.eval()
    accuracy = {t: greedy_exact(model, v) for t, v in {**heldout, **targets}.items()}
    cast("nn.Module", model).to(torch.device("cpu"))
    model.save_pretrained(str(out), safe_serialization=True)
    copy_tokenizer(tok_dir, out)
    report = {
        "recipe": json.loads(json.dumps(asdict(recipe))),  # tuples as JSON lists
        "device": device,
        "seconds": round(time.perf_counter() - started, 1),
        "losses_every_50": losses[::50] + losses[-1:],
        "greedy_exact_heldout": accuracy,
        "note": "greedy_exact: share of held-out instances solved token for token (64 each)",
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return report


BASES: dict[str, PretrainRecipe] = {
    GENERALIST: PretrainRecipe(),
    "generalist-large": PretrainRecipe(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        steps=1500,
        lr=2e-3,
        warmup=60,
    ),
}
"""The named bases a ``tiny-sft:`` spec can fine-tune (``base=NAME``). ``generalist`` ships with
the package; the others are pre-trained the first time a spec names them, on
:func:`dressage.tiny.model.build_device`, and cached. ``generalist-large`` (hidden 256, 4 layers:
3.3M parameters, 9 times the shipped base's 0.39M) is the at-scale experiment's
(``configs/mopd/scale.json``); it took 400 s on an H200 and reaches 100% on all four auxiliary
tasks, 0% on both embedded tasks."""
SHIPPED_BASES = (GENERALIST,)
_BASE_BUILD_VERSION = 1


def base_recipe(name: str) -> PretrainRecipe:
    """The recipe of the base called ``name``."""
    if name not in BASES:
        raise ValueError(f"unknown pre-trained base {name!r}; known: {sorted(BASES)}")
    return BASES[name]


def base_build_key(name: str) -> str:
    """The cache key of a base built on first use (its recipe's)."""
    from dressage.assets._cache import recipe_key

    return recipe_key(_build_recipe(name))


def _build_recipe(name: str) -> dict[str, Any]:
    recipe = json.loads(json.dumps(asdict(base_recipe(name))))  # tuples as JSON lists
    return {"kind": "pretrained-base", "version": _BASE_BUILD_VERSION, "name": name, **recipe}


def cached_base_dir(name: str) -> Path | None:
    """The folder of the base called ``name`` when it ships or is built, else None: never
    pre-trains or writes anything.

    Raises:
        FileNotFoundError: the package was installed without the shipped base's data files.
    """
    if name in SHIPPED_BASES:
        return generalist_dir()
    from dressage.assets._cache import cached_path

    return cached_path("bases", _build_recipe(name))


def base_dir(name: str) -> Path:
    """The folder of the base called ``name``: the shipped one, or one pre-trained on first use
    (on :func:`~dressage.tiny.model.build_device`) and cached."""
    if name in SHIPPED_BASES:
        return generalist_dir()
    from dressage.assets._cache import cached_build
    from dressage.tiny.model import build_device

    recipe = base_recipe(name)

    def build(out: Path) -> None:
        def log(line: str) -> None:
            print(f"pre-training base {name}: {line}", file=sys.stderr, flush=True)

        pretrain(recipe, out, device=build_device(), log=log)

    return cached_build("bases", _build_recipe(name), build)


def generalist_dir() -> Path:
    """The shipped base's folder (Hugging Face layout, with its tokenizer).

    Raises:
        FileNotFoundError: the package was installed without its data files.
    """
    if not (SHIPPED / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the generalist base is missing from {SHIPPED}: reinstall dressage with its package "
            "data, or rebuild it with `python -m dressage.tiny.generalist build --out ...`"
        )
    return SHIPPED


def main(argv: list[str] | None = None) -> int:
    """``python -m dressage.tiny.generalist build --out DIR [--device cuda] [--steps N]``."""
    parser = command_parser(
        "python -m dressage.tiny.generalist",
        description="Pre-train the generalist base on the auxiliary tool tasks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build = sub.add_parser(
        "build",
        help="train a base into --out and print what it measured",
        description="Train a generalist base into --out and print its held-out greedy accuracy.",
        formatter_class=DefaultsHelpFormatter,
    )
    build.add_argument("--out", required=True, type=Path, help="folder the base is written to")
    build.add_argument("--device", default="cpu", help="where it trains: cpu, cuda, cuda:N")
    for name, default in asdict(PretrainRecipe()).items():
        if isinstance(default, int | float) and not isinstance(default, bool):
            build.add_argument(
                f"--{name.replace('_', '-')}",
                type=type(default),
                default=default,
                help=_RECIPE_HELP[name],
            )
    args = parser.parse_args(argv)
    fields_ = {k: getattr(args, k) for k in asdict(PretrainRecipe()) if hasattr(args, k)}
    recipe = PretrainRecipe(**fields_)
    args.out.mkdir(parents=True, exist_ok=True)
    report = pretrain(recipe, args.out, device=args.device)
    print(json.dumps(report["greedy_exact_heldout"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
