"""Build the default offline assets and print where they are: ``python -m dressage.assets``."""

from __future__ import annotations

import sys

from dressage.assets import QWEN_VOCABS, qwen_tokenizer_dir, tiny_model_dir


def main() -> int:
    for vocab in QWEN_VOCABS:
        print(f"tokenizer {vocab}: {qwen_tokenizer_dir(vocab)}")
    print(f"tiny model: {tiny_model_dir()}")
    return 0


def main_argv(argv: list[str]) -> int:
    return main()


if __name__ == "__main__":
    sys.exit(main())
