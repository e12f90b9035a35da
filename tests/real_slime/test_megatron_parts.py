"""The pieces the GPU tier builds slime's actor from, checked on CPU with slime's and Megatron's
code.

- :mod:`dressage.slime.model_flags`: slime's own parser and its check of Megatron's flags against
  the checkpoint (``_hf_validate_args``) accept the derived flags, and refuse a wrong one.
- :mod:`dressage.slime.layer_spec`: Megatron's local spec with TE's parameter names computes what
  the local spec computes, writes the same checkpoint keys, and slime's Hugging Face loader and
  its Megatron-to-Hugging-Face converter carry the project's tiny model through it and back, bit
  for bit (fp32). Megatron's plain local spec is refused by slime's loader, which is why.

The GPU tier (test_megatron_gpu.py) runs the same conversion through Megatron's checkpoints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers import megatron_lm_root

EMBEDDED = Path(__file__).resolve().parents[2] / "configs" / "mopd" / "embedded.json"


@pytest.fixture(scope="module")
def student_hf() -> Path:
    from dressage.tiny.checkpoints import resolve_checkpoint

    config = json.loads(EMBEDDED.read_text())
    return Path(resolve_checkpoint(config["student"]["hf_checkpoint"]))


def _parse(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Any:
    from slime.utils.arguments import parse_args

    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    return parse_args()


@pytest.mark.skipif(
    megatron_lm_root() is None,
    reason="MEGATRON_LM_ROOT is not set: slime's parser needs Megatron-LM's megatron.training",
)
def test_slime_checks_the_derived_flags_against_the_checkpoint(
    monkeypatch: pytest.MonkeyPatch, student_hf: Path
) -> None:
    from dressage.slime.torch_dist import conversion_argv

    hf = json.loads((student_hf / "config.json").read_text())
    args = _parse(monkeypatch, conversion_argv(student_hf, student_hf))
    assert (args.hidden_size, args.num_layers, args.ffn_hidden_size, args.vocab_size) == (
        hf["hidden_size"],
        hf["num_hidden_layers"],
        hf["intermediate_size"],
        hf["vocab_size"],
    )
    # Megatron's padding rows would enter slime's log-softmax: the derived divisor leaves none
    assert args.padded_vocab_size == hf["vocab_size"] and args.qk_layernorm and args.swiglu
    assert args.load == str(student_hf) and args.finetune and args.no_load_optim  # slime's HF load
    assert args.spec == ["dressage.slime.layer_spec", "te_named_local_spec"]

    wrong = conversion_argv(student_hf, student_hf)
    wrong[wrong.index("--ffn-hidden-size") + 1] = str(hf["intermediate_size"] * 2)
    with pytest.raises(AssertionError, match="intermediate_size in hf config .* is not equal"):
        _parse(monkeypatch, wrong)


def _config(hf: Any) -> Any:
    import torch
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        num_attention_heads=hf.num_attention_heads,
        num_query_groups=hf.num_key_value_heads,
        kv_channels=hf.head_dim,
        ffn_hidden_size=hf.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
    )


def _model(config: Any, spec: Any, seed: int = 0) -> Any:
    import torch
    from megatron.core.models.gpt import GPTModel

    torch.manual_seed(seed)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=768,
        max_sequence_length=256,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=True,
    )


def _args(hf: Any) -> SimpleNamespace:
    return SimpleNamespace(
        qk_layernorm=True,
        normalization="RMSNorm",
        num_experts=None,
        multi_latent_attention=False,
        padded_vocab_size=768,
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        num_attention_heads=hf.num_attention_heads,
        num_query_groups=hf.num_key_value_heads,
        kv_channels=hf.head_dim,
        q_lora_rank=None,
        model_name=None,
    )


def test_te_named_local_spec_is_the_local_spec_renamed(
    megatron_world: None, student_hf: Path
) -> None:
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from transformers import AutoConfig

    from dressage.slime.layer_spec import te_named_local_spec

    hf = AutoConfig.from_pretrained(str(student_hf))
    config = _config(hf)
    local = _model(config, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"))
    named = _model(config, te_named_local_spec(_args(hf), config))
    renamed = {
        n.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight").replace(
            "pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"
        ): p
        for n, p in local.named_parameters()
    }
    assert sorted(renamed) == sorted(n for n, _ in named.named_parameters())
    with torch.no_grad():
        for n, p in named.named_parameters():
            p.copy_(renamed[n] * (1.5 if "layer_norm_weight" in n else 1.0))
            renamed[n].copy_(p)
    x = torch.randn(12, 1, hf.hidden_size)
    for a, b in zip(local.decoder.layers, named.decoder.layers, strict=True):
        qkv_local, _ = a.self_attention.linear_qkv(a.input_layernorm(x))
        qkv_named, _ = b.self_attention.linear_qkv(x)
        mlp_local, _ = a.mlp(a.pre_mlp_layernorm(x))
        mlp_named, _ = b.mlp(x)
        assert torch.equal(qkv_local, qkv_named) and torch.equal(mlp_local, mlp_named)
    qkv_named.sum().backward()
    assert named.decoder.layers[-1].self_attention.linear_qkv.layer_norm_weight.grad is not None

    def keys(model: Any) -> list[str]:
        return sorted(v.key for v in model.sharded_state_dict().values() if hasattr(v, "key"))

    assert keys(local) == keys(named)  # one checkpoint format


def test_slimes_converters_carry_the_model_there_and_back(
    megatron_world: None, student_hf: Path
) -> None:
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from safetensors.torch import load_file
    from slime.backends.megatron_utils.hf_to_megatron.common import load_model_hf_weights
    from slime.backends.megatron_utils.hf_to_megatron.qwen import qwen_hf_tensor
    from slime.backends.megatron_utils.megatron_to_hf import convert_to_hf
    from slime.backends.megatron_utils.update_weight.common import named_params_and_buffers
    from transformers import AutoConfig

    from dressage.slime.layer_spec import te_named_local_spec

    hf = AutoConfig.from_pretrained(str(student_hf))
    config, args = _config(hf), _args(hf)
    plain = _model(config, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"))
    with pytest.raises(KeyError, match="input_layernorm"):
        load_model_hf_weights(args, [plain], student_hf, hf, qwen_hf_tensor)

    model = _model(config, te_named_local_spec(args, config), seed=1)
    load_model_hf_weights(args, [model], student_hf, hf, qwen_hf_tensor)
    want = load_file(str(student_hf / "model.safetensors"))
    got: dict[str, torch.Tensor] = {}
    for name, param in named_params_and_buffers(args, [model], convert_to_global_name=True):
        global_name = "module.module." + name.removeprefix("module.")  # as DDP(Float16Module(.))
        got.update(convert_to_hf(args, "qwen3config", global_name, param.detach()))
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key][: value.shape[0]], value), key  # vocabulary rows padded


def test_packed_attention_is_causal_attention_per_sequence(megatron_world: None) -> None:
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType

    from dressage.slime.layer_spec import _packed_attention_cls

    config = _config(SimpleNamespace(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, rms_norm_eps=1e-6,
    ))  # fmt: skip
    attention = _packed_attention_cls()(config, 1, AttnMaskType.causal, "self").eval()
    bounds = [0, 5, 9, 16, 20]  # three sequences, then padding as slime packs it
    g = torch.Generator().manual_seed(0)
    q = torch.randn(20, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(20, 2, 8, generator=g, dtype=torch.float64) for _ in "kv")
    cu = torch.tensor(bounds, dtype=torch.int32)
    params = PackedSeqParams(
        cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7, qkv_format="thd"
    )
    out = attention(q, k, v, None, packed_seq_params=params)
    assert out.shape == (20, 32)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        n = end - start
        kk = k[start:end].repeat_interleave(2, dim=1)  # each key head serves two query heads
        vv = v[start:end].repeat_interleave(2, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end], kk) / 8**0.5
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(n, 32)
        assert torch.allclose(out[start:end], want, atol=1e-12), (start, end)
    k2 = k.clone()
    k2[9:16] += 1.0  # another sequence's keys change nothing in the first
    again = attention(q, k2, v, None, packed_seq_params=params)
    assert torch.equal(again[:9], out[:9]) and not torch.equal(again[9:16], out[9:16])


def test_recorded_train_data_for_the_gpu_tier(tmp_path: Path) -> None:
    """The GPU rig's ``record`` phase: the student's sessions through the proxy become slime
    Samples, which the project's converter turns into train data for both teachers."""
    import torch
    from slime.utils.types import Sample

    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from tests.real_slime.gpu_rig import RECORDED, record
    from tests.rollout.factories import slime_args

    summary = record(tmp_path, per_task=2)
    assert summary["sessions"] == 4 and summary["teachers"] == ["calculator", "lookup"]
    samples = torch.load(tmp_path / RECORDED, weights_only=False)
    assert all(isinstance(s, Sample) for s in samples) and len(samples) == summary["samples"]
    for s in samples:
        assert max(s.tokens) < 704 and len(s.loss_mask) == s.response_length
        assert 0 < sum(s.loss_mask) <= s.response_length  # tool results, if any, masked
        assert len(s.rollout_log_probs) == s.response_length
    args = slime_args(
        advantage_estimator="mopd",
        rewards_normalization=False,
        n_samples_per_prompt=1,
        global_batch_size=len(samples),
        rollout_batch_size=4,
    )
    data = convert_samples_to_train_data(args, samples)
    assert sorted(set(data["prompt"])) == ["calculator", "lookup"]  # the teacher ids
    assert len(data["tokens"]) == len(samples)


@pytest.mark.skipif(
    megatron_lm_root() is None,
    reason="MEGATRON_LM_ROOT is not set: slime's parser needs Megatron-LM's megatron.training",
)
def test_the_step_benches_build_what_slime_parses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """tests/real_slime/gpu_step.py, as the slime-path benchmarks use it on the GPU: a Qwen3
    folder of a given shape that slime's parser and its Hugging Face check accept with the
    MOPD flags, four teachers in the MOPD config, and long samples that the project's
    converter turns into train data in the teachers' order."""
    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from dressage.training.mopd_train import parse_mopd_args
    from tests.real_slime.gpu_step import _argv, _samples, write_model

    shape = dict(
        vocab_size=151936,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    hf = write_model(tmp_path / "hf", shape)
    spec = {
        "hf": str(hf),
        "student_load": str(tmp_path / "td"),
        "teacher_load": str(tmp_path / "td"),
        "teachers": 4,
        "samples": 4,
        "prompt": 16,
        "lengths": [32, 96],
        "objective": "topk",
        "topk": 8,
        "optimizer": "sgd",
    }
    monkeypatch.setattr(sys, "argv", ["train.py"])
    args = parse_mopd_args(_argv(tmp_path, spec))
    assert (args.hidden_size, args.num_layers, args.vocab_size) == (256, 2, 151936)
    assert (args.mopd_objective, args.mopd_topk, args.optimizer) == ("topk", 8, "sgd")
    assert args.seq_length == 16 + 96 and args.global_batch_size == 4
    config = json.loads((tmp_path / "mopd.json").read_text())
    assert sorted(config["teachers"]) == ["t0", "t1", "t2", "t3"]
    args.advantage_estimator = "mopd"
    samples = _samples(args, 4, 2, 16, 96, 151936)
    assert [s.metadata["teacher_id"] for s in samples] == ["t0", "t1", "t0", "t1"]
    assert all(len(s.tokens) == 16 + 96 and sum(s.loss_mask) == 96 for s in samples)
    data = convert_samples_to_train_data(args, samples)
    assert data["prompt"] == ["t0", "t1", "t0", "t1"] and len(data["tokens"]) == 4


@pytest.mark.skipif(
    megatron_lm_root() is None,
    reason="MEGATRON_LM_ROOT is not set: slime's parser needs Megatron-LM's megatron.training",
)
@pytest.mark.parametrize("fp32", [False, True], ids=["bf16", "fp32"])
def test_the_embedded_reference_of_the_gpu_tier(tmp_path: Path, fp32: bool) -> None:
    """The GPU rig's ``embedded`` phase (what the GPU tier compares slime's first step with)
    runs the embedded trainer on the ``plain_sampled`` scenario's slime arguments and batch:
    both log-probs for every sample, keyed by its tokens, a finite loss and gradient norm; in
    float32 on the weights rounded to bf16, as slime's float32 actor holds them."""
    import os
    import subprocess

    from tests.helpers import REPO, slime_root

    paths = [str(REPO), str(slime_root()), str(megatron_lm_root()), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.real_slime.gpu_rig", "embedded", str(tmp_path),
         json.dumps({"name": "scenario", "fp32": fp32})],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "embedded_scenario.json").read_text())
    assert report["bf16"] is not fp32
    assert len(report["teacher_log_probs"]) == len(report["log_probs"]) == 4
    for key in ("teacher_log_probs", "log_probs"):
        for tokens, values in report[key].items():
            assert 0 < len(values) < len(tokens.split(",")) and all(v <= 0 for v in values)
    assert report["mopd_loss"] > 0 and 0 < report["grad_norm"] < float("inf")


def test_the_learning_phase_trains_on_the_students_own_turns(tmp_path: Path) -> None:
    """tests/real_slime/gpu_learn.py's data path: the tool agent's first request encoded as the
    proxy encodes it, one turn sampled from the student with its log-probs (up to its closer),
    and samples that the project's converter turns into train data routed to both teachers."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dressage.proxy.tito import create_tito_tokenizer
    from dressage.rollout.convert_samples import convert_samples_to_train_data
    from tests.real_slime import gpu_learn
    from tests.real_slime.gpu_rig import _checkpoints, bf16_rounded
    from tests.rollout.factories import slime_args

    student = _checkpoints()["student"]
    tokenizer = AutoTokenizer.from_pretrained(str(student))
    tito = create_tito_tokenizer(tokenizer, "qwen3.5")
    config = json.loads(gpu_learn.gpu_rig.EMBEDDED.read_text())
    batch = [gpu_learn.rows(gpu_learn.DATA / d["path"])[0] for d in config["datasets"]]
    prompts = [gpu_learn.prompt_ids(tito, row) for row in batch]
    for row, ids in zip(batch, prompts, strict=True):
        text = tokenizer.decode(ids)
        tail = text.rsplit("<|im_end|>", 1)[-1]  # the generation prompt (thinking off)
        assert row["input"] in text and tail.startswith("\n<|im_start|>assistant\n"), tail
    model = AutoModelForCausalLM.from_pretrained(str(student)).eval()
    stop = sorted(tito.closer_ids)
    torch.manual_seed(0)
    turns = gpu_learn.sample_turns(model, prompts, stop, stop[0])
    for ids, lps, finish in turns:
        assert 0 < len(ids) <= gpu_learn.MAX_NEW_TOKENS and len(lps) == len(ids)
        assert all(v <= 0 for v in lps) and (finish == "stop") == (ids[-1] in stop)
        assert all(t not in stop for t in ids[:-1])
    # the sampled log-probs are the model's own at those positions
    ids, lps, _ = turns[0]
    full = torch.tensor([prompts[0] + ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0].float(), -1)
    want = [float(logp[len(prompts[0]) - 1 + i, t]) for i, t in enumerate(ids)]
    assert lps == pytest.approx(want, abs=1e-3)
    args = slime_args(
        advantage_estimator="mopd",
        rewards_normalization=False,
        n_samples_per_prompt=1,
        global_batch_size=2,
        rollout_batch_size=2,
    )
    samples = gpu_learn.make_samples(args, tokenizer, batch, prompts, turns, step=3)
    assert [s.metadata["teacher_id"] for s in samples] == ["calculator", "lookup"]
    for s, prompt, (ids, lps, _) in zip(samples, prompts, turns, strict=True):
        assert s.tokens == prompt + ids and s.response_length == len(ids)
        assert s.loss_mask == [1] * len(ids) and s.rollout_log_probs == lps
    data = convert_samples_to_train_data(args, samples)
    assert data["prompt"] == ["calculator", "lookup"] and len(data["tokens"]) == 2
    # the float32 comparison's weights: rounded to bf16, kept in float32
    rounded = bf16_rounded(student, tmp_path / "rounded")
    for key, value in load_file(str(rounded / "model.safetensors")).items():
        assert value.dtype == load_file(str(student / "model.safetensors"))[key].dtype
        assert torch.equal(value, value.to(torch.bfloat16).to(value.dtype)), key
