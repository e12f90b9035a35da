"""The ``dressage`` command line.

    dressage artifacts validate URL     # exit 0, or non-zero with the JSON report
    dressage artifacts show URL         # a readable summary of an artifact folder
    dressage engine serve --model PATH  # the embedded SGLang-compatible engine
    dressage proxy serve --engine-url URL  # the recording proxy (same as dressage-proxy)
    dressage mopd check [CONFIG...]     # can this MOPD config train? (config, routes, checkpoints)
    dressage mopd launch ...            # build (and run) slime's MOPD command line
    dressage demo                       # dressage_mopd end to end through Airflow (make demo)
    dressage assets [--config CONFIG]   # build the offline tokenizers, tiny model, tiny teachers
    dressage env                        # every variable the project reads, and its default
    dressage --version

Each subcommand lives in the module that owns it, parses the rest of the command line with its
own argparse parser (``dressage mopd check --help``) and is imported only when it runs, so
``dressage --help`` stays fast and light.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["env_main", "main"]

# command path -> ("module:function", help); each function takes argv (the rest) and returns
# an exit code
_COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("artifacts", "validate"): ("dressage.staging.cli:validate_main", "check an artifact folder"),
    ("artifacts", "show"): ("dressage.staging.cli:show_main", "summarise an artifact folder"),
    ("engine", "serve"): ("dressage.engine.cli:serve_main", "serve the embedded engine"),
    ("proxy", "serve"): ("dressage.proxy.server:main", "serve the recording proxy"),
    ("mopd", "check"): ("dressage.launch.preflight:main", "check MOPD configs"),
    ("mopd", "launch"): ("dressage.launch.slime_command:main", "slime's MOPD command line"),
    ("assets",): ("dressage.tiny.__main__:main", "build the offline assets"),
    ("demo",): ("dressage.airflow.demo:main", "dressage_mopd end to end through Airflow"),
    ("env",): ("dressage.cli:env_main", "list every variable the project reads"),
}


def env_main(argv: Sequence[str]) -> int:
    """``dressage env``: every variable the project reads, its default and meaning."""
    from dressage.commands import command_parser
    from dressage.config.env import OTHER_VARIABLES, all_variables, launcher_variables

    command_parser("dressage env", description=env_main.__doc__).parse_args(argv)
    for var in all_variables():
        print(f"{var.name}={var.default if var.default is not None else ''}\n    {var.doc}")
    print("\n# the MOPD launcher's variables (the names of slime's launch scripts)")
    for name, doc in launcher_variables():
        print(f"{name}=\n    {doc}")
    print("\n# other variables the scripts, make targets, Dockerfiles and libraries read")
    for name, doc in sorted(OTHER_VARIABLES.items()):
        print(f"{name}=\n    {doc}")
    return 0


def _parser() -> argparse.ArgumentParser:
    """Command words only: a leaf takes no options of its own here (``add_help=False``), so
    everything after it, ``--help`` included, reaches its module's parser."""
    from dressage.commands import version

    parser = argparse.ArgumentParser(
        prog="dressage", description="Dressage: train black-box agents on slime."
    )
    printed = f"dressage {version()}"
    parser.add_argument("--version", action="version", version=printed, help="print the version")
    groups = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    nested: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for path, (target, help_text) in _COMMANDS.items():
        if len(path) == 1:
            leaf = groups.add_parser(path[0], help=help_text, add_help=False)
        else:
            if path[0] not in nested:
                group = groups.add_parser(path[0], help=f"{path[0]} commands")
                group.add_argument(
                    "--version", action="version", version=printed, help="print the version"
                )
                nested[path[0]] = group.add_subparsers(
                    dest="subcommand", metavar="SUBCOMMAND", required=True
                )
            leaf = nested[path[0]].add_parser(path[1], help=help_text, add_help=False)
        leaf.set_defaults(target=target)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from dressage.commands import invoked_as

    args, rest = _parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    module, func = str(args.target).split(":")
    words = [w for w in (args.command, getattr(args, "subcommand", None)) if w]
    with invoked_as(" ".join(["dressage", *words])):
        return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
