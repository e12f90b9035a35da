"""The parts of dressage.slime.torch_dist that need no GPU: its command line and what it refuses.

The conversion itself runs through slime and Megatron on a GPU in
tests/real_slime/test_megatron_gpu.py; slime's parser checks the command line it builds in
tests/real_slime/test_megatron_parts.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dressage.slime.torch_dist import conversion_argv, main, megatron_iteration_dir

pytestmark = pytest.mark.unit

CONFIG = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 704,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def test_iteration_folder_is_the_trackers(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="latest_checkpointed_iteration.txt does not exist"):
        megatron_iteration_dir(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7\n")
    with pytest.raises(FileNotFoundError, match="names iter_0000007, which does not exist"):
        megatron_iteration_dir(tmp_path)
    (tmp_path / "iter_0000007").mkdir()
    assert megatron_iteration_dir(tmp_path) == tmp_path / "iter_0000007"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    (tmp_path / "release").mkdir()
    assert megatron_iteration_dir(tmp_path) == tmp_path / "release"


def test_conversion_argv_builds_the_model_with_te_names(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    argv = conversion_argv(tmp_path, tmp_path / "ckpt", ["--seed", "3"])
    spec = argv.index("--spec")
    assert argv[spec + 1 : spec + 3] == ["dressage.slime.layer_spec", "te_named_local_spec"]
    assert argv[argv.index("--hidden-size") + 1] == "64"
    assert argv[argv.index("--load") + 1] == str(tmp_path / "ckpt")
    assert argv[-2:] == ["--seed", "3"]  # flags after -- go last, so they win


def test_bad_input_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["to-torch-dist", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err and err.count("\n") == 1
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(CONFIG))
    assert main(["to-hf", str(tmp_path / "empty"), str(tmp_path / "hf"), str(tmp_path / "o")]) == 2
    assert "is not a Megatron checkpoint" in capsys.readouterr().err
