"""What a new user meets first with ``analyze``: a mistyped directory, a file
given instead of a directory, a failed ``--follow``, the help's placeholders,
the numbering of ``--follow``'s updates.  None of these needs Spark to run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from sbus_relay.pipeline.follow import batches_label  # noqa: E402
from tests.support import VENV_BIN  # noqa: E402

#: Seconds a refused run may take (it starts no Spark).
REFUSED_TIMEOUT = 60

pytestmark = pytest.mark.timeout(REFUSED_TIMEOUT * 2)


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "analyze", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=REFUSED_TIMEOUT,
    )  # fmt: skip


def test_follow_on_a_mistyped_directory_is_refused_with_a_hint(tmp_path: Path) -> None:
    missing = tmp_path / "captrues"
    result = analyze(str(missing), "--out", str(tmp_path / "o"), "--follow")
    assert result.returncode == 2, result.stderr
    assert "no such capture directory" in result.stderr and "record" in result.stderr
    assert not missing.exists()
    assert not (tmp_path / "o.checkpoint").exists()


def test_a_failed_follow_leaves_no_checkpoint_behind(tmp_path: Path) -> None:
    cap = tmp_path / "cap"
    cap.mkdir()
    # Another program's Parquet file: refused once the run has begun.
    pq.write_table(pa.table({"x": [1, 2]}), cap / "other.parquet")
    result = analyze(str(cap), "--out", str(tmp_path / "o"), "--follow")
    assert result.returncode == 2 and "not a capture file" in result.stderr, result.stderr
    assert not (tmp_path / "o.checkpoint").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap"]


def test_a_file_that_is_not_a_capture_is_named_as_such(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a capture")
    result = analyze(str(notes), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert f"{notes} is not a capture file" in result.stderr, result.stderr
    assert "no *.parquet capture files under" not in result.stderr


def test_analyze_help_uses_the_placeholders_of_the_other_commands() -> None:
    done = subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "analyze", "--help"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=REFUSED_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0
    assert "--depth N" in done.stdout and "--top N" in done.stdout
    # No option's destination name shouted as its placeholder.
    assert not re.search(r"\b(DEPTH|TOP|BURST_FACTOR|BURST_MIN_MESSAGES)\b", done.stdout)


def test_every_followed_batch_is_named_once() -> None:
    assert batches_label(-1, 0) == "batch 0"
    assert batches_label(0, 1) == "batch 1"
    # Batches that committed while the previous update ran: named, not skipped.
    assert batches_label(1, 3) == "batches 2-3"
    labels = [batches_label(a, b) for a, b in [(-1, 0), (0, 2), (2, 3), (3, 6)]]
    covered = []
    for label in labels:
        numbers = [int(n) for n in re.findall(r"\d+", label)]
        covered += list(range(numbers[0], numbers[-1] + 1))
    assert covered == list(range(7))
