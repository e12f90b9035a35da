"""MopdDataSource: slime's DataSource surface over weighted JSONL datasets."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.rollout.data_source import MopdDataSource, SmoothWeightedRoundRobin
from dressage.types import Sample

pytestmark = pytest.mark.unit


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def datasets(tmp_path: Path) -> list[dict[str, Any]]:
    calc = [
        {"input": f"{i}+{i}=?", "label": 2 * i, "metadata": {"task": "calculator"}}
        for i in range(5)
    ]
    lookup = [{"input": f"capital of {c}?", "label": c.upper(), "id": f"cap-{c}"} for c in "abc"]
    return [
        {
            "name": "calc",
            "path": _write(tmp_path / "calc.jsonl", calc),
            "teacher_id": "t-math",
            "weight": 2,
        },
        {
            "name": "lookup",
            "path": _write(tmp_path / "lookup.jsonl", lookup),
            "teacher_id": "t-facts",
            "weight": 1,
            "agent_mode": "whitebox",
            "generate_function_path": "my.agents.generate",
        },
    ]


def _args(datasets: Any, **extra: Any) -> SimpleNamespace:
    values = {"dressage_datasets": datasets, "n_samples_per_prompt": 3, **extra}
    return SimpleNamespace(**values)


def test_groups_indices_and_metadata(datasets: list[dict[str, Any]]) -> None:
    source = MopdDataSource(_args(datasets))
    assert len(source) == 8
    groups = source.get_samples(3)
    assert [len(g) for g in groups] == [3, 3, 3]
    assert [s.group_index for g in groups for s in g] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [s.index for g in groups for s in g] == list(range(9))
    assert all(s.rollout_id is None for g in groups for s in g)
    first, second = groups[0][0], groups[1][0]  # weights 2:1 -> calc, lookup, calc
    assert first.prompt == "0+0=?" and first.label == "0"
    assert first.metadata == {
        "task": "calculator",
        "instance_id": "calc:1",
        "dataset": "calc",
        "source_name": "calc",
        "agent_mode": "blackbox",
        "teacher_id": "t-math",
    }
    assert first.generate_function_path is None
    assert second.metadata["instance_id"] == "cap-a" and second.label == "A"
    assert second.metadata["agent_mode"] == "whitebox"
    assert second.generate_function_path == "my.agents.generate"
    groups[0][0].metadata["x"] = 1  # copies are independent
    assert "x" not in groups[0][1].metadata


def test_weighted_interleave_is_smooth_and_exact_per_cycle() -> None:
    rr = SmoothWeightedRoundRobin({"a": 2, "b": 1})
    assert [rr.next() for _ in range(6)] == ["a", "b", "a", "a", "b", "a"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.integers(1, 3))
def test_each_cycle_follows_the_weights_exactly(weights: list[int], cycles: int) -> None:
    rr = SmoothWeightedRoundRobin({f"d{i}": w for i, w in enumerate(weights)})
    picks = Counter(rr.next() for _ in range(sum(weights) * cycles))
    assert picks == {f"d{i}": w * cycles for i, w in enumerate(weights)}


def _sequence(source: MopdDataSource, groups: int) -> list[tuple[Any, ...]]:
    return [
        (g[0].metadata["instance_id"], g[0].group_index, g[0].index)
        for g in source.get_samples(groups)
    ]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resumed_run_continues_the_same_sequence(
    datasets: list[dict[str, Any]], tmp_path: Path, shuffle: bool
) -> None:
    opts = {"rollout_shuffle": shuffle, "rollout_seed": 7, "save": str(tmp_path / "ck")}
    reference = MopdDataSource(_args(datasets, **opts))
    expected = _sequence(reference, 30)  # several epochs of both datasets

    first = MopdDataSource(_args(datasets, **opts))
    head = _sequence(first, 11)
    first.save(rollout_id=4)
    first.save(rollout_id=2)
    resumed = MopdDataSource(_args(datasets, load=str(tmp_path / "ck"), **opts))
    resumed.load()  # the latest saved state: rollout 4
    assert head + _sequence(resumed, 19) == expected
    again = MopdDataSource(_args(datasets, load=str(tmp_path / "ck"), **opts))
    again.load(rollout_id=4)
    assert _sequence(again, 19) == expected[11:]
    if shuffle:  # a reshuffled epoch differs from file order, deterministically
        ids = [e[0] for e in expected if e[0].startswith("calc")]
        assert ids[:5] != [f"calc:{i}" for i in range(1, 6)] or ids[5:10] != ids[:5]


def test_load_without_state_is_a_no_op(datasets: list[dict[str, Any]], tmp_path: Path) -> None:
    source = MopdDataSource(_args(datasets, load=str(tmp_path / "empty")))
    source.load()
    source.load(rollout_id=3)
    assert _sequence(source, 1)[0][1:] == (0, 0)


def test_state_of_other_datasets_is_refused(datasets: list[dict[str, Any]], tmp_path: Path) -> None:
    source = MopdDataSource(_args(datasets, save=str(tmp_path)))
    source.save(1)
    other = MopdDataSource(_args(datasets[:1], load=str(tmp_path)))
    with pytest.raises(ValueError, match="cannot be resumed"):
        other.load(1)


def test_buffered_groups_come_first(datasets: list[dict[str, Any]]) -> None:
    source = MopdDataSource(_args(datasets))
    [held] = source.get_samples(1)
    source.add_samples([held])
    assert source.get_samples(2)[0] is held
    with pytest.raises(ValueError, match="group 0 has 1 entries, expected n_samples_per_prompt=3"):
        source.add_samples([[Sample()]])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weight": 0}, "dataset 'calc': weight must be > 0, got 0"),
        ({"weight": -1.5}, "dataset 'calc': weight must be > 0"),
        ({"agent_mode": "greybox"}, "dataset 'calc': unknown agent_mode 'greybox'"),
        ({"agent_mode": "whitebox"}, "dataset 'calc': a whitebox dataset needs generate_function"),
        ({"colour": "red"}, "name 'calc'.*colour"),
    ],
)
def test_bad_dataset_entries_name_the_dataset(
    datasets: list[dict[str, Any]], change: dict[str, Any], message: str
) -> None:
    datasets[0].update(change)
    with pytest.raises(ValueError, match=message):
        MopdDataSource(_args(datasets))


def test_bad_rows_and_files_name_the_dataset(
    datasets: list[dict[str, Any]], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="dataset names must be unique"):
        MopdDataSource(_args([datasets[0], datasets[0]]))
    Path(datasets[0]["path"]).write_text('{"input": "x"}\nnot json\n')
    with pytest.raises(ValueError, match="dataset 'calc': .*calc.jsonl:2"):
        MopdDataSource(_args(datasets))
    Path(datasets[0]["path"]).write_text('{"question": "x"}\n')
    source = MopdDataSource(_args(datasets[:1]))
    with pytest.raises(ValueError, match="dataset 'calc' line 1: no prompt under the input key"):
        source.get_samples(1)
    datasets[0]["path"] = str(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="dataset 'calc': .*missing.jsonl does not exist"):
        MopdDataSource(_args(datasets))


def test_json_text_and_slime_prompt_data(datasets: list[dict[str, Any]]) -> None:
    assert len(MopdDataSource(_args(json.dumps(datasets)))) == 8
    plain = SimpleNamespace(prompt_data=datasets[0]["path"], n_samples_per_prompt=1)
    [[sample]] = MopdDataSource(plain).get_samples(1)
    assert sample.metadata["dataset"] == "calc" and "teacher_id" not in sample.metadata


def test_mopd_config_from_the_environment(
    datasets: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "teachers": {"t-math": {"load": str(tmp_path)}, "t-facts": {"load": str(tmp_path)}},
        "datasets": [{**d, "agent_mode": d.get("agent_mode", "blackbox")} for d in datasets],
        "reward_modules": [],
    }
    path = tmp_path / "mopd.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("DRESSAGE_MOPD_CONFIG", str(path))
    source = MopdDataSource(SimpleNamespace(n_samples_per_prompt=1))
    assert [g[0].metadata["teacher_id"] for g in source.get_samples(3)] == [
        "t-math",
        "t-facts",
        "t-math",
    ]
