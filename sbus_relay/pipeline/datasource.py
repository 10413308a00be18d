"""The ``sbus`` Spark data source (PySpark Python Data Source API, Spark 4).

What it owns: the sbus Spark data source's reader and writer.  What it may
touch: the bus (through the client library), Spark's streaming API.

    from sbus_relay.pipeline.datasource import register
    register(spark)
    rows = (spark.readStream.format("sbus")
            .option("address", "/run/sbus.socket").option("pattern", "sensors/").load())
    # rows: time_ns long, key string, payload binary
    (df.writeStream.format("sbus").option("address", "/run/sbus.socket")
       .option("checkpointLocation", "/tmp/ckpt").start())      # publishes (key, payload)

Reading (``SbusStreamReader``, a simple stream reader): the reader object lives
on the driver, in Spark's long-lived Python process for the source.  On the
first offset request it starts a daemon thread with a bus client that
subscribes to ``pattern`` and appends each message, stamped with its receive
time, to a bounded in-memory buffer.  ``read(start)`` takes what is buffered
(at most ``maxBatchMessages``) and returns end offset = start + rows taken, so
offsets are message counts and continue from any checkpointed offset.

If the bus goes away (restart, crash), the listener reconnects and resubscribes
on its own, waiting SOURCE_RECONNECT_MIN, doubling up to SOURCE_RECONNECT_MAX between tries.
Each outage is a gap: counted, timed, and logged as a warning with the next
batch; what was published meanwhile is lost.  Only the very first connection
must succeed within READY_TIMEOUT, or the query fails (a wrong address).

Python: importing this module sets ``PYSPARK_PYTHON`` to this interpreter
unless it is set, so a session created afterwards runs its Python workers with
the interpreter that has pyarrow and sbus_relay; ``session()`` does all of it.

Delivery semantics, reading: **at most once**.  The bus keeps nothing (no
persistence, docs/protocol.md): messages published while no query runs are never
seen; messages beyond the buffer bound (``maxBufferMessages``/``maxBufferBytes``)
are dropped and counted (logged as a warning on the next batch); a batch that
Spark must replay after a driver restart (``readBetweenOffsets``) is empty,
because its rows lived only in the dead process.

Writing (``SbusStreamWriter``; also batch ``df.write.format("sbus")``): each
task opens its own client lazily on the executor and publishes every row as
``MSG key\\0payload``.  Delivery is **at least once** from Spark's side: a
retried task or a replayed micro-batch publishes its rows again, and nothing
can be taken back on abort, since messages go out as they are written.  On a
cluster the executors need sbus_relay installed (the client is Python).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)

from .capture import decode_key

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession
    from pyspark.sql.types import StructType

    from sbus_relay.client import Client

log = logging.getLogger("sbus_relay.pipeline.datasource")

#: The format name: ``spark.readStream.format("sbus")``.
FORMAT = "sbus"
#: Rows of the streaming source.
READ_SCHEMA = "time_ns long, key string, payload binary"
#: Default ``maxBufferMessages``: messages held between batches before dropping.
BUFFER_MESSAGES = 100_000
#: Default ``maxBufferBytes``: payload bytes held between batches before dropping.
BUFFER_BYTES = 64 * 1024 * 1024
#: Default ``maxBatchMessages``: rows handed to one micro-batch (bounds its memory).
MICRO_BATCH_MESSAGES = 100_000
#: Receive timeout of the listener thread, seconds: how soon it notices ``stop``.
TICK_SECONDS = 0.25
#: Seconds to wait for the bus to confirm our subscription (whoami round trip).
READY_TIMEOUT = 10.0
#: Send timeout of the sink's client, seconds: a bus blocked this long fails the task.
WRITE_TIMEOUT = 60.0
#: First wait before reconnecting to a bus that went away, seconds.
SOURCE_RECONNECT_MIN = 0.1
#: Longest wait between reconnection attempts, seconds.
SOURCE_RECONNECT_MAX = 5.0

# Spark's Python workers must be this interpreter (it has pyarrow and sbus_relay):
# set before the session's JVM starts, it needs nothing from the user.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def session(app_name: str = "sbus-stream", master: str | None = None) -> SparkSession:
    """A SparkSession (Python workers on this interpreter, UTC) with ``sbus`` registered."""
    from .session import build_session

    spark = build_session(master, app_name=app_name)
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Make ``format("sbus")`` available in ``spark``, and make ``spark`` the
    active session: Spark looks a streaming sink's format up in the active
    session of the calling thread, which another session (one a streaming
    query cloned, one a library made) may have become meanwhile."""
    spark.dataSource.register(SbusDataSource)
    jvm = getattr(spark, "_jvm", None)  # a classic session (Spark Connect has none)
    if jvm is not None:
        jvm.SparkSession.setActiveSession(spark._jsparkSession)


def _address(options: dict[str, str]) -> str:
    """The ``address`` option, else $SBUS_ADDRESS, else the default, as the CLI
    takes them (``addresses.named_address``): an empty one is an error."""
    from sbus_relay.ops.addresses import named_address, parse_address

    address = named_address(options.get("address"))
    parse_address(address)  # a malformed or empty one: said here, in one line
    return address


def _positive(options: dict[str, str], name: str, default: int) -> int:
    value = int(options.get(name, default))
    if value < 1:
        raise ValueError(f"option {name} must be at least 1, got {value}")
    return value


class SbusDataSource(DataSource):
    """``format("sbus")``: options ``address``, ``pattern`` (read), ``keyColumn`` and
    ``payloadColumn`` (write), ``maxBufferMessages``, ``maxBufferBytes``, ``maxBatchMessages``."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``"sbus"``."""
        return FORMAT

    def schema(self) -> str:
        """Rows of the source: receive time (ns), key, payload."""
        return READ_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> SbusStreamReader:
        """The driver-side live reader (at-most-once)."""
        return SbusStreamReader(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> SbusStreamWriter:
        """The streaming sink (at-least-once)."""
        return SbusStreamWriter(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> SbusBatchWriter:
        """The batch sink: ``df.write.format("sbus")``."""
        return SbusBatchWriter(dict(self.options), schema)


class _Listener:
    """The driver-side subscriber thread and its bounded buffer."""

    def __init__(self, address: str, pattern: str, max_messages: int, max_bytes: int) -> None:
        self.address = address
        self.pattern = pattern
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.buffer: deque[tuple[int, str, bytes]] = deque()
        self.buffered_bytes = 0
        self.dropped = 0
        #: outages of the bus connection: (lost at, back at) in ns since the epoch
        self.gaps: list[tuple[int, int]] = []
        #: times the listener has (re)subscribed; 1 after the first connection
        self.connections = 0
        self._connected_since_loss = False
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sbus-source", daemon=True)

    def start(self) -> None:
        """Start the thread and wait until the bus has confirmed the subscription."""
        self.thread.start()
        if not self.ready.wait(READY_TIMEOUT) and self.error is None:
            self.error = TimeoutError(f"no reply from the bus at {self.address}")
        self.check()

    def check(self) -> None:
        """Raise the listener's failure, if any, in the caller (fails the query)."""
        if self.error is not None:
            raise RuntimeError(f"sbus source: {self.error}") from self.error

    def _run(self) -> None:
        from sbus_relay.protocol.errors import BusClosed, SbusError

        wait = SOURCE_RECONNECT_MIN
        lost_at: int | None = None
        while not self.stopping.is_set():
            try:
                self._listen(lost_at)
            except (BusClosed, SbusError, OSError, TimeoutError) as exc:
                if not self.connections:  # never connected: a wrong address, say so
                    self.error = exc
                    self.ready.set()
                    return
                if lost_at is None or self._connected_since_loss:
                    lost_at = time.time_ns()
                    wait = SOURCE_RECONNECT_MIN
                    log.warning("sbus source lost the bus at %s (%s); reconnecting",
                                self.address, exc)  # fmt: skip
                self.stopping.wait(wait)
                wait = min(wait * 2, SOURCE_RECONNECT_MAX)
            except BaseException as exc:  # reported to the query by check()
                self.error = exc
                self.ready.set()
                return

    def _listen(self, lost_at: int | None) -> None:
        """One connection's life: subscribe, confirm, then receive until it ends."""
        from sbus_relay.client import Client

        self._connected_since_loss = False
        # reconnect=False: this loop reconnects itself, and counts each gap
        with Client(self.address, timeout=READY_TIMEOUT, reconnect=False) as client:
            client.subscribe(self.pattern)
            client.whoami()  # the reply means the SUB is in place
            self._connected_since_loss = True
            with self.lock:
                self.connections += 1
                if lost_at is not None:
                    self.gaps.append((lost_at, time.time_ns()))
            self.ready.set()
            while not self.stopping.is_set():
                try:
                    message = client.receive(TICK_SECONDS)
                except TimeoutError:
                    continue
                if not message.control:
                    self._add((time.time_ns(), decode_key(message.key), message.payload))

    def _add(self, row: tuple[int, str, bytes]) -> None:
        size = len(row[2])
        with self.lock:
            if len(self.buffer) >= self.max_messages or self.buffered_bytes + size > self.max_bytes:
                self.dropped += 1  # at-most-once: the bound wins over completeness
                return
            self.buffer.append(row)
            self.buffered_bytes += size

    def take(self, limit: int) -> list[tuple[int, str, bytes]]:
        """Remove and return up to ``limit`` buffered rows, oldest first."""
        with self.lock:
            n = min(limit, len(self.buffer))
            rows = [self.buffer.popleft() for _ in range(n)]
            self.buffered_bytes -= sum(len(r[2]) for r in rows)
            return rows

    def stop(self) -> None:
        """Ask the thread to end (it closes its client) and wait briefly."""
        self.stopping.set()
        self.thread.join(TICK_SECONDS * 4)


class SbusStreamReader(SimpleDataSourceStreamReader):
    """Live bus messages as rows; at-most-once (see the module docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.address = _address(options)
        self.pattern = options.get("pattern", "")
        self.max_buffer_messages = _positive(options, "maxBufferMessages", BUFFER_MESSAGES)
        self.max_buffer_bytes = _positive(options, "maxBufferBytes", BUFFER_BYTES)
        self.max_batch = _positive(options, "maxBatchMessages", MICRO_BATCH_MESSAGES)
        self._listener: _Listener | None = None
        self._dropped_reported = 0
        self._gaps_reported = 0

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to executors for readBetweenOffsets; the
        # thread and socket stay behind (they are opened lazily anyway).
        state = self.__dict__.copy()
        state["_listener"] = None
        return state

    def _ensure_listening(self) -> _Listener:
        if self._listener is None:
            self._listener = _Listener(
                self.address, self.pattern, self.max_buffer_messages, self.max_buffer_bytes
            )
            self._listener.start()
        return self._listener

    def initialOffset(self) -> dict[str, int]:
        """Subscribe (once) and start counting at 0."""
        # Subscribing here, not in __init__: the reader is built before the query
        # starts and may be pickled; only the driver's live instance listens.
        self._ensure_listening()
        return {"seq": 0}

    def read(
        self, start: dict[str, int]
    ) -> tuple[Iterator[tuple[int, str, bytes]], dict[str, int]]:
        listener = self._ensure_listening()
        listener.check()
        rows = listener.take(self.max_batch)
        if listener.dropped != self._dropped_reported:
            log.warning(
                "sbus source dropped %d messages over the buffer bound (%d total)",
                listener.dropped - self._dropped_reported, listener.dropped,
            )  # fmt: skip
            self._dropped_reported = listener.dropped
        with listener.lock:
            gaps = listener.gaps[self._gaps_reported :]
        for lost, back in gaps:
            log.warning(
                "sbus source was away from the bus for %.1f s (gap %d, reconnected); "
                "messages published meanwhile are lost (at most once)",
                (back - lost) / 1e9, self._gaps_reported + 1,
            )  # fmt: skip
            self._gaps_reported += 1
        # iter(list), not a generator: Spark copies the iterator to cache the batch.
        return iter(rows), {"seq": start["seq"] + len(rows)}

    def readBetweenOffsets(
        self, start: dict[str, int], end: dict[str, int]
    ) -> Iterator[tuple[int, str, bytes]]:
        """Replay a batch: always empty, its rows are gone (at-most-once)."""
        # Only a replay after a restart lands here; those rows are gone (at-most-once).
        if start != end:
            log.warning("sbus source cannot replay offsets %s..%s: rows lost", start, end)
        return iter([])

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: ``read`` already handed the rows over to Spark."""

    def stop(self) -> None:
        """Unsubscribe by closing the client (the thread is a daemon anyway)."""
        if self._listener is not None:
            self._listener.stop()
            self._listener = None


@dataclass
class PublishedMessage(WriterCommitMessage):
    """What one write task published."""

    messages: int


class _Publisher:
    """Shared by the streaming and batch writers: rows -> ``MSG key\\0payload``."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.address = _address(options)
        self.key_column = options.get("keyColumn", "key")
        self.payload_column = options.get("payloadColumn", "payload")
        names = set(schema.fieldNames())
        missing = {self.key_column, self.payload_column} - names
        if missing:
            raise ValueError(f"sbus sink needs column(s) {sorted(missing)}; have {sorted(names)}")

    def publish(self, rows: Iterator[Row]) -> PublishedMessage:
        """Publish every row with a key; the client is opened on the first one."""
        client: Client | None = None  # opened lazily, on the executor
        count = 0
        try:
            for row in rows:
                key = row[self.key_column]
                payload = row[self.payload_column]
                if key is None:
                    continue  # a message needs a key; null keys are skipped, not sent as ""
                if client is None:
                    from sbus_relay.client import Client

                    # a lost bus fails the task (Spark retries it): nothing is
                    # left in a buffer when the task ends
                    client = Client(self.address, timeout=WRITE_TIMEOUT, reconnect=False)
                client.publish(key, b"" if payload is None else payload)
                count += 1
        finally:
            if client is not None:
                client.close()
        return PublishedMessage(count)


class SbusStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("sbus")``: publishes each row; at-least-once."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.publisher = _Publisher(options, schema)

    def write(self, iterator: Iterator[Row]) -> PublishedMessage:
        """Publish this task's rows (runs on an executor)."""
        return self.publisher.publish(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: rows were published as they were written."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published messages cannot be recalled; a retry may publish them again."""


class SbusBatchWriter(DataSourceWriter):
    """``df.write.format("sbus").mode("append").save()``: publishes each row once per task run."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.publisher = _Publisher(options, schema)

    def write(self, iterator: Iterator[Row]) -> PublishedMessage:
        """Publish this task's rows (runs on an executor)."""
        return self.publisher.publish(iterator)
