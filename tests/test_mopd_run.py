"""dressage.testing.mopd_run: the routing controls it writes (the job itself: tests/e2e)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dressage.config.mopd import load_mopd_config
from dressage.testing.mopd_run import routed_config
from tests.helpers import REPO

pytestmark = pytest.mark.unit

EMBEDDED = REPO / "configs/mopd/embedded.json"


def _routes(path: Path) -> dict[str, str]:
    return {ds["name"]: ds["teacher_id"] for ds in json.loads(path.read_text())["datasets"]}


def test_routings_change_only_who_scores_each_dataset(tmp_path: Path) -> None:
    configured = routed_config(EMBEDDED, "configured", tmp_path)
    assert _routes(configured) == {"calculator": "calculator", "lookup": "lookup"}
    assert _routes(routed_config(EMBEDDED, "swapped", tmp_path)) == {
        "calculator": "lookup",
        "lookup": "calculator",
    }
    one = routed_config(EMBEDDED, "one_teacher", tmp_path)
    assert _routes(one) == {"calculator": "calculator", "lookup": "calculator"}
    assert list(json.loads(one.read_text())["teachers"]) == ["calculator"]
    other = routed_config(EMBEDDED, "one_teacher", tmp_path, teacher="lookup")
    assert other.name == "one_teacher-lookup.json"
    assert _routes(other) == {"calculator": "lookup", "lookup": "lookup"}
    assert list(json.loads(other.read_text())["teachers"]) == ["lookup"]
    for path in (configured, one, other):  # each loads as a valid config from its new folder
        config = load_mopd_config(path)
        assert all(Path(ds.path).is_file() for ds in config.datasets)


def test_a_bad_routing_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="routing 'sideways'"):
        routed_config(EMBEDDED, "sideways", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no teacher 'math'"):
        routed_config(EMBEDDED, "one_teacher", tmp_path, teacher="math")
    with pytest.raises(ValueError, match="routing 'swapped' takes no teacher"):
        routed_config(EMBEDDED, "swapped", tmp_path, teacher="lookup")
    data = json.loads(EMBEDDED.read_text())
    data["datasets"][1]["teacher_id"] = "calculator"
    data["teachers"].pop("lookup")
    single = tmp_path / "single.json"
    single.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="swapping needs exactly two teachers"):
        routed_config(single, "swapped", tmp_path / "out")
