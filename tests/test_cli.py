"""Every ``python -m`` entry point and ``dressage`` command parses with argparse: ``--help``
answers (exit 0) and a bad command line is an argparse error (exit 2), before any work."""

from __future__ import annotations

import importlib

import pytest

from dressage.cli import main as dressage_main

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
]


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
    assert f"usage: {'dressage-proxy' if argv[0] == 'proxy' else 'dressage ' + argv[0]}" in (
        capsys.readouterr().out
    )


def test_dressage_env_lists_the_proxys_variables(capsys: pytest.CaptureFixture[str]) -> None:
    assert dressage_main(["env"]) == 0
    out = capsys.readouterr().out
    assert "DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC=300\n" in out
    assert "DRESSAGE_ENGINE_ADMIN_KEY=\n" in out and "DRESSAGE_PROXY_MODEL_NAME=dressage\n" in out
