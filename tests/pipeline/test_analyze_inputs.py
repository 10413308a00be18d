"""analyze reads only captures, never its own output, and replaces its output atomically."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from sbus_relay.pipeline.capture import CAPTURE_SCHEMA  # noqa: E402
from tests.support import VENV_BIN  # noqa: E402

from .conftest import SPARK_TEST_TIMEOUT  # noqa: E402

pytestmark = pytest.mark.timeout(SPARK_TEST_TIMEOUT)

T0 = 1_700_000_000 * 10**9


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "analyze", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SPARK_TEST_TIMEOUT,
    )  # fmt: skip


def capture(path: Path, n: int = 500, key: str = "a/b/c") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"time_ns": T0 + i * 10**8, "key": f"{key}{i % 3}", "size": i % 50, "payload": None,
         "instance": "i"}
        for i in range(n)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA), path, compression="zstd")


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_out_inside_the_captures_is_refused(tmp_path: Path) -> None:
    capture(tmp_path / "cap" / "capture-1.parquet")
    result = analyze(str(tmp_path / "cap"), "--out", str(tmp_path / "cap" / "report"))
    assert result.returncode == 2
    assert "overlaps the input" in one_error_line(result)
    assert not (tmp_path / "cap" / "report").exists()


def test_unrelated_parquet_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "other" / "data.parquet")
    capture(tmp_path / "other" / "capture-1.parquet")
    result = analyze(str(tmp_path / "other"), "--out", str(tmp_path / "report"))
    assert result.returncode == 2
    line = one_error_line(result)
    assert "not a capture file" in line and "data.parquet" in line


def test_an_unreadable_file_is_refused_unless_skipped(tmp_path: Path) -> None:
    capture(tmp_path / "cap" / "capture-1.parquet")
    (tmp_path / "cap" / "capture-2.parquet").write_bytes(b"PAR1 not really parquet")
    result = analyze(str(tmp_path / "cap"), "--out", str(tmp_path / "report"))
    assert result.returncode == 2
    assert "--skip-bad-files" in one_error_line(result)
    result = analyze(
        str(tmp_path / "cap"), "--out", str(tmp_path / "report"), "--skip-bad-files", "--no-report"
    )
    assert result.returncode == 0, result.stderr
    assert "skipped 1 unreadable file" in result.stderr
    assert "analysed 500 messages" in result.stdout


def test_a_failed_run_leaves_the_previous_output_whole(tmp_path: Path) -> None:
    """Second run into the same --out fails in Spark (a corrupt data page): the first
    run's output stays as it was, with nothing of the second mixed in."""
    capture(tmp_path / "cap" / "capture-1.parquet", n=2000)
    out = tmp_path / "report"
    first = analyze(str(tmp_path / "cap"), "--out", str(out), "--no-report")
    assert first.returncode == 0, first.stderr
    # a clean run keeps no Spark log: not in its output, not beside it, not in $TMPDIR
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap", "report"]
    assert not list(out.rglob("*.log"))
    assert not list(Path(tempfile.gettempdir()).glob("sbus-analyze-*"))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    # A file whose footer is fine but whose data is not: only Spark finds out.
    bad = tmp_path / "cap2" / "capture-2.parquet"
    capture(bad, n=20_000, key="x/")
    data = bytearray(bad.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(4, len(data) - footer):  # every data page, not the footer
        data[i] ^= 0x5A
    bad.write_bytes(bytes(data))
    second = analyze(str(tmp_path / "cap"), str(tmp_path / "cap2"), "--out", str(out))
    assert second.returncode == 1, second.stderr
    line = one_error_line(second)
    assert line.startswith("sbus-relay analyze: Spark failed:") and "--skip-bad-files" in line
    # where to look: the JVM's log, kept for the user beside --out (removed here)
    log = Path(line.rsplit("Spark's log: ", 1)[1])
    assert log == tmp_path / "report.spark.log" and log.is_file(), line
    assert "FAILED_READ_FILE" in log.read_text()
    log.unlink()
    assert not list(Path(tempfile.gettempdir()).glob("sbus-analyze-*"))
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_rerun_replaces_the_output(tmp_path: Path) -> None:
    capture(tmp_path / "cap" / "capture-1.parquet", n=100)
    out = tmp_path / "report"
    out.mkdir()
    (out / "stale.txt").write_text("from somewhere else")
    result = analyze(str(tmp_path / "cap"), "--out", str(out), "--no-report")
    assert result.returncode == 2  # not an analyze output: left alone
    assert "not an earlier analyze output" in one_error_line(result)
    (out / "stale.txt").unlink()
    out.rmdir()  # an empty directory is refused too (test below): a new path
    for _ in range(2):
        result = analyze(str(tmp_path / "cap"), "--out", str(out))
        assert result.returncode == 0, result.stderr
    assert (out / "summary.json").exists() and (out / "report.html").exists()
    assert "analysed 100 messages" in result.stdout


def test_an_empty_or_foreign_out_directory_is_refused(tmp_path: Path) -> None:
    """analyze replaces --out as a whole: only a new path or its own earlier output."""
    capture(tmp_path / "cap" / "capture-1.parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = analyze(str(tmp_path / "cap"), "--out", str(empty))
    assert result.returncode == 2
    assert "existing empty directory" in one_error_line(result)
    assert empty.is_dir() and not any(empty.iterdir())
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "summary.json").write_text('{"mine": true}')
    result = analyze(str(tmp_path / "cap"), "--out", str(foreign))
    assert result.returncode == 2
    assert "not an earlier analyze output" in one_error_line(result)
    assert (foreign / "summary.json").read_text() == '{"mine": true}'
