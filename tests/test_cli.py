"""Every ``python -m`` entry point and ``dressage`` command parses with argparse: ``--help``
answers (exit 0) and a bad command line is an argparse error (exit 2), before any work."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dressage.cli import main as dressage_main
from dressage.commands import RenamedFlag, version
from tests.helpers import REPO

pytestmark = pytest.mark.unit

ENTRY_POINTS = [
    "dressage.cli",
    "dressage.reporting.curves",
    "dressage.training.checkpoints",
    "dressage.launch.supervisor",
    "dressage.launch.slime_command",
    "dressage.launch.preflight",
    "dressage.airflow.demo",
    "dressage.agents.__main__",
    "dressage.tiny.__main__",
    "dressage.jobs.train",
    "dressage.slime.torch_dist",
    "dressage.slime.model_flags",
    "dressage.tiny.generalist",
    "dressage.proxy.testing",
]


_MARKUP = re.compile(r"``|:[a-z]+:`")
"""Sphinx markup, which argparse shows as it is."""


def _documented_entry_points() -> set[str]:
    """The modules README.md and docs/*.md run as ``python -m MODULE``."""
    text = "\n".join(p.read_text() for p in [REPO / "README.md", *REPO.glob("docs/*.md")])
    return set(re.findall(r"python -m (dressage(?:\.\w+)*)", text))


def test_every_documented_entry_point_is_tested() -> None:
    tested = {m.removesuffix(".__main__") for m in ENTRY_POINTS}
    assert _documented_entry_points() - tested == set()


def _parsers_of(module: str, monkeypatch: pytest.MonkeyPatch) -> list[argparse.ArgumentParser]:
    """The parser ``module``'s main builds, caught as it starts parsing, and its subcommands'."""
    seen: list[argparse.ArgumentParser] = []

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        seen.append(self)
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    with pytest.raises(_Parsed):
        importlib.import_module(module).main(["--help"])
    monkeypatch.undo()
    subs = [a for a in seen[0]._actions if isinstance(a, argparse._SubParsersAction)]
    return [seen[0], *(p for action in subs for p in action.choices.values())]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_names_itself_and_explains_every_argument(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m MODULE``: its usage line says so, ``--version`` answers, and every flag and
    positional (its subcommands' too) has help."""
    top, *subs = _parsers_of(module, monkeypatch)
    name = "dressage" if module == "dressage.cli" else module.removesuffix(".__main__")
    assert top.prog == ("dressage" if name == "dressage" else f"python -m {name}")
    assert any("--version" in a.option_strings for a in top._actions), "no --version"
    for parser in [top, *subs]:
        assert not _MARKUP.findall(parser.format_help()), f"Sphinx markup in {parser.prog}'s help"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.dest == "help":
                continue
            assert action.help and action.help != argparse.SUPPRESS, (parser.prog, action.dest)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_answers(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("dressage.reporting.curves", ["only-one.jsonl"]),
        ("dressage.training.checkpoints", ["a.json", "b.json"]),
        ("dressage.launch.supervisor", ["exit.json", "no-separator"]),
        ("dressage.launch.supervisor", ["exit.json", "--"]),
        ("dressage.tiny.__main__", ["--colour", "red"]),
        ("dressage.cli", ["no-such-command"]),
    ],
)
def test_a_bad_command_line_is_an_argparse_error(
    module: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["mopd", "check", "--help"], ["proxy", "serve", "--help"], ["env", "--help"]]
)
def test_a_subcommands_help_is_its_own(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        dressage_main(argv)
    assert info.value.code == 0
    assert f"usage: dressage {argv[0]}" in capsys.readouterr().out


def test_dressage_env_lists_the_proxys_variables(capsys: pytest.CaptureFixture[str]) -> None:
    assert dressage_main(["env"]) == 0
    out = capsys.readouterr().out
    assert "DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC=300\n" in out
    assert "DRESSAGE_ENGINE_ADMIN_KEY=\n" in out
    assert "DRESSAGE_PROXY_SERVED_MODEL_NAME=dressage\n" in out


def _listed(out: str) -> set[str]:
    """The variables `dressage env` printed (``NAME=default`` lines; meanings are indented)."""
    return {line.split("=", 1)[0] for line in out.splitlines() if re.match(r"[A-Z]\w*=", line)}


# Names that look like variables but are not read from the environment.
NOT_VARIABLES = {
    "DRESSAGE_ENGINE_URL": "the engine's ready line on stdout (DRESSAGE_ENGINE_URL=...)",
    "DRESSAGE_KEYS": "a tuple of metadata prefixes in bench/convert.py",
    "DRESSAGE_A": "a made-up variable of a test",
    "DRESSAGE_B": "a made-up variable of a test",
    "DRESSAGE_X": "a made-up variable of a test",
    "DRESSAGE_JOB": "the prefix of DRESSAGE_JOB_MODULE, which some tests leave out",
    "DRESSAGE_ENGINE": "the start of DRESSAGE_ENGINE_ADMIN_KEY in a test's expected message",
}
_NAME = re.compile(r"(?<![A-Za-z0-9_])DRESSAGE_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*])")


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    skip = ("bench/results/", "tests/ui/package-lock.json")
    out = []
    for name in listed:
        path = REPO / name
        if name.startswith(skip) or not path.is_file() or path.suffix in {".png", ".safetensors"}:
            continue
        out.append(path)
    return out


# Names read but not listed by `dressage env`, each with why.
NOT_LISTED = {
    "HOME", "PATH", "PWD", "USER", "TMPDIR", "BASH_SOURCE",  # the shell's and the OS's own
    "AIRFLOW_UID", "POSTGRES_PASSWORD", "AIRFLOW_JWT_SECRET",  # compose.yaml's, containers/.env
    "RAY_AUTH_MODE",  # set by the Makefile and the scripts, for Ray; compose.yaml passes it on
}  # fmt: skip
_ENV_READERS = {"env_str", "env_int", "env_float", "env_bool", "env_secret", "env_given", "getenv"}


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "environ") or (
        isinstance(node, ast.Attribute) and node.attr == "environ"
    )


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _python_reads(source: str) -> set[str]:
    """The variables a Python source reads by a literal name: ``os.environ.get("X")``,
    ``os.environ["X"]`` (read, not assigned), ``os.getenv("X")``, ``"X" in os.environ`` and
    ``env_str("X")`` and its kin."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Name):
                reads = func.id in _ENV_READERS
            else:  # a method: os.getenv, config.env_str, os.environ.get
                attr = getattr(func, "attr", None)
                environ_get = attr == "get" and _is_environ(getattr(func, "value", func))
                reads = attr in _ENV_READERS or environ_get
            name = _literal(node.args[0]) if reads else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            name = _literal(node.slice) if _is_environ(node.value) else None
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            name = _literal(node.left) if _is_environ(node.comparators[0]) else None
        if name:
            found.add(name)
    return found


def _python_sources() -> list[Path]:
    dirs = ("dressage", "scripts", "bench", "dags")
    return [*(p for d in dirs for p in sorted((REPO / d).rglob("*.py"))), REPO / "tests/helpers.py"]


def test_the_python_scan_finds_each_way_of_reading(tmp_path: Path) -> None:
    source = (
        "import os\nfrom os import environ\n"
        "a = os.environ.get('A1'); b = os.environ['A2']; c = os.getenv('A3')\n"
        "d = environ.get('A4'); e = 'A5' in os.environ; f = 'A6' not in environ\n"
        "g = env_str('A7') or env_int('A8') or env_float('A9') or env_bool('A10')\n"
        "h = env_secret('A11') or config.env_given('A12')\n"
        "os.environ['S1'] = '1'; os.environ.setdefault('S2', '1')\n"
        "run(env={**os.environ, 'S3': '1'}); os.environ.update(S4='1')\n"
    )
    assert _python_reads(source) == {f"A{i}" for i in range(1, 13)}


def test_dressage_env_lists_every_variable_the_repository_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every DRESSAGE_* name in any file of the repository (code, scripts, DAGs, tests, docs)
    is a variable `dressage env` lists, or one of NOT_VARIABLES; and so is each launcher
    variable. Every variable that Python in dressage/, scripts/, bench/, dags/ or
    tests/helpers.py reads by its name (see :func:`_python_reads`) is listed too, or one of
    NOT_LISTED. A variable the repository only sets, for a child process or a library
    (``os.environ.setdefault("HF_HUB_OFFLINE", "1")``, ``env={..., "X": ...}``), is no read;
    nor is one read only by a test (tests/helpers.py aside)."""
    assert dressage_main(["env"]) == 0
    listed = _listed(capsys.readouterr().out)
    named: dict[str, str] = {}
    for path in _repository_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for found in _NAME.findall(text):
            named.setdefault(found, str(path.relative_to(REPO)))
    missing = {n: where for n, where in named.items() if n not in listed and n not in NOT_VARIABLES}
    assert not missing, f"named in the repository but not listed by `dressage env`: {missing}"
    for name in ("DRESSAGE_MOPD_SCHEDULE", "DRESSAGE_AIRFLOW_HOME", "DRESSAGE_VENV", "TP_SIZE"):
        assert name in listed
    assert set(NOT_VARIABLES) <= set(named), "NOT_VARIABLES names one the repository dropped"
    read = {}
    for path in _python_sources():
        for name in _python_reads(path.read_text()):
            read.setdefault(name, str(path.relative_to(REPO)))
    missing = {n: where for n, where in read.items() if n not in listed | NOT_LISTED}
    assert not missing, f"read by the repository's Python but not listed: {missing}"


def _shell_reads(text: str, *, makefile: bool = False) -> set[str]:
    """The variables a shell script (or the Makefile) reads: ``$X`` and ``${X...}``, less
    those it assigns itself and never reads as ``${X:-...}`` (its own, not the caller's); in
    the Makefile, ``$(X)`` too, but for the names it assigns."""
    read = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", text))
    assigned = set(re.findall(r"(?m)^\s*(?:export\s+)?([A-Z][A-Z0-9_]*)\s*[:?]?=", text))
    defaulted = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):?[-=]", text))
    if makefile:
        read |= set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", text))
    return read - (assigned - defaulted)


def test_the_shell_scan_keeps_what_a_script_reads_from_its_caller() -> None:
    script = (
        'PYTHON=${PYTHON:-python3}\nVENV="${DRESSAGE_VENV:-.venv}"\nexport HOME_DIR=$VENV\n'
        'echo "$MODEL_ARGS" "$VENV" "${PYTHON}" "$HOME_DIR"\n'
    )
    assert _shell_reads(script) == {"PYTHON", "DRESSAGE_VENV", "MODEL_ARGS"}
    assert _shell_reads("X ?= 1\nY := $(X)\nall:\n\techo $(Y) $(DEMO_ARGS)\n", makefile=True) == {
        "DEMO_ARGS"
    }


def test_dressage_env_lists_what_the_scripts_read(capsys: pytest.CaptureFixture[str]) -> None:
    """What .ci/run, scripts/*.sh, the Makefile and containers/compose.yaml read (``$X``,
    ``${X}``) and the Dockerfiles' build arguments (``ARG X``) are listed by `dressage env`, or
    are NOT_LISTED; Airflow's own settings (``AIRFLOW__*``) are Airflow's to document."""
    assert dressage_main(["env"]) == 0
    listed = _listed(capsys.readouterr().out)
    read: dict[str, str] = {}
    for path in [REPO / ".ci/run", *REPO.glob("scripts/*.sh"), *REPO.glob("containers/*.yaml")]:
        for name in _shell_reads(path.read_text()):
            read.setdefault(name, str(path.relative_to(REPO)))
    for name in _shell_reads((REPO / "Makefile").read_text(), makefile=True):
        read.setdefault(name, "Makefile")
    for path in REPO.glob("containers/*Dockerfile"):
        for name in re.findall(r"(?m)^ARG\s+([A-Za-z_][A-Za-z0-9_]*)", path.read_text()):
            read.setdefault(name, str(path.relative_to(REPO)))
    missing = {
        n: where
        for n, where in read.items()
        if n not in listed | NOT_LISTED and not n.startswith("AIRFLOW__")
    }
    assert not missing, f"read by the scripts but not listed by `dressage env`: {missing}"


@pytest.mark.parametrize("words", [(), ("mopd",), ("proxy",), ("artifacts",)], ids=repr)
def test_dressage_version(words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        dressage_main([*words, "--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"dressage {version()}"


# Each `dressage` command and the module that parses it (the proxy's is dressage-proxy's).
COMMANDS = {
    ("artifacts", "validate"): "dressage.staging.cli",
    ("artifacts", "show"): "dressage.staging.cli",
    ("engine", "serve"): "dressage.engine.cli",
    ("proxy", "serve"): "dressage.config.proxy",
    ("mopd", "check"): "dressage.launch.preflight",
    ("mopd", "launch"): "dressage.launch.slime_command",
    ("assets",): "dressage.tiny.__main__",
    ("demo",): "dressage.airflow.demo",
    ("env",): "dressage.cli",
}


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``dressage WORDS`` builds, caught as it starts parsing."""
    seen: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_known_args
    calls = {"top": 0}

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        if self.prog == "dressage" or calls["top"]:  # the command words, and their subparsers
            calls["top"] += self.prog == "dressage"
            try:
                return real(self, *args, **kwargs)
            finally:
                calls["top"] -= self.prog == "dressage"
        seen.append(self)
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    with pytest.raises(_Parsed):
        dressage_main([*words, "--help"])
    return seen[0]


@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_every_command_names_itself_and_explains_every_flag(
    words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = _parser_of(words, monkeypatch)
    assert parser.prog == " ".join(["dressage", *words])
    options = [a for a in parser._actions if a.option_strings]
    assert any("--version" in a.option_strings for a in options), "no --version"
    text = parser.format_help()
    hidden = []
    for action in options:
        assert action.help and action.help != argparse.SUPPRESS, f"{action.option_strings}"
        shown = parser._get_formatter()._expand_help(action)  # type: ignore[attr-defined]
        if _takes_a_default(action) and action.option_strings[0] not in NO_DEFAULT:
            hidden += [] if "default" in shown.lower() else [(action.option_strings[0], shown)]
    assert not hidden, f"flags that hide their default: {hidden}"
    assert not _MARKUP.findall(text), "Sphinx markup in the help"
    assert "usage: " + parser.prog in text


# Flags with no default to show: unset, the value is absent, not a default's.
NO_DEFAULT = {
    "--engine-api-key": "a key (its help names its variable)",
    "--engine-admin-key": "a key",
    "--admin-key": "a key",
    "--api-key": "a key",
    "--admin-api-key": "a key",
    "--model": "required by `dressage engine serve`",
    "--mopd-config": "required, unless its variable is set",
    "--rollout-num-gpus": "unset: not passed, slime decides",
    "--max-tokens-per-gpu": "unset: not passed (slime's static micro-batches)",
    "--wandb-project": "unset: none (needed with --use-wandb)",
    "--wandb-group": "unset: none",
    "--config": "`dressage assets`: more to build, repeatable",
    "--checkpoint": "`dressage assets`: more to build, repeatable",
}


def _takes_a_default(action: argparse.Action) -> bool:
    """A flag that takes a value (or a --x/--no-x pair), whatever its argparse default: one whose
    default is None (an unset flag falls to a variable) has a real default all the same."""
    flag_only = (
        argparse._HelpAction,
        argparse._VersionAction,
        argparse._StoreTrueAction,
        argparse._StoreFalseAction,
        argparse._StoreConstAction,
        argparse._CountAction,
        RenamedFlag,
    )
    return not isinstance(action, flag_only)


@pytest.mark.parametrize("words", [("proxy", "serve"), ("engine", "serve")], ids=" ".join)
def test_the_serve_commands_print_the_version(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        dressage_main([*words, "--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"dressage {version()}"


def test_the_proxys_flags_show_their_real_defaults_and_variables() -> None:
    """The proxy's argparse defaults are None (an unset flag falls to its variable): each help
    shows the field's default and the variable instead; a key shows its variable only."""
    from dressage.commands import RenamedFlag
    from dressage.config.proxy import PROXY_ENV, ProxyConfig, parser

    flags = [a for a in parser()._actions if a.option_strings and not isinstance(a, RenamedFlag)]
    helps = {a.dest: a.help or "" for a in flags}
    for field, info in ProxyConfig.model_fields.items():
        shown = helps[field]
        assert shown.endswith(f"env {PROXY_ENV[field]})"), (field, shown)
        if field.endswith("key") or info.default is None:
            assert "(default:" not in shown, (field, shown)
        else:
            assert f"(default: {info.default}; env" in shown, (field, shown)
    assert helps["port"].endswith("(default: 8000; env DRESSAGE_PROXY_PORT)")


def test_the_proxys_log_level_has_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from dressage.config.env import all_variables
    from dressage.config.proxy import config_from_argv

    assert "DRESSAGE_PROXY_LOG_LEVEL" in {v.name for v in all_variables()}
    monkeypatch.setenv("DRESSAGE_PROXY_LOG_LEVEL", "DEBUG")
    assert config_from_argv([])[1] == "debug"
    assert config_from_argv(["--log-level", "error"])[1] == "error"


@pytest.mark.parametrize("words", [("proxy", "serve"), ()], ids=["dressage", "dressage-proxy"])
def test_the_proxys_errors_name_the_command_that_ran(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    from dressage.proxy.server import main as proxy_main

    argv = ["--host", "192.0.2.1"]
    status = dressage_main([*words, *argv]) if words else proxy_main(argv)
    assert status == 2
    prog = " ".join(["dressage", *words]) if words else "dressage-proxy"
    assert capsys.readouterr().err.startswith(f"{prog}: host '192.0.2.1' is not a loopback")


@pytest.mark.parametrize(
    ("words", "flag", "shown"),
    [
        (("demo",), "--seed", "(default: 0)"),
        (("mopd", "check"), "--mopd-forward-kl-weight", "(default: 0.0)"),
        (("mopd", "check"), "--mopd-topk", "(default: 16)"),
    ],
)
def test_a_zero_or_computed_default_is_shown(
    words: tuple[str, ...], flag: str, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = _parser_of(words, monkeypatch)
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    assert shown in parser._get_formatter()._expand_help(action)  # type: ignore[attr-defined]
