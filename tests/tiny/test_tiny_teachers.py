"""Tiny task teachers: specs, transcripts the proxy would record, determinism, and learning."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from dressage.agents import AgentTask, load_agent
from dressage.config.env import cache_dir
from dressage.config.mopd import load_mopd_config
from dressage.tiny import TinyModelSpec, tiny_model_dir
from dressage.tiny.checkpoints import CheckpointNotBuiltError, find_checkpoint, resolve_checkpoint
from dressage.tiny.model import generalist_spec, tiny_model_key, vocab_dir, vocab_key
from dressage.tiny.teachers import (
    TinyTeacherSpec,
    cached_teacher_dir,
    parse_teacher_spec,
    teacher_transcripts,
    tiny_teacher_dir,
)
from tests.helpers import REPO

EMBEDDED = REPO / "configs/mopd/embedded.json"


def _load(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path)).eval()


@pytest.mark.unit
def test_specs_parse_with_base_and_recipe_keys() -> None:
    spec = parse_teacher_spec("tiny-sft:task=lookup,seed=3,steps=5,lr=0.01,train_embeddings=0")
    assert spec == TinyTeacherSpec(
        task="lookup", base=TinyModelSpec(seed=3), steps=5, lr=0.01, train_embeddings=False
    )
    assert parse_teacher_spec("tiny-sft:task=calculator+lookup").tasks == ("calculator", "lookup")
    for bad, message in [
        ("tiny-sft:seed=1", "needs task="),
        ("tiny-sft:task=chess", "tasks must be one or more of"),
        ("tiny-sft:task=lookup,colour=red", "'colour=red' is not key=value with key in"),
        ("tiny-sft:task=lookup,steps=many", "steps='many' is not a valid value"),
        ("tiny-sft:task=lookup,steps=0", "positive steps"),
        ("tiny:seed=1", "does not start with 'tiny-sft:'"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_teacher_spec(bad)


@pytest.mark.unit
def test_transcripts_mask_only_what_the_assistant_writes(qwen35_tokenizer: Any) -> None:
    (calc, look) = teacher_transcripts(
        ("calculator", "lookup"), 2, seed=0, tokenizer_dir=tiny_model_dir()
    )
    for transcript, name in ((calc, "calculator"), (look, "lookup")):
        written = [i for i, m in zip(transcript.ids, transcript.loss_mask, strict=True) if m]
        text = qwen35_tokenizer.decode(written)
        assert text.startswith(f"<tool_call>\n<function={name}>\n<parameter=")
        assert text.count("<|im_end|>") == 2 and text.endswith("<|im_end|>")
        prompt = qwen35_tokenizer.decode(transcript.ids[: transcript.loss_mask.index(1)])
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert f'"name": "{name}"' in prompt  # the task's tool was offered


@pytest.mark.integration
def test_a_transcript_is_what_the_proxy_records_for_the_ideal_agent_run(tmp_path: Path) -> None:
    """The tool agent, driven through the real proxy by an engine that answers ideally, leaves
    exactly the teacher's training transcript: same ids, same mask."""
    from openai import AsyncOpenAI

    from dressage.agents.tasks import make_instances
    from dressage.assets import load_tokenizer
    from dressage.proxy.tito import create_tito_tokenizer
    from dressage.trajectory import Segment
    from tests.proxy.conftest import Script, scripted_proxy

    (instance,) = make_instances("lookup", 1, seed=5)
    (transcript,) = teacher_transcripts("lookup", 1, seed=5, tokenizer_dir=tiny_model_dir())
    tito = create_tito_tokenizer(load_tokenizer("qwen3.5"), "qwen3.5")
    call = (
        "<tool_call>\n<function=lookup>\n<parameter=key>\n"
        f"{instance.arguments['key']}\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    plan = Script(tito, call, f"{instance.label}<|im_end|>")

    async def agent(url: str) -> str:
        client = AsyncOpenAI(base_url=f"{url}/sessions/ideal/v1", api_key="x", max_retries=0)
        try:
            task = AgentTask(prompt=instance.prompt, task="lookup")
            return (await load_agent("tool_user")(client, task)).final_answer
        finally:
            await client.close()

    import httpx

    with scripted_proxy(plan, tmp_path, tito) as (url, _):
        assert asyncio.run(agent(url)) == instance.label
        (data,) = httpx.post(f"{url}/v1/sessions/ideal/finalize").json()["segments"]
    segment = Segment.from_dict(data)
    assert segment.tokens == transcript.ids
    assert segment.full_loss_mask == transcript.loss_mask


def _tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.unit
def test_looking_up_an_unbuilt_teacher_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding or resolving a teacher that is not built, in an empty cache, builds nothing: not
    the teacher, not its random-init base, not that base's tokenizer, no lock file; resolving
    says the teacher is not built. (Resolution used to build the base to name it in the key.)"""
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path))
    specs = [
        "tiny-sft:task=calculator,seed=5,steps=2",  # a random init over Qwen3.5's vocabulary
        "tiny-sft:task=lookup,vocab=qwen3,hidden_size=32,head_dim=8",
        "tiny-sft:task=calculator+lookup,vocab=qwen3.5-tasks",
        "tiny-sft:task=lookup,base=generalist,steps=3",  # the shipped base
        "tiny-sft:task=lookup,base=generalist-large,steps=3",  # pre-trained on first use
    ]
    for spec in specs:
        assert cached_teacher_dir(parse_teacher_spec(spec)) is None
        assert find_checkpoint(spec) is None
        with pytest.raises(CheckpointNotBuiltError, match="is not built yet") as info:
            resolve_checkpoint(spec)
        assert info.value.spec == spec and "dressage assets --checkpoint" in str(info.value)
    large = asdict(generalist_spec("generalist-large"))
    tiny_large = "tiny:" + ",".join(f"{key}={value}" for key, value in large.items())
    with pytest.raises(CheckpointNotBuiltError, match="is not built yet"):
        resolve_checkpoint(tiny_large)  # a tiny: spec naming that base is not pre-trained either
    assert find_checkpoint("tiny:seed=5") is None  # finding a random init does not build it
    assert _tree(tmp_path) == []


@pytest.mark.unit
def test_the_lookup_keys_are_the_folders_the_builds_make() -> None:
    """The key functions name the same cache folders as the builds (so caches built before them
    are still found), and a built tiny: model is found where it was built."""
    for spec in [
        TinyModelSpec(seed=41, hidden_size=16, head_dim=4),
        TinyModelSpec(vocab="qwen3.5-tasks", seed=2, hidden_size=32, head_dim=8),
        generalist_spec(),
    ]:
        built = tiny_model_dir(spec)
        assert tiny_model_key(spec) == built.name
        assert vocab_key(spec.vocab) == vocab_dir(spec.vocab).name
        assert built.parent.name == ("models" if not spec.pretrained else "pretrained")
    text = "tiny:seed=41,hidden_size=16,head_dim=4"
    built = tiny_model_dir(TinyModelSpec(seed=41, hidden_size=16, head_dim=4))
    assert find_checkpoint(text) == resolve_checkpoint(text) == built


def _small_cache(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh teacher cache that shares the already built tokenizers and base models."""
    shared = cache_dir()
    tiny_model_dir()  # built in the shared cache before it is linked
    root.mkdir()
    for kind in ("tokenizers", "models"):
        (root / kind).symlink_to(shared / kind)
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(root))


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.unit
def test_builds_are_deterministic_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = TinyTeacherSpec(task="lookup", steps=3, examples=4, batch_size=2)
    folders = []
    for name in ("a", "b"):
        _small_cache(tmp_path / name, monkeypatch)
        folders.append(tiny_teacher_dir(spec))
    first, second = (_weights(f) for f in folders)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    base = _weights(tiny_model_dir(spec.base))
    assert not torch.equal(first["model.norm.weight"], base["model.norm.weight"])  # it trained
    done = (folders[1] / ".complete").stat().st_mtime_ns
    assert tiny_teacher_dir(spec) == folders[1]  # cached: not rebuilt
    assert (folders[1] / ".complete").stat().st_mtime_ns == done
    assert tiny_teacher_dir(TinyTeacherSpec(task="lookup", steps=4, examples=4)) != folders[1]
    report = json.loads((folders[0] / "sft_report.json").read_text())
    assert len(report["losses"]) == 3 and report["spec"]["task"] == "lookup"
    # measured through the agent loop on both tasks, as sft_report.json promises
    assert set(report["agent_accuracy"]) == {"calculator", "lookup"}
    assert all(0.0 <= a <= 1.0 for a in report["agent_accuracy"].values())
    assert report["agent_eval"]["items_per_task"] == 16
    assert (folders[0] / "tokenizer.json").is_file() and (
        folders[0] / "chat_template.jinja"
    ).exists()


@pytest.mark.unit
@pytest.mark.usefixtures("embedded_checkpoints")
def test_the_configs_teachers_are_skilled_and_the_student_is_not() -> None:
    """The embedded config's teachers solve held-out instances of their own task through the
    agent loop (engine, proxy, tools, exact-match reward: sft_report.json) at >= 90% and the
    other task at a clearly lower rate; the student starts at <= 20% on both. A second, larger
    held-out set scored token for token (greedy_exact) agrees, and the base solves neither."""
    from dressage.tiny.generalist import generalist_dir, greedy_exact

    config = load_mopd_config(EMBEDDED)
    assert config.student is not None
    teachers = {tid: resolve_checkpoint(t.load) for tid, t in config.teachers.items()}
    student = resolve_checkpoint(config.student.hf_checkpoint)
    heldout = {
        task: teacher_transcripts(task, 48, seed=777, tokenizer_dir=generalist_dir())
        for task in teachers
    }
    for tid, path in teachers.items():
        report = json.loads((path / "sft_report.json").read_text())
        other = next(t for t in teachers if t != tid)
        assert report["agent_accuracy"][tid] >= 0.9, (tid, report["agent_accuracy"])
        assert report["agent_accuracy"][other] <= 0.25, (tid, report["agent_accuracy"])
        model = _load(path)
        assert greedy_exact(model, heldout[tid]) >= 0.85, tid
        assert greedy_exact(model, heldout[other]) <= 0.25, tid
    started = json.loads((student / "sft_report.json").read_text())["agent_accuracy"]
    assert all(started[task] <= 0.2 for task in teachers), started
    base = _load(generalist_dir())
    assert all(greedy_exact(base, held) == 0.0 for held in heldout.values())
    spec = config.teachers["calculator"].load
    assert resolve_checkpoint(spec) == tiny_teacher_dir(parse_teacher_spec(spec))
