"""The ``dressage`` command line.

    dressage artifacts validate URL     # exit 0, or non-zero with the JSON report
    dressage artifacts show URL         # a readable summary of an artifact folder
    dressage engine serve --model PATH  # the embedded SGLang-compatible engine
    dressage proxy serve --engine-url URL  # the recording proxy (same as dressage-proxy)
    dressage mopd check CONFIG          # validate a MOPD config (teachers, datasets, routes)
    dressage mopd launch ...            # build (and run) slime's MOPD command line
    dressage demo                       # dressage_mopd end to end through Airflow (make demo)
    dressage assets                     # build the offline tokenizers and tiny model
    dressage env                        # the DRESSAGE_* variables and their defaults

Each subcommand lives in the module that owns it and is imported only when it runs, so
``dressage --help`` stays fast and light.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# command path -> "module:function"; each function takes argv (the rest) and returns an exit code
_COMMANDS: dict[tuple[str, ...], str] = {
    ("artifacts", "validate"): "dressage.staging.cli:validate_main",
    ("artifacts", "show"): "dressage.staging.cli:show_main",
    ("engine", "serve"): "dressage.engine.cli:serve_main",
    ("proxy", "serve"): "dressage.proxy.server:main",
    ("mopd", "check"): "dressage.config.mopd:main",
    ("mopd", "launch"): "dressage.launch.slime_command:main",
    ("assets",): "dressage.assets.__main__:main_argv",
    ("demo",): "dressage.airflow.demo:main",
    ("env",): "dressage.cli:env_main",
}


def env_main(argv: Sequence[str]) -> int:
    import dressage.proxy.config  # noqa: F401  (declares the DRESSAGE_PROXY_* variables)
    from dressage.config.env import ENV

    for var in sorted(ENV.values(), key=lambda v: v.name):
        print(f"{var.name}={var.default if var.default is not None else ''}\n    {var.doc}")
    return 0


def _usage() -> str:
    lines = ["usage: dressage COMMAND ...", "", "commands:"]
    lines += [f"  dressage {' '.join(path)}" for path in _COMMANDS]
    return "\n".join(lines)


def _resolve(argv: Sequence[str]) -> tuple[Callable[[Sequence[str]], int], Sequence[str]] | None:
    for depth in (2, 1):
        key = tuple(argv[:depth])
        if key in _COMMANDS:
            module, func = _COMMANDS[key].split(":")
            return getattr(importlib.import_module(module), func), argv[depth:]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    found = _resolve(args)
    if found is None:
        print(f"dressage: unknown command {' '.join(args[:2])!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    func, rest = found
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
