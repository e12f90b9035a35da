"""A Hugging Face checkpoint to Megatron's ``torch_dist`` format and back, through slime's own code.

slime's actor loads its student (``--load``), reference and teachers from Megatron checkpoints.
This converts the project's (or any dense Qwen3/Qwen2/Llama) Hugging Face checkpoints with the
code slime itself runs, one process on one GPU (TP=1)::

    python -m dressage.slime.torch_dist to-torch-dist HF_DIR OUT_DIR
    python -m dressage.slime.torch_dist to-hf TORCH_DIST_DIR HF_DIR OUT_DIR

``to-torch-dist`` builds the model from the flags of :mod:`dressage.slime.model_flags` with slime's
``setup_model_and_optimizer``, fills it with slime's Hugging Face loader (``load_checkpoint`` of a
folder holding a ``config.json``), and writes it with Megatron's ``save_checkpoint`` as iteration
0 (``OUT_DIR/latest_checkpointed_iteration.txt``, ``OUT_DIR/iter_0000000/``). ``to-hf`` loads a
Megatron checkpoint with slime's ``load_checkpoint`` and writes it with slime's
``save_hf_model_to_path`` (the code of its ``--save-hf`` path), with ``HF_DIR``'s config and
tokenizer. Weights travel as the model holds them: slime trains in bf16, so a float32 checkpoint
comes back rounded to bf16, bit for bit. Flags after ``--`` go to Megatron (``--transformer-impl``,
say). Needs CUDA, slime (``SLIME_ROOT``) and Megatron-LM's training code on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dressage.commands import command_parser
from dressage.slime.model_flags import ModelFlagsError, megatron_model_flags

__all__ = ["TRACKER_FILE", "conversion_argv", "main", "megatron_iteration_dir"]

TRACKER_FILE = "latest_checkpointed_iteration.txt"
# What a one-GPU conversion needs of slime's and Megatron's parsers besides the model: no
# rollout (slime skips SGLang's parser), no optimizer (--num-rollout 0), fusions that need
# Transformer Engine or apex off so that the local layer spec builds on any CUDA machine, with
# TE's parameter names (dressage.slime.layer_spec), which slime's converters know.
_RUN_FLAGS = (
    "--debug-train-only",
    "--num-rollout", "0",
    "--rollout-batch-size", "1",
    "--global-batch-size", "1",
    "--micro-batch-size", "1",
    "--tensor-model-parallel-size", "1",
    "--actor-num-gpus-per-node", "1",
    "--transformer-impl", "local",
    "--spec", "dressage.slime.layer_spec", "te_named_local_spec",
    "--no-gradient-accumulation-fusion",
    "--no-rope-fusion",
    "--no-masked-softmax-fusion",
    "--no-persist-layer-norm",
    "--attention-backend", "unfused",
    "--attention-dropout", "0.0",
    "--hidden-dropout", "0.0",
    "--seq-length", "4096",
    "--ckpt-format", "torch_dist",
)  # fmt: skip


def megatron_iteration_dir(root: str | Path) -> Path:
    """The iteration folder a Megatron checkpoint root's tracker file names.

    Raises:
        FileNotFoundError: ``root`` has no tracker file, or the folder it names is missing.
    """
    root = Path(root)
    tracker = root / TRACKER_FILE
    if not tracker.is_file():
        raise FileNotFoundError(f"{tracker} does not exist: {root} is not a Megatron checkpoint")
    text = tracker.read_text().strip()
    folder = root / ("release" if text == "release" else f"iter_{int(text):07d}")
    if not folder.is_dir():
        raise FileNotFoundError(f"{tracker} names {folder.name}, which does not exist in {root}")
    return folder


def conversion_argv(hf_dir: str | Path, load: str | Path, extra: Sequence[str] = ()) -> list[str]:
    """slime's command line for a one-GPU conversion of ``hf_dir``'s model loaded from ``load``."""
    argv = [*megatron_model_flags(hf_dir), *_RUN_FLAGS]
    argv += ["--hf-checkpoint", str(hf_dir), "--load", str(load)]
    return argv + list(extra)


def _single_process_world() -> None:
    import torch
    import torch.distributed as dist

    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if not torch.cuda.is_available():
        raise RuntimeError("converting through Megatron needs a CUDA device; none is visible")
    torch.cuda.set_device(0)
    dist.init_process_group(backend="nccl")
    from slime.utils.distributed_utils import init_gloo_group

    init_gloo_group()


def _megatron_model(argv: Sequence[str]) -> tuple[Any, list[Any]]:
    """slime's parsed args and the model chunks, built and loaded from ``--load``."""
    import torch.distributed as dist
    from slime.backends.megatron_utils.checkpoint import load_checkpoint
    from slime.backends.megatron_utils.initialize import init
    from slime.backends.megatron_utils.model import setup_model_and_optimizer
    from slime.utils.arguments import parse_args

    _single_process_world()
    sys.argv = [sys.argv[0], *argv]  # Megatron's parser reads sys.argv
    args = parse_args()
    args.rank, args.world_size = dist.get_rank(), dist.get_world_size()
    init(args)
    model, _, _ = setup_model_and_optimizer(args)
    load_checkpoint(model, None, None, checkpointing_context={}, skip_load_to_model_and_opt=False)
    return args, model


def to_torch_dist(hf_dir: Path, out: Path, extra: Sequence[str] = ()) -> Path:
    """Write ``hf_dir``'s weights as a Megatron checkpoint at ``out``; returns ``out``."""
    argv = conversion_argv(hf_dir, hf_dir, extra)
    from slime.backends.megatron_utils.checkpoint import save_checkpoint

    args, model = _megatron_model(argv)
    args.save = str(out)
    args.no_save_optim = True
    args.no_save_rng = True
    save_checkpoint(0, model, None, None, 0)
    megatron_iteration_dir(out)  # the tracker names a folder that is there
    return out


def to_hf(megatron_dir: Path, hf_dir: Path, out: Path, extra: Sequence[str] = ()) -> Path:
    """Write the Megatron checkpoint at ``megatron_dir`` as a Hugging Face folder at ``out``,
    with ``hf_dir``'s config and tokenizer; returns ``out``."""
    megatron_iteration_dir(megatron_dir)
    argv = conversion_argv(hf_dir, megatron_dir, extra)
    from slime.backends.megatron_utils.hf_checkpoint_saver import save_hf_model_to_path
    from transformers import AutoConfig

    args, model = _megatron_model(argv)
    config = AutoConfig.from_pretrained(str(hf_dir))
    save_hf_model_to_path(args, out, model, model_name=type(config).__name__.lower())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in raw:
        cut = raw.index("--")
        raw, extra = raw[:cut], raw[cut + 1 :]
    parser = command_parser(
        "python -m dressage.slime.torch_dist",
        description=__doc__.split("\n\n")[0],
        epilog="Flags after -- go to the converter as they are.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    a = sub.add_parser("to-torch-dist", help="a Hugging Face folder to a Megatron checkpoint")
    a.add_argument("hf_dir", type=Path, help="the Hugging Face folder to convert")
    a.add_argument("out", type=Path, help="folder of the Megatron (torch_dist) checkpoint")
    b = sub.add_parser("to-hf", help="a Megatron checkpoint to a Hugging Face folder")
    b.add_argument("megatron_dir", type=Path, help="the Megatron (torch_dist) checkpoint")
    b.add_argument("hf_dir", type=Path, help="the Hugging Face folder of the same model")
    b.add_argument("out", type=Path, help="folder of the Hugging Face result")
    ns = parser.parse_args(raw)
    import torch.distributed as dist

    try:
        if ns.command == "to-torch-dist":
            print(to_torch_dist(ns.hf_dir, ns.out, extra))
        else:
            print(to_hf(ns.megatron_dir, ns.hf_dir, ns.out, extra))
    except (ModelFlagsError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(
            f"error: converting needs slime and Megatron-LM's training code importable ({exc})",
            file=sys.stderr,
        )
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
