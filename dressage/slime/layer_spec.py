"""Megatron's local layer spec with Transformer Engine's parameter names, for machines without TE.

slime's actor builds dense models with Transformer Engine's layer spec when
``--transformer-impl transformer_engine`` (its default), and its converters between Hugging Face
and Megatron weights know that spec's names only: the norm before attention and the one before
the MLP live inside the next linear, as ``self_attention.linear_qkv.layer_norm_weight`` and
``mlp.linear_fc1.layer_norm_weight``. Megatron's local spec (``--transformer-impl local``, the one
that builds without TE) keeps them as ``input_layernorm`` and ``pre_mlp_layernorm``, which slime's
Hugging Face loader, its ``--save-hf`` saver and its weight updaters refuse by name.

:func:`te_named_local_spec` is Megatron's local spec with those two norms moved into the linears
that follow them, as TE's spec has them: the same modules compute the same thing, the parameters
carry TE's names, and the ``torch_dist`` checkpoint keys are the ones a TE model writes (the local
spec maps its norms onto those keys already). Its core attention also takes the packed sequences
slime trains on (``qkv_format='thd'``), which only TE's attention takes otherwise. Name it on
slime's command line::

    --transformer-impl local --spec dressage.slime.layer_spec te_named_local_spec

slime's model provider calls it with ``(args, config, vp_stage)`` and builds its ``GPTModel`` with
the spec it returns. Dense models only (no experts, no multi-latent attention).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

__all__ = ["te_named_local_spec"]


@functools.cache
def _normed_linear_cls() -> type:
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    class NormedColumnParallelLinear(ColumnParallelLinear):
        """Megatron's local norm, then its column-parallel linear; the norm's weight is this
        module's ``layer_norm_weight`` (and ``layer_norm_bias`` for LayerNorm), as in TE's
        ``LayerNormColumnParallelLinear``. The norm module itself is not registered: its
        parameters are these."""

        def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any):
            super().__init__(input_size, output_size, config=config, **kwargs)
            eps = config.layernorm_epsilon
            norm = WrappedTorchNorm(config=config, hidden_size=input_size, eps=eps)
            self.layer_norm_weight = norm.weight
            if getattr(norm, "bias", None) is not None:
                self.layer_norm_bias = norm.bias
            object.__setattr__(self, "_norm", norm)  # shares the Parameters above

        def forward(
            self, input_: Any, weight: Any = None, runtime_gather_output: Any = None
        ) -> Any:
            return super().forward(
                self._norm(input_), weight=weight, runtime_gather_output=runtime_gather_output
            )

    return NormedColumnParallelLinear


@functools.cache
def _packed_attention_cls() -> type:
    import torch.nn.functional as F
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class PackedSequenceDotProductAttention(DotProductAttention):
        """Megatron's local attention, plus packed sequences (``qkv_format='thd'``).

        slime packs every micro-batch into one row with ``cu_seqlens`` and hands attention a
        ``PackedSeqParams``, which only Transformer Engine's attention takes; Megatron's local one
        refuses it. On a machine without TE, this computes each packed sequence's causal
        attention on its own with torch's ``scaled_dot_product_attention`` (grouped-query heads
        shared as Megatron shares them), which is what TE's ``thd`` attention computes. Context
        parallelism is not covered (Megatron's local attention refuses it as well). Unpacked
        input goes to Megatron's own forward.
        """

        def forward(
            self,
            query: Any,
            key: Any,
            value: Any,
            attention_mask: Any,
            attn_mask_type: Any = None,
            attention_bias: Any = None,
            packed_seq_params: Any = None,
        ) -> Any:
            if packed_seq_params is None:
                return super().forward(
                    query, key, value, attention_mask, attn_mask_type, attention_bias
                )
            if packed_seq_params.qkv_format != "thd" or attention_bias is not None:
                raise ValueError(
                    f"packed attention takes qkv_format 'thd' without a bias, got "
                    f"{packed_seq_params.qkv_format!r}"
                )
            scale = self.softmax_scale
            if self.config.apply_query_key_layer_scaling:
                scale = scale * self.layer_number  # Megatron's softmax multiplies it back
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            out = query.new_zeros(query.shape[0], query.shape[1] * query.shape[2])
            groups = query.shape[1] // key.shape[1]
            for start, end in zip(bounds[:-1], bounds[1:], strict=True):
                if end <= start:
                    continue
                # [1, heads, tokens, dim]: torch's fused kernels (flash, memory-efficient) take
                # 4-D input only, and its math fallback keeps a float32 [heads, L, L] score
                # matrix per layer (4.3 GiB at 8k tokens); query head i reads key/value head
                # i // groups, as Megatron shares them
                q = query[start:end].transpose(0, 1).unsqueeze(0)
                k, v = (
                    t[start:end].repeat_interleave(groups, dim=1).transpose(0, 1).unsqueeze(0)
                    for t in (key, value)
                )
                o = F.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    is_causal=True,
                    scale=scale,
                    dropout_p=self.attention_dropout.p if self.training else 0.0,
                )
                out[start:end] = o[0].transpose(0, 1).reshape(end - start, -1)
            return out

    return PackedSequenceDotProductAttention


def te_named_local_spec(args: Any, config: Any, vp_stage: int | None = None) -> Any:
    """Megatron's local GPT layer spec for ``args``, with TE's norm placement and names.

    Raises:
        ValueError: the model has experts or multi-latent attention (not covered).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.identity_op import IdentityOp

    if getattr(args, "num_experts", None) or getattr(args, "multi_latent_attention", False):
        raise ValueError(
            "dressage.slime.layer_spec covers dense models only: --num-experts and "
            "--multi-latent-attention need Transformer Engine's own spec"
        )
    spec = copy.deepcopy(
        get_gpt_layer_local_spec(
            qk_layernorm=bool(getattr(args, "qk_layernorm", False)),
            normalization=getattr(args, "normalization", None),
        )
    )
    normed = _normed_linear_cls()
    layer = spec.submodules
    layer.input_layernorm = IdentityOp
    layer.self_attention.submodules.linear_qkv = normed
    layer.pre_mlp_layernorm = IdentityOp
    layer.mlp.submodules.linear_fc1 = normed
    layer.self_attention.submodules.core_attention = _packed_attention_cls()
    layer.sharded_state_dict_keys_map = {}  # the names are the checkpoint's keys already
    return spec
