"""The ``sbus`` Spark data source against a live bus: source, sink, and the reader alone."""

from __future__ import annotations

import pickle
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from sbus_relay.client import Client  # noqa: E402
from sbus_relay.pipeline.datasource import SbusStreamReader, register  # noqa: E402
from sbus_relay.protocol.errors import AddressError  # noqa: E402
from tests.support import BusProcess, start_bus  # noqa: E402

from .conftest import SPARK_TEST_TIMEOUT  # noqa: E402

#: Seconds to wait for messages to show up (on a bus or in a table).
WAIT = 60.0


def wait_for(cond: Callable[[], bool], what: str, step: Callable[[], None] = lambda: None) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        step()
        time.sleep(0.05)


# --- the reader without Spark --------------------------------------------------------


@pytest.mark.timeout(60)
def test_reader_offsets_bound_and_replay(sbusd: BusProcess) -> None:
    reader = SbusStreamReader(
        {"address": sbusd.address, "pattern": "r/", "maxBufferMessages": "5",
         "maxBatchMessages": "3"}
    )  # fmt: skip
    assert pickle.loads(pickle.dumps(reader)).address == sbusd.address  # before listening
    start = reader.initialOffset()
    assert start == {"seq": 0}
    with Client(sbusd.address, timeout=10) as pub:
        for i in range(8):
            pub.publish(f"r/{i}", str(i))
        pub.publish("other", b"x")
    listener = reader._listener
    assert listener is not None
    wait_for(lambda: listener.dropped == 3, "8 messages: 5 buffered, 3 dropped")
    rows, end = reader.read(start)
    assert [(k, p) for _, k, p in list(rows)] == [("r/0", b"0"), ("r/1", b"1"), ("r/2", b"2")]
    assert end == {"seq": 3}
    rows, end2 = reader.read(end)
    assert [k for _, k, _ in rows] == ["r/3", "r/4"] and end2 == {"seq": 5}
    rows, end3 = reader.read(end2)
    assert list(rows) == [] and end3 == end2  # nothing new: the offset stands still
    # A checkpointed offset from an earlier run: numbering continues from it.
    pub2 = Client(sbusd.address, timeout=10)
    pub2.publish("r/late", b"")
    pub2.close()
    wait_for(lambda: bool(listener.buffer), "the late message")
    rows, end4 = reader.read({"seq": 1000})
    assert [k for _, k, _ in rows] == ["r/late"] and end4 == {"seq": 1001}
    assert list(reader.readBetweenOffsets({"seq": 1}, {"seq": 1})) == []
    assert list(reader.readBetweenOffsets({"seq": 0}, {"seq": 3})) == []  # at-most-once
    assert pickle.loads(pickle.dumps(reader))._listener is None  # sockets stay behind
    reader.stop()


@pytest.mark.timeout(60)
def test_reader_survives_a_bus_restart(short_tmp: Path, tmp_path: Path, caplog: Any) -> None:
    """The bus restarts: the source reconnects and resubscribes by itself, and says
    how long it was away; what was published meanwhile is lost (at most once)."""
    address = str(short_tmp / "bus")
    reader = SbusStreamReader({"address": address, "pattern": "r/"})
    with start_bus(tmp_path, "-a", address) as sbusd:
        start = reader.initialOffset()
        listener = reader._listener
        assert listener is not None
        with Client(address, timeout=10) as pub:
            pub.publish("r/before", b"1")
            pub.whoami()
        wait_for(lambda: len(listener.buffer) == 1, "the first message")
        sbusd.stop()
    try:
        time.sleep(0.5)  # away for a while: the listener retries with back-off
        with start_bus(tmp_path, "-a", address):
            wait_for(lambda: listener.connections == 2, "the listener to resubscribe")
            with Client(address, timeout=10) as pub:
                pub.publish("r/after", b"2")
                pub.whoami()
            wait_for(lambda: len(listener.buffer) == 2, "the message after the restart")
            with caplog.at_level("WARNING", logger="sbus_relay.pipeline.datasource"):
                rows, end = reader.read(start)
    finally:
        reader.stop()
    assert [k for _, k, _ in rows] == ["r/before", "r/after"] and end == {"seq": 2}
    assert len(listener.gaps) == 1
    lost, back = listener.gaps[0]
    assert back - lost >= 0.4e9
    assert any("away from the bus" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(30)
def test_an_empty_address_is_refused_not_taken_for_the_default(
    sbusd: BusProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$SBUS_ADDRESS set but empty, or an empty ``address`` option, is said as the
    CLI says it; a set variable is used."""
    monkeypatch.setenv("SBUS_ADDRESS", "")
    with pytest.raises(AddressError, match=r"^\$SBUS_ADDRESS is set but empty"):
        SbusStreamReader({"pattern": "r/"})
    with pytest.raises(AddressError, match="empty address"):
        SbusStreamReader({"address": "", "pattern": "r/"})
    monkeypatch.setenv("SBUS_ADDRESS", sbusd.address)
    assert SbusStreamReader({"pattern": "r/"}).address == sbusd.address


# --- through Spark ---------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_bus_messages_arrive_as_rows(spark: Any, sbusd: BusProcess, tmp_path: Path) -> None:
    register(spark)
    stream = (
        spark.readStream.format("sbus")
        .option("address", sbusd.address)
        .option("pattern", "in/")
        .load()
    )
    assert stream.schema.simpleString() == "struct<time_ns:bigint,key:string,payload:binary>"
    query = (
        stream.writeStream.format("memory")
        .queryName("sbus_in")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        query.processAllAvailable()  # first batch: the reader has subscribed
        sent = [(f"in/{i % 3}/{i}", bytes([i % 256]) * i) for i in range(200)]
        before = time.time_ns()
        with Client(sbusd.address, timeout=10) as pub:
            for key, payload in sent:
                pub.publish(key, payload)
            pub.publish("out/not-matching", b"no")

        def count() -> bool:
            return bool(spark.sql("select count(*) from sbus_in").collect()[0][0] >= len(sent))

        wait_for(count, "rows in the memory sink", step=query.processAllAvailable)
        rows = spark.sql("select * from sbus_in").collect()
    finally:
        query.stop()
    got = sorted(rows, key=lambda r: r["time_ns"])
    assert [(r["key"], bytes(r["payload"])) for r in got] == sent
    assert all(before <= r["time_ns"] <= time.time_ns() for r in got)


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_sink_rows_arrive_at_a_subscriber(spark: Any, sbusd: BusProcess, tmp_path: Path) -> None:
    register(spark)
    rows = [{"key": f"sink/{i}", "payload": f"payload {i}".encode() * (i % 5)} for i in range(150)]
    src = tmp_path / "src"
    src.mkdir()
    schema = pa.schema([("key", pa.string()), ("payload", pa.binary())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), src / "rows.parquet")
    with Client(sbusd.address, timeout=WAIT) as sub:
        sub.subscribe("sink/")
        sub.whoami()
        query = (
            spark.readStream.schema("key string, payload binary")
            .parquet(str(src))
            .writeStream.format("sbus")
            .option("address", sbusd.address)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        got = [sub.receive() for _ in rows]
        with pytest.raises(TimeoutError):
            sub.receive(timeout=0.3)  # nothing twice
    # Tasks run in parallel (local[2]): compare as sets, each message exactly once.
    assert sorted((m.key.decode(), m.payload) for m in got) == sorted(
        (r["key"], r["payload"]) for r in rows
    )


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_batch_write_publishes_and_checks_columns(spark: Any, sbusd: BusProcess) -> None:
    register(spark)
    df = spark.createDataFrame(
        [("b/1", b"one"), ("b/2", None), (None, b"skipped")], "key string, payload binary"
    )
    with Client(sbusd.address, timeout=WAIT) as sub:
        sub.subscribe("b/")
        sub.whoami()
        df.coalesce(1).write.format("sbus").option("address", sbusd.address).mode("append").save()
        got = [sub.receive() for _ in range(2)]
    assert [(m.key, m.payload) for m in got] == [(b"b/1", b"one"), (b"b/2", b"")]
    with pytest.raises(Exception, match="payload"):
        spark.createDataFrame([("k",)], "key string").write.format("sbus").option(
            "address", sbusd.address
        ).mode("append").save()


#: docs/pipeline.md, whose example runs here as written.
PIPELINE_DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"


def documented_example() -> str:
    """docs/pipeline.md's ``# example: datasource`` block."""
    found = re.search(r"```python\n(# example: datasource\n.*?)```", PIPELINE_DOC.read_text(), re.S)
    assert found is not None, "docs/pipeline.md has no '# example: datasource' block"
    return found.group(1)


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_the_documented_example_runs_as_written_with_no_pyspark_python(
    spark: Any, sbusd: BusProcess, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["SBUS_ADDRESS"] = sbusd.address
    script = tmp_path / "example.py"
    script.write_text(documented_example())
    result = subprocess.run(
        [sys.executable, str(script)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=SPARK_TEST_TIMEOUT - 30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"\|\s*sensors/kitchen/temp\s*\|\s*21\.5\s*\|", result.stdout), result.stdout


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_the_sink_is_found_when_another_session_became_active(
    spark: Any, sbusd: BusProcess, tmp_path: Path
) -> None:
    # Spark looks a streaming sink's format up in the thread's active session:
    # one that a streaming query cloned, or a library made, may be it by now.
    other = spark.newSession()
    spark._jvm.SparkSession.setActiveSession(other._jsparkSession)
    register(spark)
    src = tmp_path / "src"
    src.mkdir()
    schema = pa.schema([("key", pa.string()), ("payload", pa.binary())])
    rows = [{"key": f"active/{i}", "payload": b"p"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), src / "rows.parquet")
    with Client(sbusd.address, timeout=WAIT) as sub:
        sub.subscribe("active/")
        sub.whoami()
        query = (
            spark.readStream.schema("key string, payload binary")
            .parquet(str(src))
            .writeStream.format("sbus")
            .option("address", sbusd.address)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        got = sorted(sub.receive().key.decode() for _ in rows)
    assert got == [r["key"] for r in rows]
