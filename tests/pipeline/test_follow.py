"""``analyze --follow`` on a local Spark: files added while it runs show in the
report; ``kill -9`` and a restart neither count a file twice nor miss one (also
when Spark must run a batch again); only closed capture files are read; and at
the end its tables equal a batch analyze of the same files, byte for byte."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sbus_relay.pipeline import analyze as A
from sbus_relay.pipeline.follow import State

from .conftest import need_java
from .follower import Follower, add_capture, files_in_report

#: Two JVM starts and five batches on a shared machine.
FOLLOW_TEST_TIMEOUT = 600

pytestmark = [pytest.mark.spark, pytest.mark.timeout(FOLLOW_TEST_TIMEOUT)]


def tables(out: Path) -> dict[str, bytes]:
    return {name: (out / name / "part-00000.parquet").read_bytes() for name in A.TABLES}


def test_follow_survives_kill_9_and_equals_a_batch_run(spark: Any, tmp_path: Path) -> None:
    need_java()
    cap, out = tmp_path / "cap", tmp_path / "report"
    checkpoint = State(Path(f"{out}.checkpoint"))
    add_capture(cap, "a", 20_000, seed=1)
    # Not closed capture files: a Parquet file being written, and one of another suffix.
    (cap / "b.parquet.tmp").write_bytes((cap / "a.parquet").read_bytes())
    (cap / "notes.txt").write_text("not a capture")
    with Follower(cap, out) as follower:
        follower.wait_for_files(1)
        add_capture(cap, "b", 30_000, seed=2)
        follower.wait_for_files(2)
        add_capture(cap, "c", 25_000, seed=3)
        follower.kill()  # at once: the batch of c may be anywhere, or not begun
    # And a crash between a batch's state and Spark's commit: that batch runs again.
    last = checkpoint.committed()
    assert last >= 1
    (checkpoint.stream / "commits" / str(last)).unlink()
    (checkpoint.stream / "commits" / f".{last}.crc").unlink(missing_ok=True)
    with Follower(cap, out) as follower:
        follower.wait_for_files(3)
        add_capture(cap, "d", 15_000, seed=4)
        follower.wait_for_files(4)
        lines = follower.stop()
    assert lines and lines[-1].startswith("batch "), lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["messages"] == 20_000 + 30_000 + 25_000 + 15_000
    assert files_in_report(out) == 4
    batch = tmp_path / "batch"
    A.run(spark, [str(cap)], batch, A.AnalyzeOptions())
    assert tables(out) == tables(batch)
    expected = json.loads((batch / "summary.json").read_text())
    assert summary == expected
    assert (out / "report.md").is_file() and (out / "report.html").is_file()


def test_follow_refuses_what_it_cannot_follow(tmp_path: Path) -> None:
    cap = tmp_path / "cap"
    add_capture(cap, "a", 1_000, seed=1)
    import subprocess

    from tests.support import VENV_BIN

    def follow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [os.path.join(VENV_BIN, "sbus-relay"), "analyze", *args, "--follow"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    two = follow(str(cap), str(cap / "a.parquet"), "--out", str(tmp_path / "o"))
    assert two.returncode == 2 and "one capture directory" in two.stderr
    inside = follow(str(cap), "--out", str(tmp_path / "o"), "--checkpoint", str(cap / "c"))
    assert inside.returncode == 2 and "overlaps" in inside.stderr
    # A checkpoint made with other options cannot carry on.
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    (ckpt / "follow.json").write_text(
        json.dumps({"captures": str(cap.resolve()), "depth": 3, "window_seconds": None})
    )
    other = follow(str(cap), "--out", str(tmp_path / "o"), "--checkpoint", str(ckpt))
    assert other.returncode == 2 and "made with depth 3" in other.stderr
    assert not (tmp_path / "o").exists()
    a_file = follow(str(cap / "a.parquet"), "--out", str(tmp_path / "o"))
    assert a_file.returncode == 2 and "is a file" in a_file.stderr
