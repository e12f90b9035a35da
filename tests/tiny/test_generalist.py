"""The generalist base: auxiliary tasks, their transcripts, the shipped weights and the spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dressage.agents.tasks import make_instances
from dressage.proxy.tito import create_tito_tokenizer
from dressage.tiny import generalist
from dressage.tiny.generalist import (
    AUX_TASKS,
    PretrainRecipe,
    aux_instances,
    aux_transcripts,
    check_number,
    generalist_dir,
    greedy_exact,
    pretrain,
)
from dressage.tiny.model import TinyModelSpec, generalist_spec, model_key, tiny_model_dir
from dressage.tiny.teachers import parse_teacher_spec, teacher_transcripts


def _model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path)).eval()


@pytest.fixture(scope="module")
def tito() -> Any:
    from transformers import AutoTokenizer

    return create_tito_tokenizer(AutoTokenizer.from_pretrained(str(generalist_dir())), "qwen3.5")


@pytest.mark.unit
def test_aux_instances_are_seeded_and_name_random_tools() -> None:
    for task in AUX_TASKS:
        first, again = aux_instances(task, 40, seed=3), aux_instances(task, 40, seed=3)
        assert first == again
        assert first != aux_instances(task, 40, seed=4)
        assert len({i.tool for i in first}) > 3 and len({i.param for i in first}) > 2
        for inst in first:
            assert inst.spec["function"]["name"] == inst.tool
            assert inst.spec["function"]["parameters"]["required"] == [inst.param]
    echo = aux_instances("echo", 200, seed=0)
    assert any(symbol in i.value.split() for i in echo for symbol in ("+", "-", "*"))
    assert all(i.label == check_number(i.value) for i in echo)
    with pytest.raises(ValueError, match="unknown auxiliary task 'chess'"):
        aux_instances("chess", 1, seed=0)


@pytest.mark.unit
def test_aux_transcripts_call_the_named_tool_and_mask_only_the_assistant(tito: Any) -> None:
    tokenizer = tito.tokenizer
    for transcript, inst in zip(
        aux_transcripts(("echo",), 3, seed=5, tito=tito),
        aux_instances("echo", 3, seed=5 * 131),
        strict=True,
    ):
        text = tokenizer.decode(transcript.ids)
        assert f'"name": "{inst.tool}"' in text  # the tool list shows the random name
        written = tokenizer.decode(
            [t for t, m in zip(transcript.ids, transcript.loss_mask, strict=True) if m]
        )
        assert f"<function={inst.tool}>" in written and f"<parameter={inst.param}>" in written
        assert inst.value in written and written.rstrip().endswith(f"{inst.label}<|im_end|>")
        assert "Send the code" not in written  # the prompt is context, never trained on


@pytest.mark.integration
def test_the_shipped_base_makes_the_moves_but_solves_neither_task() -> None:
    """What report.json says the base measured holds here: the auxiliary tasks solved token for
    token, the embedded default's two tasks not at all."""
    report = json.loads((generalist_dir() / "report.json").read_text())
    assert report["recipe"] == json.loads(json.dumps(vars(PretrainRecipe())))
    model = _model(generalist_dir())
    path = generalist_dir()
    from transformers import AutoTokenizer

    tito = create_tito_tokenizer(AutoTokenizer.from_pretrained(str(path)), "qwen3.5")
    for task in AUX_TASKS:
        assert greedy_exact(model, aux_transcripts((task,), 16, seed=20_000, tito=tito)) >= 0.8
    for task in ("calculator", "lookup"):
        held = teacher_transcripts(task, 16, seed=10_000, tokenizer_dir=path)
        assert greedy_exact(model, held) == 0.0


@pytest.mark.integration
def test_pretrain_writes_a_loadable_base_with_its_report(tmp_path: Path) -> None:
    recipe = PretrainRecipe(
        hidden_size=32, intermediate_size=64, head_dim=8, examples=32, steps=3, batch_size=4
    )
    lines: list[str] = []
    report = pretrain(recipe, tmp_path, log=lines.append)
    assert report["recipe"]["steps"] == 3 and len(report["losses_every_50"]) == 2
    assert set(report["greedy_exact_heldout"]) == {*AUX_TASKS, "calculator", "lookup"}
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert _model(tmp_path).config.hidden_size == 32
    assert (tmp_path / "chat_template.jinja").is_file() and lines[0].startswith("data: 32")


@pytest.mark.unit
def test_greedy_exact_is_one_only_when_every_assistant_token_is_the_argmax() -> None:
    import torch

    held = teacher_transcripts("lookup", 2, seed=0, tokenizer_dir=generalist_dir())

    class Oracle(torch.nn.Module):
        """Logits that put the next token of the first transcript on top (a stand-in model)."""

        def __init__(self, ids: list[int]) -> None:
            super().__init__()
            self.ids = ids
            self.base_model = self
            self.head = torch.nn.Identity()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def get_input_embeddings(self) -> torch.nn.Module:
            return torch.nn.Embedding(1000, 4)

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

        def forward(self, inputs_embeds: Any, attention_mask: Any, use_cache: bool) -> Any:
            b, length = inputs_embeds.shape[:2]
            logits = torch.zeros(b, length, 1000)
            for p in range(min(length, len(self.ids) - 1)):
                logits[:, p, self.ids[p + 1]] = 1.0
            return type("Out", (), {"last_hidden_state": logits})()

    assert greedy_exact(Oracle(held[0].ids), held[:1]) == 1.0
    assert greedy_exact(Oracle(held[0].ids), held) == 0.5  # the second transcript differs


@pytest.mark.unit
def test_the_generalist_spec_names_a_known_base_and_nothing_else(monkeypatch) -> None:
    assert tiny_model_dir(generalist_spec()) == generalist_dir()
    assert model_key(generalist_spec()).startswith("generalist-")
    spec = parse_teacher_spec("tiny-sft:task=lookup,base=generalist,steps=5")
    assert spec.base == generalist_spec() and spec.steps == 5
    for bad, message in [
        ("tiny-sft:task=lookup,base=generalist,hidden_size=64", r"drop \['hidden_size'\]"),
        ("tiny-sft:task=lookup,base=huge", r"the named bases are \['generalist', "),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_teacher_spec(bad)
    with pytest.raises(ValueError, match="hidden_size=64 \\(the base has 128\\)"):
        tiny_model_dir(TinyModelSpec(vocab="qwen3.5-tasks", pretrained="generalist"))
    with pytest.raises(ValueError, match="unknown pre-trained base 'other'"):
        tiny_model_dir(TinyModelSpec(pretrained="other"))
    monkeypatch.setattr(generalist, "SHIPPED", Path("/nonexistent/generalist"))
    with pytest.raises(FileNotFoundError, match="the generalist base is missing"):
        generalist_dir()


@pytest.mark.unit
def test_aux_prompts_never_overlap_the_embedded_tasks() -> None:
    """The base must not see the tasks its teachers are measured on."""
    aux = {i.prompt for task in AUX_TASKS for i in aux_instances(task, 500, seed=0)}
    for task in ("calculator", "lookup"):
        assert not aux & {i.prompt for i in make_instances(task, 500, seed=10_000)}
    names = {i.tool for task in AUX_TASKS for i in aux_instances(task, 500, seed=0)}
    assert not names & {"calculator", "lookup"}


@pytest.mark.integration
def test_a_base_that_does_not_ship_is_pretrained_on_first_use_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = PretrainRecipe(
        hidden_size=32, intermediate_size=64, head_dim=8, examples=16, steps=2, batch_size=4
    )
    monkeypatch.setitem(generalist.BASES, "generalist-test", small)
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DRESSAGE_BUILD_DEVICE", "cpu")
    spec = parse_teacher_spec("tiny-sft:task=lookup,base=generalist-test,steps=1")
    assert spec.base == small.model_spec(pretrained="generalist-test")
    # naming it in a cache key (what finding a teacher does) never pre-trains it
    assert model_key(spec.base) == f"generalist-test-{generalist.base_build_key('generalist-test')}"
    assert not (tmp_path / "bases").exists()
    calls: list[str] = []
    real = generalist.pretrain

    def counted(recipe: PretrainRecipe, out: Path, **kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs["device"])
        return real(recipe, out, **kwargs)

    monkeypatch.setattr(generalist, "pretrain", counted)
    folder = tiny_model_dir(spec.base)
    assert folder.parent == tmp_path / "bases" and calls == ["cpu"]
    assert _model(folder).config.hidden_size == 32
    assert json.loads((folder / "report.json").read_text())["recipe"]["steps"] == 2
    assert tiny_model_dir(spec.base) == folder and calls == ["cpu"]  # cached
    with pytest.raises(ValueError, match="hidden_size=64 \\(the base has 32\\)"):
        tiny_model_dir(TinyModelSpec(vocab="qwen3.5-tasks", pretrained="generalist-test"))


@pytest.mark.unit
def test_the_build_device_is_the_configured_one_else_cuda_when_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from dressage.tiny.model import build_device

    monkeypatch.setenv("DRESSAGE_BUILD_DEVICE", "cuda:1")
    assert build_device() == "cuda:1"
    monkeypatch.delenv("DRESSAGE_BUILD_DEVICE")
    assert build_device() == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.unit
def test_the_scale_config_fine_tunes_every_model_from_the_large_base() -> None:
    from dressage.config.mopd import load_mopd_config
    from tests.helpers import REPO

    embedded = load_mopd_config(REPO / "configs/mopd/embedded.json")
    scale = load_mopd_config(REPO / "configs/mopd/scale.json")
    specs = scale.built_specs()
    assert len(specs) == 3  # the student and two teachers, nothing borrowed from the demo
    large = generalist_spec("generalist-large")
    for spec in specs:
        assert parse_teacher_spec(spec).base == large, spec
    assert large.hidden_size == 2 * generalist_spec().hidden_size
    # the same tasks, data and routing as the demo: only the models differ
    assert [d.model_dump() for d in scale.datasets] == [d.model_dump() for d in embedded.datasets]
