"""The capture writer: schema, rotation by size and age, the journal, recovery, loss logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
import pyarrow.parquet as pq

from sbus_relay.pipeline.capture import (
    CAPTURE_SCHEMA,
    LossLog,
    RotatingCaptureWriter,
    capture_files,
    decode_key,
    is_capture,
    read_journal,
    read_losses,
    recover,
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
    assert is_capture(f)
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
    w.sync()
    assert len(capture_files([str(tmp_path)])) == 1
    w.tick()  # nothing open: no empty file
    w.append(3, "a", b"3")
    clock.now += 11
    w.append(4, "a", b"4")  # over age: this row ends the second file
    w.sync()
    assert len(capture_files([str(tmp_path)])) == 2
    w.close()
    assert [r["time_ns"] for r in rows(tmp_path)] == [1, 2, 3, 4]


def test_rows_reach_the_journal_every_flush_interval(tmp_path: Path) -> None:
    """What a crash would leave: every row of every past flush, in a readable journal."""
    clock = FakeClock()
    w = RotatingCaptureWriter(tmp_path, instance="i", flush_seconds=1.0, clock=clock)
    for i in range(5):
        w.append(i, "a", b"x")
    (journal,) = tmp_path.glob("*.arrow.partial")
    assert capture_files([str(tmp_path)]) == []
    assert sum(b.num_rows for b in read_journal(journal)[0]) == 0  # within the second
    clock.now += 1.0
    w.tick()
    assert sum(b.num_rows for b in read_journal(journal)[0]) == 5
    # A live writer's journal is left alone by recovery.
    assert recover([tmp_path]).in_use == [journal]
    w.close()
    assert not list(tmp_path.glob("*.partial"))
    assert len(rows(tmp_path)) == 5


def test_a_torn_journal_is_recovered_up_to_its_last_whole_batch(tmp_path: Path) -> None:
    w = RotatingCaptureWriter(tmp_path, instance="i", row_group_rows=10)
    for i in range(25):
        w.append(i, "a", b"y" * 100)
    (journal,) = tmp_path.glob("*.arrow.partial")
    size = journal.stat().st_size
    # Simulate a kill: copy the journal as it is now, cut inside its last batch.
    dead = tmp_path / "dead"
    dead.mkdir()
    copy = dead / journal.name
    copy.write_bytes(journal.read_bytes()[: size - 7])
    w.close()
    found = recover([dead])
    assert found.rows == 10 and len(found.converted) == 1
    assert found.line() is not None and "recovered 10 rows" in found.line()  # type: ignore[operator]
    assert [r["time_ns"] for r in rows(dead)] == list(range(10))
    assert not list(dead.glob("*.partial"))
    assert recover([dead]).line() is None  # nothing left to do


def test_loss_log_round_trip(tmp_path: Path) -> None:
    log = LossLog(tmp_path, "capture-a")
    log.write("start", instance="a", drop_query=True)
    log.write("drops", time_ns=5, dropped=3, total=3)
    log.write("drops", time_ns=9, dropped=2, total=5)
    log.write("end", messages=10, dropped=5)
    log.close()
    killed = LossLog(tmp_path, "capture-b")
    killed.write("start", instance="b", drop_query=False)
    killed.close()
    with open(killed.path, "a") as f:
        f.write('{"event": "dro')  # torn by a kill
    s = read_losses(sorted(tmp_path.glob("*.loss.jsonl")))
    assert (s.sessions, s.unfinished, s.unknown, s.dropped) == (2, 1, 1, 5)
    assert s.events == [(5, 3, "a"), (9, 2, "a")]
    assert not s.known and s.as_dict()["dropped"] is None


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
