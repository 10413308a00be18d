"""Bursts judged against the traffic's own rhythm and only over the time a
recorder ran: traffic that comes in batches once a second is not a burst every
second, and the gap between two recording sessions does not make every window
of them one.  On real Spark (the tests' session), with captures and loss logs
written here as ``record`` writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from sbus_relay.pipeline import analyze as A  # noqa: E402
from sbus_relay.pipeline.capture import CAPTURE_SCHEMA  # noqa: E402

from .conftest import SPARK_TEST_TIMEOUT  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(SPARK_TEST_TIMEOUT)]

T0 = 1_700_000_000 * 10**9
S = 10**9


def write(directory: Path, session: str, times: list[int]) -> None:
    """One session's capture file, named as the recorder names them."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {"time_ns": t, "key": f"sensors/temp/{i % 7}", "size": 16, "payload": None,
         "instance": "bus"}
        for i, t in enumerate(sorted(times))
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA)
    pq.write_table(table, directory / f"capture-bus-{session}-20231114T221320-00001.parquet")


def loss_log(directory: Path, session: str, start: int, end: int) -> None:
    lines = [
        {"event": "start", "time_ns": start, "instance": "bus", "drop_query": True},
        {"event": "end", "time_ns": end, "messages": 0, "dropped": 0},
    ]
    path = directory / f"capture-bus-{session}-20231114T221320.loss.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def total_bursts(result: Any) -> set[int]:
    return {r["window_start_ns"] for r in result.tables["bursts"] if r["scope"] == "total"}


def test_batches_once_a_second_are_the_rhythm_not_bursts(spark: Any, tmp_path: Path) -> None:
    # 60 s of 40 messages once a second, sent within 20 ms; at 30 s, ten times as many.
    times = [T0 + s * S + i * 500_000 for s in range(60) for i in range(40)]
    times += [T0 + 30 * S + 5 * S // 100 + i * 50_000 for i in range(360)]
    write(tmp_path / "cap", "1", times)
    loss_log(tmp_path / "cap", "1", T0 - S // 2, T0 + 60 * S)
    result = A.run(spark, [str(tmp_path / "cap")], tmp_path / "out", A.AnalyzeOptions())
    window = result.summary["options"]["window_seconds"]
    assert window >= 1.0, window  # the span alone would give 0.2 s: most windows empty
    assert total_bursts(result) == {T0 + 30 * S // int(window * S) * int(window * S)}


def test_the_gap_between_sessions_does_not_make_every_window_a_burst(
    spark: Any, tmp_path: Path
) -> None:
    cap = tmp_path / "cap"
    later = T0 + 2 * 3600 * S
    planted = []
    for session, start in (("1", T0), ("2", later)):
        # Two minutes at 20 messages a second, and two bursts of 2,000 in a second.
        times = [start + i * S // 20 for i in range(120 * 20)]
        for at in (30, 90):
            times += [start + at * S + i * 400_000 for i in range(2000)]
            planted.append(start + at * S)
        write(cap, session, times)
        loss_log(cap, session, start - S, start + 120 * S)
    result = A.run(spark, [str(cap)], tmp_path / "out", A.AnalyzeOptions())
    w = int(result.summary["options"]["window_seconds"] * S)
    assert total_bursts(result) == {t // w * w for t in planted}
    assert result.summary["recorded_windows"] < result.summary["span_windows"] / 10
