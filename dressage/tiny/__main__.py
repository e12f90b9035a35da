"""Build the offline assets and print where they are.

    dressage assets                                   # the tokenizers and the default tiny model
    dressage assets --config configs/mopd/embedded.json   # + every tiny:/tiny-sft: model it names
    dressage assets --checkpoint tiny-sft:task=lookup     # + one model (repeatable)

(``python -m dressage.tiny`` is the same.) Tiny teachers (``tiny-sft:``) are trained here, once
(minutes on a CPU; cached by recipe): checkpoint resolution and validation never train one, they
report it as not built. A checkpoint that is a plain folder is never built, only named.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dressage.assets import QWEN_VOCABS, qwen_tokenizer_dir
from dressage.commands import command_parser
from dressage.tiny import tiny_model_dir
from dressage.tiny.checkpoints import build_checkpoints, is_built_spec

__all__ = ["main", "main_argv"]


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "python -m dressage.tiny",
        description="Build the offline tokenizers, the tiny model and tiny teachers (cached).",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="CONFIG",
        help="a MOPD config: also build every tiny:/tiny-sft: checkpoint it names (repeatable)",
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="SPEC",
        help="also build this tiny:/tiny-sft: spec (repeatable)",
    )
    return p


def _specs(
    parser: argparse.ArgumentParser, configs: Sequence[str], given: Sequence[str]
) -> list[str]:
    from dressage.config.mopd import MopdConfigError, load_mopd_config

    specs = list(given)
    for path in configs:
        try:
            specs += load_mopd_config(path).built_specs()
        except MopdConfigError as exc:
            parser.error(str(exc))
    for spec in specs:
        if not is_built_spec(spec):
            parser.error(f"--checkpoint {spec!r}: not a tiny: or tiny-sft: spec")
    return list(dict.fromkeys(specs))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    specs = _specs(parser, args.config, args.checkpoint)
    for vocab in QWEN_VOCABS:
        print(f"tokenizer {vocab}: {qwen_tokenizer_dir(vocab)}")
    print(f"tiny model: {tiny_model_dir()}")
    for spec, outcome in zip(specs, build_checkpoints(specs), strict=True):
        if isinstance(outcome, ValueError):  # a malformed spec: its key and value are in it
            parser.error(str(outcome))
        print(f"{spec}: {outcome}", flush=True)
    return 0


def main_argv(argv: Sequence[str]) -> int:
    """``dressage assets ...`` (the CLI hands the rest of its argv)."""
    return main(argv)


if __name__ == "__main__":
    sys.exit(main())
