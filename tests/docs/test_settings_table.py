"""docs/settings.md is one table of every setting: each launcher flag, each trigger-form Param,
each RUN.json key, each launcher variable and each flag of the proxy and the engine, so that a new
setting cannot be left out of it; and each row's default is the code's (the launcher's fields, the
form's Params, RUN.json's options, the demo's recipe, the agent dispatch's, the proxy's and the
engine's fields), so that a default changed in the code fails here until the table says it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dressage.config.job import ClusterOptions, JobOptions
from dressage.config.proxy import ProxyConfig
from dressage.config.run import MopdRunConfig, MopdRunSettings, TrainRunConfig
from tests.helpers import REPO

pytestmark = pytest.mark.unit

TABLE = (REPO / "docs/settings.md").read_text()
# What the DAG or the launcher fills in itself, never a user.
NOT_SETTINGS = {"objective", "engine_url", "proxy_url", "advanced", "cluster"}


def _named(key: str) -> bool:
    """``key`` is in the table as a key of its own: `key`, `extra.key`, `advanced.key`, ..."""
    return re.search(rf"[`.]{re.escape(key)}\b", TABLE) is not None


def test_every_launcher_flag_and_variable_is_in_the_table() -> None:
    for name in MopdRunConfig.model_fields:
        if name == "extra_args":  # slime's own flags, after --
            assert "after `--`" in TABLE
        elif name not in NOT_SETTINGS:
            assert f"`--{name.replace('_', '-')}" in TABLE, name
    for variable in MopdRunSettings.ENV.values():
        assert f"`{variable}`" in TABLE, variable


def test_every_form_param_is_in_the_table() -> None:
    from dressage.airflow.params import training_params, validation_params

    names = set(training_params(objective="mopd")) | set(validation_params())
    for name in names - NOT_SETTINGS:
        assert f"`{name}`" in TABLE, name


def test_every_run_json_key_is_in_the_table() -> None:
    for name in TrainRunConfig.model_fields:
        if name not in NOT_SETTINGS:
            assert _named(name), name
    for name in set(JobOptions.model_fields) | set(ClusterOptions.model_fields):
        if name not in NOT_SETTINGS:
            assert _named(name), name


# -- one table, and each row's default is the code's --------------------------------------------

COLUMNS = ["setting", "flag", "variable", "Param", "RUN.json", "default", "note"]


def _rows() -> list[dict[str, str]]:
    lines = [line for line in TABLE.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS, header
    rows = []
    for line in lines[2:]:
        cells = [
            cell.strip() for cell in line.strip().removeprefix("|").removesuffix("|").split("|")
        ]
        assert len(cells) == len(COLUMNS), line
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _shown(value: Any) -> set[str]:
    """How the table may write ``value``."""
    if isinstance(value, bool):
        return {"on" if value else "off"}
    if isinstance(value, float):
        exponent = (f"{value:g}", f"{value:.0e}")
        shown = {str(value), *(re.sub(r"e-0*(\d)", r"e-\1", text) for text in exponent)}
        return shown | ({str(int(value))} if value.is_integer() else set())
    if isinstance(value, list) and not value:
        return {"none"}
    text = str(value)
    return {text.removeprefix((REPO).as_uri() + "/")}


def _defaults(row: dict[str, str]) -> list[tuple[str, Any]]:
    """(where, default) of every place the row names, read from the code."""
    import dataclasses

    from pydantic_core import PydanticUndefined

    from dressage.airflow import demo
    from dressage.airflow.params import training_params, validation_params
    from dressage.config.agent_dispatch import AgentDispatchSettings
    from dressage.config.proxy import _flags as proxy_flags
    from dressage.config.run import RaySubmitSettings
    from dressage.engine.cli import _parser as engine_parser
    from dressage.engine.config import EngineConfig

    found: list[tuple[str, Any]] = []

    def field(where: str, model: Any, name: str) -> None:
        info = model.model_fields.get(name)
        if info is not None and info.default not in (None, PydanticUndefined):
            found.append((where, info.default))
        elif info is not None and info.default_factory is not None:
            found.append((where, info.default_factory()))

    proxy = {flag: dest for dest, flag in proxy_flags().items()}
    engine = {o: a.dest for a in engine_parser()._actions for o in a.option_strings}
    engine_fields = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    demo_flags = {o: a.default for a in demo._parser()._actions for o in a.option_strings}
    for name in _names(row["flag"]) if not row["flag"].startswith("slime's") else []:
        if name.startswith("dressage-proxy "):
            field(name, ProxyConfig, proxy[name.split()[1]])
        elif name.startswith("dressage engine serve "):
            value = engine_fields[engine[name.split()[3]]]
            if value not in (None, dataclasses.MISSING):
                found.append((name, value))
        elif name == "dressage demo --steps":
            field(name, demo.DemoSettings, "steps")
        elif name.startswith("dressage demo "):
            found.append((name, demo_flags[name.split()[2]]))
        elif name == "--address":
            field(name, RaySubmitSettings, "address")
        elif name.startswith("--"):
            field(name, MopdRunConfig, name[2:].replace("-", "_"))
    agent = {variable: name for name, variable in AgentDispatchSettings.ENV.items()}
    for name in _names(row["variable"]):
        if name in agent:
            field(name, AgentDispatchSettings, agent[name])
    params = {**training_params(objective="mopd"), **validation_params()}
    recipe = {**demo.EMBEDDED_RECIPE, **demo.EMBEDDED_RECIPE["extra"]}
    for name in _names(row["Param"]) + _names(row["RUN.json"]):
        key = name.removeprefix("extra.").removeprefix("advanced.")
        if key.startswith("cluster."):
            field(name, ClusterOptions, key.removeprefix("cluster."))
        elif name in params and params[name].value is not None:
            found.append((name, params[name].value))
        elif key != name:
            field(name, JobOptions, key)
        if key in recipe and key != "extra":
            found.append((f"the demo's {key}", recipe[key]))
    return found


def test_the_settings_are_one_table() -> None:
    assert TABLE.count("| setting |") == 1
    assert len(_rows()) >= 100


def test_each_row_s_default_is_the_code_s() -> None:
    wrong = []
    for row in _rows():
        words = {w.rstrip(":,") for w in re.findall(r"[\w.:/+-]+", row["default"])}
        for where, value in _defaults(row):
            if not _shown(value) & words:
                wrong.append(
                    f"{row['setting']}: {where} is {value!r}, the table says {row['default']!r}"
                )
    assert not wrong, "\n".join(wrong)


def test_the_proxy_s_and_the_engine_s_settings_each_have_a_row() -> None:
    import dataclasses

    from dressage.config.proxy import PROXY_ENV
    from dressage.config.proxy import _flags as proxy_flags
    from dressage.engine.config import EngineConfig

    flags = {name for row in _rows() for name in _names(row["flag"])}
    variables = {name for row in _rows() for name in _names(row["variable"])}
    for name, flag in proxy_flags().items():
        if name in ProxyConfig.model_fields:
            assert f"dressage-proxy {flag}" in flags, flag
            assert PROXY_ENV[name] in variables, PROXY_ENV[name]
    from dressage.engine.cli import _parser as engine_parser

    options = {a.dest: a.option_strings[0] for a in engine_parser()._actions if a.option_strings}
    defaults = {a.dest: a.default for a in engine_parser()._actions if a.option_strings}
    for f in dataclasses.fields(EngineConfig):
        assert f"dressage engine serve {options[f.name]}" in flags, f.name
        if defaults[f.name] not in (None, False):  # a flag's default is its field's
            assert defaults[f.name] == f.default, f.name


def test_every_variable_in_the_table_is_one_dressage_env_lists() -> None:
    from dressage.config.env import OTHER_VARIABLES, all_variables, launcher_variables

    known = {v.name for v in all_variables()} | set(OTHER_VARIABLES)
    known |= {name for name, _ in launcher_variables()}
    for row in _rows():
        for name in _names(row["variable"]):
            assert name in known, name


KEPT_NAMES = {
    ("--actor-num-nodes", "NUM_NODES"),
    ("--actor-num-gpus-per-node", "NUM_GPUS"),
    ("--dressage-partial-rollout", "DRESSAGE_PROXY_PARTIAL_ROLLOUT"),
    ("--admin-api-key", "DRESSAGE_ENGINE_ADMIN_KEY"),
}
"""A flag and a variable of one row that do not share a stem: names slime's and SGLang's users
already pass (the table's note 11 says which and why)."""


def test_every_flag_and_its_variable_share_a_stem() -> None:
    pairs = set()
    for line in TABLE.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) < 3:
            continue
        flags, variables = re.findall(r"`([^`]+)`", cells[1]), re.findall(r"`([^`]+)`", cells[2])
        if flags and variables and flags[0].split()[-1].startswith("--"):
            flag, variable = flags[0].split()[-1], variables[0]
            if flag.removeprefix("--").replace("-", "_").upper() not in variable:
                pairs.add((flag, variable))
    assert pairs == KEPT_NAMES
    assert all(f"`{flag}`" in TABLE.split("11. **Names kept")[1] for flag, _ in KEPT_NAMES)
