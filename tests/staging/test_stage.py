"""Staging: verified copies, manifest last, idempotent on retry, nothing half-staged on failure."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dressage.schemas import segments_to_table, train_data_to_table
from dressage.staging import MANIFEST_NAME, ArtifactError, ArtifactWriter, open_artifact
from dressage.staging.checks import check_run_tables, describe_failures
from dressage.staging.stage import StagingError, copy_artifact, stage_run
from tests.staging.factories import segments
from tests.staging.read_only import read_only_folder

pytestmark = pytest.mark.unit


def _train_data(n: int, logprob: float = -0.5) -> dict[str, list[object]]:
    return {
        "tokens": [[1, 2, 3, 4] for _ in range(n)],
        "response_lengths": [2] * n,
        "rewards": [1.0] * n,
        "truncated": [0] * n,
        "sample_indices": list(range(n)),
        "rollout_ids": [0] * n,
        "loss_masks": [[1, 1]] * n,
        "rollout_mask_sums": [2.0] * n,
        "rollout_log_probs": [[logprob, -0.1]] * n,
    }


def _artifact(url: str, n: int = 3, tag: str = "s", logprob: float = -0.5) -> str:
    with ArtifactWriter(url, metadata={"tag": tag}) as w:
        w.write_table("segments", segments_to_table(segments(n, tag, one_session=False)))
        w.write_table("train_data", train_data_to_table(_train_data(n, logprob)))
        w.write_blob("note.txt", b"hello", media_type="text/plain")
    return url


def _output(root: Path, rollouts: int = 2, logprob: float = -0.5) -> Path:
    out = root / "output"
    for i in range(rollouts):
        _artifact(f"file://{out}/artifacts/rollout-{i:05d}", tag=f"r{i}", logprob=logprob)
    (out / "metrics.jsonl").write_text('{"step": 0, "time": 1, "metrics": {"a": 1}}\n')
    (out / "summary.json").write_text('{"steps": 1}')
    return out


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture(params=["file", "memory"])
def dst(request: pytest.FixtureRequest, tmp_path: Path, memory_fs: None) -> str:
    return f"file://{tmp_path}/dst" if request.param == "file" else "memory://staged/dst"


def test_copy_verifies_and_writes_the_same_manifest(tmp_path: Path, dst: str) -> None:
    src = _artifact(f"file://{tmp_path}/src")
    assert copy_artifact(src, dst) == 3  # two tables and a blob
    copied = open_artifact(dst)
    assert copied.verify() == []
    assert copied.manifest == open_artifact(src).manifest
    assert copied.read_table("segments").num_rows == 3
    assert copy_artifact(src, dst) == 0  # a retry finds it staged and does nothing


def test_a_half_copied_destination_is_completed(tmp_path: Path) -> None:
    src = _artifact(f"file://{tmp_path}/src")
    dst = tmp_path / "dst"
    copy_artifact(src, f"file://{dst}")
    (dst / MANIFEST_NAME).unlink()  # as if the copy died before its last write
    victim = next((dst / "segments").iterdir())
    victim.write_bytes(b"torn")
    with pytest.raises(ArtifactError):
        open_artifact(f"file://{dst}")
    assert copy_artifact(src, f"file://{dst}") == 3
    assert open_artifact(f"file://{dst}").verify() == []


def test_a_different_artifact_at_the_destination_is_never_replaced(tmp_path: Path) -> None:
    dst = _artifact(f"file://{tmp_path}/dst", tag="old")
    before = (tmp_path / "dst" / MANIFEST_NAME).read_bytes()
    src = _artifact(f"file://{tmp_path}/src", tag="new")
    with pytest.raises(StagingError, match="already holds a different artifact"):
        copy_artifact(src, dst)
    assert (tmp_path / "dst" / MANIFEST_NAME).read_bytes() == before


def test_a_corrupt_source_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    src = _artifact(f"file://{tmp_path}/src")
    part = next((tmp_path / "src" / "train_data").iterdir())
    part.write_bytes(part.read_bytes()[:-3] + b"xyz")
    with pytest.raises(StagingError, match="does not match its manifest"):
        copy_artifact(src, f"file://{tmp_path}/dst")
    assert _files(tmp_path / "dst") == []


def test_a_source_without_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(StagingError, match="no _MANIFEST.json"):
        copy_artifact(f"file://{tmp_path}/src", f"file://{tmp_path}/dst")


def test_stage_run_writes_the_run_manifest_last_and_is_idempotent(tmp_path: Path, dst: str) -> None:
    out = _output(tmp_path)
    staged = stage_run(str(out), dst, metadata={"dag_id": "d", "run_id": "r"})
    assert staged.rollouts == ["rollout-00000", "rollout-00001"]
    assert staged.blobs == ["metrics.jsonl", "summary.json"] and staged.files_copied == 8
    run = open_artifact(dst)
    assert run.verify() == []
    assert run.manifest.metadata["run_id"] == "r"
    assert set(run.manifest.metadata["rollouts"]) == set(staged.rollouts)
    assert json.loads(run.read_blob("summary.json")) == {"steps": 1}
    for name, digest in run.manifest.metadata["rollouts"].items():
        assert open_artifact(f"{dst}/{name}").manifest.manifest_sha256 == digest
    again = stage_run(str(out), dst, metadata={"dag_id": "d", "run_id": "r"})
    assert again.already_staged and again.files_copied == 0


def test_stage_run_refuses_a_different_run_and_incomplete_output(tmp_path: Path) -> None:
    out = _output(tmp_path)
    dst = f"file://{tmp_path}/dst"
    stage_run(str(out), dst, metadata={"run_id": "a"})
    with pytest.raises(StagingError, match="already holds a different run"):
        stage_run(str(out), dst, metadata={"run_id": "b"})
    (out / "artifacts" / "rollout-00009").mkdir()
    with pytest.raises(StagingError, match="rollout-00009 has no _MANIFEST.json"):
        stage_run(str(out), f"file://{tmp_path}/other")
    with pytest.raises(StagingError, match="the job wrote no artifact"):
        stage_run(str(tmp_path / "empty"), f"file://{tmp_path}/other")


def test_a_retry_after_a_partial_stage_finishes_the_run(tmp_path: Path) -> None:
    out = _output(tmp_path)
    dst = tmp_path / "dst"
    copy_artifact(f"file://{out}/artifacts/rollout-00000", f"file://{dst}/rollout-00000")
    with pytest.raises(ArtifactError):  # one rollout staged, no run manifest: not a run yet
        open_artifact(f"file://{dst}")
    staged = stage_run(str(out), f"file://{dst}")
    assert staged.files_copied == 5 and open_artifact(f"file://{dst}").verify() == []


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    with read_only_folder(tmp_path / "read-only") as folder:
        yield folder


def test_a_read_only_destination_fails_clearly_and_holds_nothing(
    tmp_path: Path, read_only_dir: Path
) -> None:
    out = _output(tmp_path)
    with pytest.raises(StagingError, match="cannot write to file://.*read-only/run"):
        stage_run(str(out), f"file://{read_only_dir}/run")
    assert list(read_only_dir.iterdir()) == []


def test_checks_store_a_report_beside_the_run(tmp_path: Path) -> None:
    good = stage_run(str(_output(tmp_path / "a")), f"file://{tmp_path}/good")
    report = check_run_tables(good.url, "train_data", vocab_size=100)
    assert report["ok"] and report["rows"] == 6
    stored = json.loads((tmp_path / "good/checks/train_data.json").read_text())
    assert stored["ok"] and stored["report_url"].endswith("/checks/train_data.json")

    bad = stage_run(str(_output(tmp_path / "b", logprob=0.5)), f"file://{tmp_path}/bad")
    report = check_run_tables(bad.url, "train_data")
    assert not report["ok"]
    text = describe_failures(report)
    assert "rollout-00000: logprobs_finite_nonpositive[rollout_log_probs] fails 3 row(s)" in text
    assert json.loads((tmp_path / "bad/checks/train_data.json").read_text())["ok"] is False
    tight = check_run_tables(good.url, "segments", vocab_size=4)
    assert not tight["ok"] and "token_ids_below_vocab_size(4)" in describe_failures(tight)


def test_checks_fail_closed_on_missing_tables_and_tampered_rollouts(tmp_path: Path) -> None:
    staged = stage_run(str(_output(tmp_path)), f"file://{tmp_path}/run")
    missing = check_run_tables(staged.url, "samples")
    assert not missing["ok"] and "no table 'samples'" in describe_failures(missing)
    _artifact(f"file://{tmp_path}/elsewhere", tag="other")
    target = tmp_path / "run" / "rollout-00001" / MANIFEST_NAME
    target.write_bytes((tmp_path / "elsewhere" / MANIFEST_NAME).read_bytes())
    tampered = check_run_tables(staged.url, "segments")
    assert "manifest differs from the one the run staged" in describe_failures(tampered)
