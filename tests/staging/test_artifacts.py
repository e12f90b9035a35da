"""Artifacts: round trips on memory:// and file://, the manifest as the only proof of a write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from dressage.cli import main as cli_main
from dressage.schemas import segments_from_table, segments_to_table
from dressage.staging import MANIFEST_NAME, ArtifactError, ArtifactWriter, open_artifact
from dressage.staging.validation import validate_artifact
from tests.helpers import REPO
from tests.staging.factories import segments

pytestmark = pytest.mark.unit


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, tmp_path: Path, memory_fs: None) -> str:
    return "memory://artifacts/run-1" if request.param == "memory" else f"file://{tmp_path}/run-1"


def test_round_trip_tables_and_blobs(url: str) -> None:
    segs = segments(3)
    with ArtifactWriter(url, metadata={"run_id": "r1"}) as w:
        w.write_table("segments", segments_to_table(segs[:2]))
        w.write_table("segments", segments_to_table(segs[2:]))
        w.write_blob("report.json", b'{"ok": true}', media_type="application/json")
    art = open_artifact(url)
    assert art.manifest.metadata == {"run_id": "r1"}
    assert art.manifest.tables["segments"].rows == 3
    assert len(art.manifest.tables["segments"].files) == 2
    assert segments_from_table(art.read_table("segments")) == segs
    assert art.read_blob("report.json") == b'{"ok": true}'
    assert art.verify() == []
    assert validate_artifact(url)["ok"]


def test_writer_error_leaves_no_artifact(url: str) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with ArtifactWriter(url) as w:
            w.write_table("segments", segments_to_table(segments(2)))
            raise RuntimeError("boom")
    with pytest.raises(ArtifactError, match="no _MANIFEST.json"):
        open_artifact(url)


def test_existing_artifact_is_not_overwritten_by_default(url: str) -> None:
    with ArtifactWriter(url) as w:
        w.write_table("segments", segments_to_table(segments(1)))
    with pytest.raises(ArtifactError, match="already holds an artifact"):
        with ArtifactWriter(url) as w:
            pass
    assert open_artifact(url).read_table("segments").num_rows == 1


def test_replace_swaps_atomically_and_cleans_old_files(url: str) -> None:
    with ArtifactWriter(url) as w:
        w.write_table("segments", segments_to_table(segments(1)))
    old = open_artifact(url).manifest.all_paths()
    # a failed replacement keeps the old artifact readable and intact
    with pytest.raises(RuntimeError):
        with ArtifactWriter(url, if_exists="replace") as w:
            w.write_table("segments", segments_to_table(segments(5)))
            raise RuntimeError("killed mid-write")
    assert open_artifact(url).read_table("segments").num_rows == 1
    with ArtifactWriter(url, if_exists="replace") as w:
        w.write_table("segments", segments_to_table(segments(4)))
    art = open_artifact(url)
    assert art.read_table("segments").num_rows == 4
    assert not any(art.fs.exists(f"{art.root}/{p}") for p in old)


def test_checksum_mismatch_is_refused(url: str) -> None:
    with ArtifactWriter(url) as w:
        entry = w.write_table("segments", segments_to_table(segments(2)))
    art = open_artifact(url)
    path = f"{art.root}/{entry.path}"
    data = bytearray(art.fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    with art.fs.open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(ArtifactError, match="checksum mismatch for segments/part-"):
        open_artifact(url).read_table("segments")
    report = validate_artifact(url)
    assert not report["ok"] and "checksum mismatch" in report["errors"][0]


def test_edited_manifest_is_refused(url: str) -> None:
    with ArtifactWriter(url) as w:
        w.write_table("segments", segments_to_table(segments(2)))
    art = open_artifact(url)
    path = f"{art.root}/{MANIFEST_NAME}"
    doc = json.loads(art.fs.cat_file(path))
    doc["tables"]["segments"]["rows"] = 99
    with art.fs.open(path, "wb") as f:
        f.write(json.dumps(doc).encode())
    with pytest.raises(ArtifactError, match="manifest checksum mismatch"):
        open_artifact(url)
    with art.fs.open(path, "wb") as f:
        f.write(b'{"format": "dressage-art')
    with pytest.raises(ArtifactError, match="invalid manifest"):
        open_artifact(url)


def test_bad_table_data_is_reported_by_validate(url: str) -> None:
    table = segments_to_table(segments(2))
    # a gap in segment indices slips past the writer's cast but not the data rules
    table = table.set_column(1, "segment_index", pa.array([0, 5], pa.int32()))
    with ArtifactWriter(url) as w:
        w.write_table("segments", table)
    report = validate_artifact(url)
    assert not report["ok"]
    failures = report["tables"]["segments"]["failures"]
    assert failures[0]["check"] == "segment_indices_contiguous"


def test_write_table_refuses_foreign_columns(url: str) -> None:
    with pytest.raises(ValueError, match=r"missing \['full_logprobs'"):
        with ArtifactWriter(url) as w:
            w.write_table("segments", segments_to_table(segments(1)).drop(["full_logprobs"]))


def test_cli_validate_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    with ArtifactWriter(str(good), metadata={"run_id": "r9"}) as w:
        w.write_table("segments", segments_to_table(segments(2)))
    assert cli_main(["artifacts", "validate", str(good)]) == 0
    assert cli_main(["artifacts", "show", str(good)]) == 0
    out = capsys.readouterr().out
    assert "segments" in out and "run_id: r9" in out and "rows=2" in out
    bad.mkdir()
    assert cli_main(["artifacts", "validate", str(bad)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and "no _MANIFEST.json" in report["errors"][0]


def test_a_writer_killed_before_the_manifest_leaves_nothing_readable(tmp_path: Path) -> None:
    target = tmp_path / "killed"
    script = textwrap.dedent(
        f"""
        import os, signal
        from dressage.schemas import segments_to_table
        from dressage.staging import ArtifactWriter
        from dressage.trajectory import Segment
        seg = Segment("s", 0, [1, 2], [0, 1], [0.0, -1.0], [], "stop", prompt_length=1)
        w = ArtifactWriter({str(target)!r}).__enter__()
        w.write_table("segments", segments_to_table([seg]))
        w._txn.__exit__(None, None, None)       # data files committed, manifest not yet written
        print("data-committed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL and "data-committed" in proc.stdout
    assert any(p.suffix == ".parquet" for p in target.rglob("*"))  # data is there...
    with pytest.raises(ArtifactError, match="not a complete artifact"):
        open_artifact(str(target))  # ...but no reader accepts it
    assert cli_main(["artifacts", "validate", str(target), "--quiet"]) == 1
    assert not os.path.exists(target / MANIFEST_NAME)
