"""The rotating capture writer: schema, rotation by size and age, crash safety."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
import pyarrow.parquet as pq

from sbus_relay.pipeline.capture import (
    CAPTURE_SCHEMA,
    RotatingCaptureWriter,
    capture_files,
    decode_key,
    safe_name,
)

pytestmark = pytest.mark.timeout(60)

INST = "host:/run/sbus.socket"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rows(directory: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for f in capture_files([str(directory)]):
        out += pq.read_table(f).to_pylist()
    return out


def test_rows_round_trip_with_exact_sizes(tmp_path: Path) -> None:
    with RotatingCaptureWriter(tmp_path, instance=INST) as w:
        w.append(1, "a/b", b"")
        w.append(2, "a/c", b"x" * 409_590)
        w.append(3, decode_key(b"bad\xff/key"), b"\x00\x01")
    (f,) = capture_files([str(tmp_path)])
    table = pq.read_table(f)
    assert table.schema.equals(CAPTURE_SCHEMA, check_metadata=False)
    assert pq.read_metadata(f).row_group(0).column(0).compression == "ZSTD"
    assert table.to_pylist() == [
        {"time_ns": 1, "key": "a/b", "size": 0, "payload": b"",
         "instance": INST},
        {"time_ns": 2, "key": "a/c", "size": 409_590, "payload": b"x" * 409_590,
         "instance": INST},
        {"time_ns": 3, "key": "bad\\xff/key", "size": 2, "payload": b"\x00\x01",
         "instance": INST},
    ]  # fmt: skip
    assert not list(tmp_path.glob("*.partial"))


def test_no_payload_keeps_sizes(tmp_path: Path) -> None:
    with RotatingCaptureWriter(tmp_path, instance="i", keep_payload=False) as w:
        w.append(1, "k", b"12345")
    assert rows(tmp_path) == [
        {"time_ns": 1, "key": "k", "size": 5, "payload": None, "instance": "i"}
    ]


def test_rotates_by_size_without_losing_rows(tmp_path: Path) -> None:
    w = RotatingCaptureWriter(
        tmp_path, instance="i", rotate_bytes=50_000, row_group_rows=100, row_group_bytes=1 << 30
    )
    payloads = [os.urandom(1000) for _ in range(500)]  # random: zstd cannot shrink it
    for i, p in enumerate(payloads):
        w.append(i, f"k/{i % 7}", p)
    w.close()
    files = capture_files([str(tmp_path)])
    assert len(files) == 5  # one per 100-row group of ~100 KB, each over 50 KB
    got = rows(tmp_path)
    assert [r["payload"] for r in got] == payloads
    assert [r["time_ns"] for r in got] == list(range(500))
    assert w.stats.files_closed == 5 and w.stats.messages == 500


def test_rotates_by_age_and_on_tick(tmp_path: Path) -> None:
    clock = FakeClock()
    w = RotatingCaptureWriter(tmp_path, instance="i", rotate_seconds=10, clock=clock)
    w.append(1, "a", b"1")
    clock.now += 5
    w.append(2, "a", b"2")
    assert capture_files([str(tmp_path)]) == []  # still open
    clock.now += 6
    w.tick()  # a quiet bus: the file is finished anyway
    assert len(capture_files([str(tmp_path)])) == 1
    w.tick()  # nothing open: no empty file
    w.append(3, "a", b"3")
    clock.now += 11
    w.append(4, "a", b"4")  # over age: this row ends the second file
    assert len(capture_files([str(tmp_path)])) == 2
    w.close()
    assert [r["time_ns"] for r in rows(tmp_path)] == [1, 2, 3, 4]


def test_unfinished_file_is_only_partial(tmp_path: Path) -> None:
    """A crash (no close) leaves a .partial that is not picked up as data."""
    w = RotatingCaptureWriter(tmp_path, instance="i", row_group_rows=2)
    for i in range(5):
        w.append(i, "a", b"x")
    partial = list(tmp_path.glob("*.parquet.partial"))
    assert len(partial) == 1
    assert capture_files([str(tmp_path)]) == []
    w.close()
    assert not list(tmp_path.glob("*.partial"))
    assert len(rows(tmp_path)) == 5


def test_memory_is_bounded_by_row_group(tmp_path: Path) -> None:
    w = RotatingCaptureWriter(tmp_path, instance="i", row_group_rows=10, row_group_bytes=1000)
    for i in range(25):
        w.append(i, "a", b"y" * 300)  # 4 rows reach 1000 bytes
        assert w._buffered_bytes < 1000 + 300 and len(w._times) < 10
    w.close()


def test_names() -> None:
    assert safe_name("host:/run/sbus.socket") == "host_run_sbus.socket"
    assert safe_name("///") == "bus"
    assert len(safe_name("x" * 500)) == 64
    assert decode_key("é/x".encode()) == "é/x"
