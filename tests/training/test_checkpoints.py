"""Checkpoint inspection: HF folders from dressage.assets, real Megatron torch_dist checkpoints."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dressage.assets import qwen_tokenizer_dir
from dressage.config.mopd import MopdConfig
from dressage.tiny import TinyModelSpec, tiny_model_dir
from dressage.training.checkpoints import (
    CheckpointError,
    check_checkpoints_compatible,
    inspect_checkpoint,
    mopd_topk_problems,
    tokenizer_fingerprint,
    validate_mopd_checkpoints,
    vocab_size,
)
from tests.helpers import REPO, free_port

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("embedded_checkpoints")]

QWEN35_ROWS = 248128  # the tiny models' padded Qwen3.5 vocabulary
QWEN3_ROWS = 151680


def _messages(problems: list) -> str:  # type: ignore[type-arg]
    return "\n".join(map(str, problems))


def _config(student: str, teachers: dict[str, dict[str, object]]) -> MopdConfig:
    return MopdConfig.model_validate(
        {
            "student": {"hf_checkpoint": student},
            "teachers": teachers,
            "datasets": [
                {
                    "name": f"d_{tid}",
                    "path": "x.jsonl",
                    "teacher_id": tid,
                    "weight": 1,
                    "agent_mode": "blackbox",
                }
                for tid in teachers
            ],
        }
    )


# -- Hugging Face layout ----------------------------------------------------------------------


def test_hf_checkpoint_metadata() -> None:
    info = inspect_checkpoint(tiny_model_dir())
    assert info.layout == "hf"
    assert (info.vocab_rows, info.hidden_size, info.num_layers) == (QWEN35_ROWS, 64, 2)
    assert info.architecture["architectures"] == ("Qwen3ForCausalLM",)
    assert info.tensor_shapes["model.embed_tokens.weight"] == (QWEN35_ROWS, 64)
    assert info.tokenizer is not None and info.tokenizer.size == 248077


def test_teachers_with_the_students_vocab_and_shape_are_compatible() -> None:
    config = _config(
        "tiny:seed=0", {"calc": {"load": "tiny:seed=1"}, "look": {"load": "tiny:seed=2"}}
    )
    assert validate_mopd_checkpoints(config) == []


def test_other_vocabulary_is_named() -> None:
    config = _config(
        "tiny:seed=0", {"ok": {"load": "tiny:seed=1"}, "q3": {"load": "tiny:vocab=qwen3"}}
    )
    problems = validate_mopd_checkpoints(config)
    assert problems and all(p.subject == "teacher 'q3'" for p in problems)
    text = _messages(problems)
    assert "tokenizer differs from the student's: 151669 ids" in text
    assert f"vocabulary rows {QWEN3_ROWS} != student's {QWEN35_ROWS}" in text


def test_other_hidden_size_is_named() -> None:
    spec = "tiny:seed=3,hidden_size=32,intermediate_size=64,head_dim=8"
    problems = validate_mopd_checkpoints(_config("tiny:seed=0", {"narrow": {"load": spec}}))
    assert {p.subject for p in problems} == {"teacher 'narrow'"}
    text = _messages(problems)
    assert "hidden_size 32 != student's 64" in text
    assert "model.embed_tokens.weight (248128, 32) vs (248128, 64)" in text


def test_a_top_k_beyond_the_students_vocabulary_is_named() -> None:
    info = inspect_checkpoint(tiny_model_dir())
    assert vocab_size(info) == QWEN35_ROWS  # config.json's vocab_size
    assert mopd_topk_problems(info, QWEN35_ROWS) == []
    (problem,) = mopd_topk_problems(info, QWEN35_ROWS + 1)
    assert str(problem).startswith(
        f"option --mopd-topk: --mopd-topk {QWEN35_ROWS + 1} exceeds the student's vocabulary of "
        f"{QWEN35_ROWS} tokens"
    )
    config = _config("tiny:seed=0", {"calc": {"load": "tiny:seed=1"}})
    assert validate_mopd_checkpoints(config, mopd_topk=16) == []
    assert validate_mopd_checkpoints(config, mopd_topk=QWEN35_ROWS + 1) == [problem]


def test_missing_teacher_folder_is_named(tmp_path: Path) -> None:
    config = _config("tiny:seed=0", {"ghost": {"load": str(tmp_path / "nowhere")}})
    assert [str(p) for p in validate_mopd_checkpoints(config)] == [
        f"teacher 'ghost': {tmp_path / 'nowhere'} does not exist or is not a folder"
    ]


def test_teacher_without_tokenizer_files_is_named(tmp_path: Path) -> None:
    source = tiny_model_dir(TinyModelSpec(seed=1))
    teacher = tmp_path / "weights_only"
    teacher.mkdir()
    for name in ("config.json", "model.safetensors"):
        (teacher / name).symlink_to(source / name)
    problems = validate_mopd_checkpoints(_config("tiny:seed=0", {"bare": {"load": str(teacher)}}))
    assert [p.subject for p in problems] == ["teacher 'bare'"]
    assert "no tokenizer files found" in problems[0].message
    # Naming a tokenizer folder fixes it.
    tok = str(qwen_tokenizer_dir("qwen3.5"))
    fixed = _config("tiny:seed=0", {"bare": {"load": str(teacher), "tokenizer": tok}})
    assert validate_mopd_checkpoints(fixed) == []


def test_folder_that_is_no_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="neither a Hugging Face folder"):
        inspect_checkpoint(tmp_path)


def test_tokenizer_fingerprint_of_vocab_and_merges_files(tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    first = tokenizer_fingerprint(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\nb a\n")
    second = tokenizer_fingerprint(tmp_path)
    assert first is not None and second is not None
    assert first.size == 3 and first.digest != second.digest
    assert tokenizer_fingerprint(tmp_path / "missing") is None


# -- Megatron torch_dist layout, written by megatron-core -------------------------------------


def _save_gpt(root: Path, *, vocab: int, iteration: int, seed: int, hf: str | None) -> Path:
    """A real torch_dist checkpoint of a tiny GPTModel shaped like the tiny HF Qwen3."""
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        ffn_hidden_size=128,
        gated_linear_unit=True,
        normalization="RMSNorm",
        add_bias_linear=False,
        use_cpu_initialization=True,
        params_dtype=torch.bfloat16,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=vocab,
        max_sequence_length=128,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=True,
    )
    args = argparse.Namespace(
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        ffn_hidden_size=128,
        padded_vocab_size=vocab,
        hf_checkpoint=hf,
    )
    folder = root / f"iter_{iteration:07d}"
    folder.mkdir(parents=True)
    state = {"model": model.sharded_state_dict(), "args": args, "iteration": iteration}
    dist_checkpointing.save(state, str(folder))
    (root / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    return root


@pytest.fixture(scope="module")
def megatron_ckpts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    root = tmp_path_factory.mktemp("torch_dist")
    tok = str(qwen_tokenizer_dir("qwen3.5"))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0
    )
    parallel_state.initialize_model_parallel(1, 1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            # megatron-core's torch_dist writer syncs a CUDA device that a CPU build lacks.
            patch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
            patch.setattr(torch.cuda, "current_device", lambda: "cpu")
            ckpts = {
                "student": _save_gpt(
                    root / "student", vocab=QWEN35_ROWS, iteration=7, seed=0, hf=tok
                ),
                "teacher": _save_gpt(
                    root / "teacher", vocab=QWEN35_ROWS, iteration=3, seed=1, hf=None
                ),
                "small": _save_gpt(root / "small", vocab=QWEN3_ROWS, iteration=5, seed=2, hf=None),
            }
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    yield ckpts


def test_torch_dist_metadata_is_read_back(megatron_ckpts: dict[str, Path]) -> None:
    info = inspect_checkpoint(megatron_ckpts["student"])
    assert info.layout == "torch_dist" and info.iteration == 7
    assert (info.vocab_rows, info.hidden_size, info.num_layers) == (QWEN35_ROWS, 64, 2)
    assert info.tensor_shapes["embedding.word_embeddings.weight"] == (QWEN35_ROWS, 64)
    assert info.tensor_shapes["decoder.layers.mlp.linear_fc1.weight"] == (2, 256, 64)
    assert info.architecture["num_query_groups"] == 2
    # No tokenizer files in the folder: found through the hf_checkpoint its args name.
    assert info.tokenizer is not None and info.tokenizer.size == 248077


def test_torch_dist_teachers_against_a_torch_dist_student(megatron_ckpts: dict[str, Path]) -> None:
    tok = str(qwen_tokenizer_dir("qwen3.5"))
    teachers = {
        "same": {"load": str(megatron_ckpts["teacher"]), "tokenizer": tok},
        "small": {"load": str(megatron_ckpts["small"]), "tokenizer": tok},
    }
    problems = validate_mopd_checkpoints(
        _config("tiny:seed=0", teachers), ref_load=str(megatron_ckpts["student"])
    )
    assert {p.subject for p in problems} == {"teacher 'small'"}
    text = _messages(problems)
    assert f"vocabulary rows {QWEN3_ROWS} != student's {QWEN35_ROWS}" in text
    assert f"embedding.word_embeddings.weight ({QWEN3_ROWS}, 64) vs ({QWEN35_ROWS}, 64)" in text


def test_torch_dist_teacher_without_tokenizer_is_named(megatron_ckpts: dict[str, Path]) -> None:
    student = inspect_checkpoint(tiny_model_dir())
    teacher = inspect_checkpoint(megatron_ckpts["teacher"])
    problems = check_checkpoints_compatible(student, {"t": teacher})
    assert [p.subject for p in problems] == ["teacher 't'"]
    assert "set its tokenizer folder" in problems[0].message


def test_torch_dist_iteration_selection(megatron_ckpts: dict[str, Path], tmp_path: Path) -> None:
    assert inspect_checkpoint(megatron_ckpts["teacher"], ckpt_step=3).iteration == 3
    with pytest.raises(CheckpointError, match="no iter_0000009/ for ckpt_step 9"):
        inspect_checkpoint(megatron_ckpts["teacher"], ckpt_step=9)
    moved = tmp_path / "moved"
    shutil.copytree(megatron_ckpts["teacher"], moved)
    (moved / "latest_checkpointed_iteration.txt").write_text("11")
    with pytest.raises(CheckpointError, match="names iter_0000011/, which does not exist"):
        inspect_checkpoint(moved)
    (moved / "iter_0000003" / ".metadata").unlink()
    with pytest.raises(CheckpointError, match="no .metadata"):
        inspect_checkpoint(moved, ckpt_step=3)


def test_cli_checks_a_configs_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dressage.training.checkpoints import main

    assert main([str(REPO / "configs/mopd/embedded.json")]) == 0
    assert "ok: student and teachers share" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(_config("tiny:seed=0", {"q3": {"load": "tiny:vocab=qwen3"}}).model_dump_json())
    assert main([str(bad)]) == 1
    assert "teacher 'q3': tokenizer differs" in capsys.readouterr().err


def test_torn_or_missing_shard_is_named(megatron_ckpts: dict[str, Path], tmp_path: Path) -> None:
    torn = tmp_path / "torn"
    shutil.copytree(megatron_ckpts["teacher"], torn)
    shard = sorted((torn / "iter_0000003").glob("*.distcp"))[0]
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError, match=f"{shard.name} is torn: {size // 2} bytes"):
        inspect_checkpoint(torn)
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard} is missing"):
        inspect_checkpoint(torn)


def test_a_continued_checkpoint_of_another_model_is_named(
    megatron_ckpts: dict[str, Path],
) -> None:
    """``--dressage-continue-from`` on the ray backend: the earlier run's torch_dist checkpoint
    against this run's student (dressage.training.checkpoints.continued_checkpoint_problems)."""
    from dressage.training.checkpoints import continued_checkpoint_problems

    student = str(tiny_model_dir())  # the tiny Qwen3: hidden 64, 2 layers, its own vocabulary
    problems = continued_checkpoint_problems(student, str(megatron_ckpts["small"]), 5)
    assert [p.subject for p in problems] == ["continue_from"]
    assert f"embedding has {QWEN3_ROWS} rows, the student's vocabulary" in problems[0].message
    same = continued_checkpoint_problems(student, str(megatron_ckpts["student"]), 7)
    assert [p.message for p in same if "embedding" in p.message] == []
    missing = continued_checkpoint_problems(student, str(megatron_ckpts["small"]), 9)
    assert [p.subject for p in missing] == ["continue_from"]
    assert "iter_0000009" in missing[0].message


def test_a_continued_run_without_load_is_named() -> None:
    from dressage.training.checkpoints import continued_checkpoint_problems

    (problem,) = continued_checkpoint_problems(str(tiny_model_dir()), None, None)
    assert (problem.subject, "no --load" in problem.message) == ("continue_from", True)
