"""Capture files: the Parquet schema, the crash-safe writer, recovery and the loss log.

What it owns: the capture format, its writer, recovery and the loss log.  What
it may touch: the capture directory.

A capture is a directory of Parquet files (zstd), one row per received message:

    time_ns   int64   receive time, ns since the Unix epoch (``time.time_ns()``)
    key       string  routing key; bytes that are not UTF-8 appear as ``\\xNN``
    size      int32   payload size in bytes (always exact, even with no payload)
    payload   binary  the payload, or null when recorded with ``--no-payload``
    instance  string  the bus instance the recorder was attached to

Every capture file carries the key-value metadata ``sbus_relay.capture = 1``
(CAPTURE_MARKER, CAPTURE_VERSION): ``analyze`` reads no Parquet file without it.

Crash safety: rows first go to a journal, ``<name>.arrow.partial``, an Arrow IPC
stream to which a batch is appended (and handed to the kernel) at least once per
``flush_seconds`` (0.5 s).  A ``kill -9`` therefore loses at most the rows of
the last second, even when a tick comes late, and whatever reached the journal
is readable even without its end.  On rotation the journal is converted into
``<name>.parquet`` in a background thread: written as ``<name>.parquet.tmp``,
fsync'ed, renamed, the directory fsync'ed, and only then is the journal removed.
Its rollup (``rollup``) is written the same way just before, so a capture file
always has one beside it.  The writer holds an exclusive ``flock`` on its
journal for its whole life, so ``recover`` (run by the next ``record`` and by
``analyze``) converts only the journals of dead writers.

Losses: the recorder appends one JSON line per event to ``<session>.loss.jsonl``
(LOSS_SUFFIX) beside the files; see ``LossLog``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .defaults import (
    CAPTURE_SUFFIX,
    FLUSH_SECONDS,
    JOURNAL_SUFFIX,
    LEGACY_PARTIAL_SUFFIX,
    LOSS_SUFFIX,
    ROTATE_BYTES,
    ROTATE_SECONDS,
    TMP_SUFFIX,
)
from .rollup import SCANNED as ROLLUP_SCANNED
from .rollup import roll_up, rollup_path, write_rollup

#: Parquet compression codec: zstd compresses keys and payloads well at low CPU cost.
COMPRESSION = "zstd"
#: Journal (Arrow IPC) compression: lz4 costs the receive loop least.
JOURNAL_COMPRESSION = "lz4"
#: Rows buffered before a batch is appended to the journal, even within the second.
ROW_GROUP_ROWS = 65_536
#: Payload bytes buffered before a batch is appended; bounds memory with big payloads.
ROW_GROUP_BYTES = 32 * 1024 * 1024
#: Rows per Parquet row group when a journal is converted (sets scan granularity).
PARQUET_ROW_GROUP_ROWS = 1_048_576
#: Longest instance-derived part of a file name; keeps names under NAME_MAX.
MAX_NAME_PART = 64
#: Metadata key and value that mark a Parquet file as an sbus capture (format version).
CAPTURE_MARKER = b"sbus_relay.capture"
CAPTURE_VERSION = b"1"

CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("time_ns", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("size", pa.int32(), nullable=False),
        pa.field("payload", pa.binary(), nullable=True),
        pa.field("instance", pa.string(), nullable=False),
    ],
    metadata={CAPTURE_MARKER: CAPTURE_VERSION},
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def decode_key(key: bytes) -> str:
    """A routing key as text: UTF-8, with any other byte escaped as ``\\xNN``.

    Keys are bytes on the wire (docs/protocol.md), Parquet and Spark
    want strings; escaping keeps every key distinct and readable.
    """
    return key.decode("utf-8", "backslashreplace")


def key_array(keys: Sequence[bytes | str]) -> pa.Array:
    """Keys as an Arrow string array: one C-level cast when all are UTF-8 (the usual case)."""
    if keys and isinstance(keys[0], bytes):
        raw = pa.array(keys, pa.binary())
        try:
            return raw.cast(pa.string())
        except pa.ArrowInvalid:
            return pa.array([decode_key(k) for k in keys], pa.string())  # type: ignore[arg-type]
    return pa.array(keys, pa.string())


def safe_name(text: str) -> str:
    """``text`` reduced to characters that are safe in a file name."""
    return _UNSAFE.sub("_", text).strip("_.")[:MAX_NAME_PART] or "bus"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _final_name(journal: Path) -> Path:
    return journal.with_name(journal.name[: -len(JOURNAL_SUFFIX)] + CAPTURE_SUFFIX)


def read_journal(journal: Path) -> tuple[list[pa.RecordBatch], bool]:
    """The complete batches of a journal, and whether its end was cut off (a crash)."""
    batches: list[pa.RecordBatch] = []
    try:
        with pa.OSFile(str(journal), "rb") as f:
            reader = pa.ipc.open_stream(f)
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    return batches, False
    except (pa.ArrowInvalid, OSError, EOFError):
        return batches, True  # a torn last batch: what came before it is whole


def convert_journal(journal: Path) -> tuple[Path | None, int]:
    """Turn ``journal`` into its Parquet file; return (file or None if empty, rows).

    Safe to repeat after a crash at any point: the Parquet file appears (by
    rename, after fsync) before the journal is removed, and a journal whose
    Parquet file already exists is only removed.
    """
    final = _final_name(journal)
    if final.exists():
        journal.unlink(missing_ok=True)
        return final, 0
    batches, _torn = read_journal(journal)
    rows = sum(b.num_rows for b in batches)
    if not rows:
        journal.unlink(missing_ok=True)
        _fsync_dir(journal.parent)
        return None, 0
    # The rollup first: a capture file that exists has its rollup beside it.
    table = pa.Table.from_batches(batches)
    write_rollup(roll_up(table.select(ROLLUP_SCANNED), final.name), rollup_path(final))
    del table
    tmp = final.with_name(final.name + TMP_SUFFIX)
    with pq.ParquetWriter(
        str(tmp), CAPTURE_SCHEMA, compression=COMPRESSION, use_dictionary=["key", "instance"]
    ) as writer:
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        for batch in batches:
            pending.append(batch)
            pending_rows += batch.num_rows
            if pending_rows >= PARQUET_ROW_GROUP_ROWS:
                writer.write_table(pa.Table.from_batches(pending), row_group_size=pending_rows)
                pending, pending_rows = [], 0
        if pending:
            writer.write_table(pa.Table.from_batches(pending), row_group_size=pending_rows)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    journal.unlink()
    _fsync_dir(final.parent)
    return final, rows


@dataclass
class Recovery:
    """What ``recover`` found: journals converted, journals still being written, rows saved."""

    converted: list[Path] = field(default_factory=list)
    in_use: list[Path] = field(default_factory=list)
    unreadable: list[Path] = field(default_factory=list)
    rows: int = 0

    def line(self) -> str | None:
        """One line for the operator, or None when there was nothing to say."""
        parts = []
        if self.converted:
            parts.append(
                f"recovered {self.rows:,} rows from {len(self.converted)} unfinished capture "
                f"file(s) left by a recorder that was killed"
            )
        if self.in_use:
            parts.append(f"{len(self.in_use)} capture file(s) still being recorded (not read)")
        if self.unreadable:
            names = ", ".join(p.name for p in self.unreadable[:3])
            parts.append(f"{len(self.unreadable)} unrecoverable partial file(s) ignored: {names}")
        return "; ".join(parts) or None


def _locked_by_other(path: Path) -> bool:
    """True if a live writer holds the journal's lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock we took
    return False


def recover(paths: Iterable[str | os.PathLike[str]]) -> Recovery:
    """Convert the journals of dead writers under ``paths`` into capture files."""
    result = Recovery()
    for p in map(Path, paths):
        if not p.is_dir():
            continue
        for journal in sorted(p.rglob(f"*{JOURNAL_SUFFIX}")):
            if _locked_by_other(journal):
                result.in_use.append(journal)
                continue
            try:
                final, rows = convert_journal(journal)
            except OSError:
                result.unreadable.append(journal)
                continue
            if final is not None:
                result.converted.append(final)
                result.rows += rows
        # Files of the previous format (a Parquet file without its footer) cannot be read.
        result.unreadable.extend(sorted(p.rglob(f"*{LEGACY_PARTIAL_SUFFIX}")))
    return result


@dataclass
class WriterStats:
    """What the writer has done so far (read by the progress line and tests)."""

    messages: int = 0
    payload_bytes: int = 0
    files_closed: int = 0
    current_file: str = ""


class RotatingCaptureWriter:
    """Append messages; get zstd Parquet files rotated by size and age.

    Rows are buffered in plain lists and appended to the journal as one Arrow
    batch when ``flush_seconds`` have passed, or ROW_GROUP_ROWS rows or
    ROW_GROUP_BYTES of payload are buffered: memory is bounded by that, and a
    crash loses at most the buffer.  Files are opened lazily on the first
    message, so an idle bus leaves no empty files.  One thread appends; the
    conversion of finished journals runs in a background thread.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        instance: str,
        keep_payload: bool = True,
        rotate_bytes: int = ROTATE_BYTES,
        rotate_seconds: float = ROTATE_SECONDS,
        flush_seconds: float = FLUSH_SECONDS,
        row_group_rows: int = ROW_GROUP_ROWS,
        row_group_bytes: int = ROW_GROUP_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rotate_bytes <= 0 or rotate_seconds <= 0 or flush_seconds <= 0:
            raise ValueError("rotation size, rotation age and flush interval must be positive")
        # Created with the first file: a recorder that never records leaves no directory.
        self.directory = Path(directory)
        self.instance = instance
        self.keep_payload = keep_payload
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.flush_seconds = flush_seconds
        self.row_group_rows = row_group_rows
        self.row_group_bytes = row_group_bytes
        self.stats = WriterStats()
        self._clock = clock
        self.prefix = f"capture-{safe_name(instance)}-{os.getpid()}"
        self._seq = 0
        self._fd: int | None = None
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._journal: Path | None = None
        self._opened_at = 0.0
        self._flushed_at = 0.0
        self._times: list[int] = []
        self._keys: list[bytes | str] = []
        self._sizes: list[int] = []
        self._payloads: list[bytes | None] = []
        self._buffered_bytes = 0
        self._converter: _Converter | None = None

    # --- public API ----------------------------------------------------------

    def append(self, time_ns: int, key: str | bytes, payload: bytes) -> None:
        """Record one message; may append a batch to the journal and rotate."""
        if self._writer is None:
            self._open()
        size = len(payload)
        self._times.append(time_ns)
        self._keys.append(key)
        self._sizes.append(size)
        self._payloads.append(payload if self.keep_payload else None)
        self.stats.messages += 1
        self.stats.payload_bytes += size
        self._buffered_bytes += size
        if len(self._times) >= self.row_group_rows or (
            self.keep_payload and self._buffered_bytes >= self.row_group_bytes
        ):
            self.flush()
        self.tick()

    def extend(
        self, times: list[int], keys: list[bytes], sizes: list[int], payloads: list[bytes]
    ) -> None:
        """Record many messages at once (the recorder's fast path; keys as raw bytes)."""
        if not times:
            return
        if self._writer is None:
            self._open()
        n = sum(sizes)
        self._times += times
        self._keys += keys
        self._sizes += sizes
        if self.keep_payload:
            self._payloads += payloads
        else:
            self._payloads += [None] * len(times)
        self.stats.messages += len(times)
        self.stats.payload_bytes += n
        self._buffered_bytes += n
        if len(self._times) >= self.row_group_rows or (
            self.keep_payload and self._buffered_bytes >= self.row_group_bytes
        ):
            self.flush()
        self.tick()

    def tick(self) -> None:
        """Append what is buffered once a flush is due, rotate an old or big journal.

        Call it at least every ``flush_seconds``: that bounds what a crash loses.
        """
        if self._writer is None:
            return
        now = self._clock()
        if now - self._flushed_at >= self.flush_seconds:
            self.flush()
        if now - self._opened_at >= self.rotate_seconds or (
            self._sink is not None and self._sink.tell() >= self.rotate_bytes
        ):
            self.rotate()

    def flush(self) -> None:
        """Append the buffered rows to the journal as one batch and hand it to the kernel."""
        self._flushed_at = self._clock()
        if not self._times or self._writer is None or self._sink is None:
            return
        n = len(self._times)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self._times, pa.int64()),
                key_array(self._keys),
                pa.array(self._sizes, pa.int32()),
                pa.array(self._payloads, pa.binary())
                if self.keep_payload
                else pa.nulls(n, pa.binary()),
                pa.repeat(pa.scalar(self.instance, pa.string()), n),
            ],
            schema=CAPTURE_SCHEMA,
        )
        self._writer.write_batch(batch)
        self._sink.flush()  # into the page cache: survives the death of this process
        self._times = []
        self._keys = []
        self._sizes = []
        self._payloads = []
        self._buffered_bytes = 0

    def rotate(self) -> None:
        """Finish the open journal (if any): it becomes a Parquet file in the background."""
        if self._writer is None or self._sink is None or self._journal is None:
            return
        self.flush()
        self._writer.close()
        self._sink.close()
        if self._converter is None:
            self._converter = _Converter(self.stats)
        # The converter closes the descriptor (releasing the lock) once it is done.
        assert self._fd is not None
        self._converter.submit(self._journal, self._fd)
        self._writer = None
        self._sink = None
        self._journal = None
        self._fd = None
        self.stats.current_file = ""

    def sync(self) -> None:
        """Wait until every finished journal is a Parquet file (the open one stays)."""
        if self._converter is not None:
            self._converter.jobs.join()

    def close(self) -> None:
        """Finish the open journal and wait until every journal is a Parquet file."""
        self.rotate()
        if self._converter is not None:
            self._converter.finish()
            self._converter = None

    def __enter__(self) -> RotatingCaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self._journal = self.directory / f"{self.prefix}-{stamp}-{self._seq:05d}{JOURNAL_SUFFIX}"
        # Our own descriptor holds the lock that tells recover() this journal is alive.
        self._fd = os.open(self._journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._sink = pa.OSFile(str(self._journal), "wb")
        self._writer = pa.ipc.new_stream(
            self._sink,
            CAPTURE_SCHEMA,
            options=pa.ipc.IpcWriteOptions(compression=JOURNAL_COMPRESSION),
        )
        self._sink.flush()
        self._opened_at = self._flushed_at = self._clock()
        self.stats.current_file = str(self._journal)


class _Converter:
    """The background thread that turns finished journals into Parquet files."""

    def __init__(self, stats: WriterStats) -> None:
        self.stats = stats
        self.jobs: queue.Queue[tuple[Path, int] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="capture-convert", daemon=True)
        self.thread.start()

    def submit(self, journal: Path, fd: int) -> None:
        if self.error is not None:
            raise self.error
        self.jobs.put((journal, fd))

    def finish(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            journal, fd = job
            try:
                if self.error is None:
                    final, _ = convert_journal(journal)
                    if final is not None:
                        self.stats.files_closed += 1
            except BaseException as exc:  # raised in the writer's thread on its next use
                self.error = exc
            finally:
                os.close(fd)
                self.jobs.task_done()
        self.jobs.task_done()


def capture_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Parquet files under ``paths`` (files or directories), sorted; not yet checked."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(f for f in p.rglob(f"*{CAPTURE_SUFFIX}") if f.is_file())
        elif p.name.endswith(CAPTURE_SUFFIX):
            found.append(p)
    return sorted(found)


def is_capture(path: str | os.PathLike[str]) -> bool:
    """True if the Parquet file carries the capture marker of a version we read.

    Raises ``OSError`` or ``pyarrow.ArrowInvalid`` when the file is not readable Parquet.
    """
    meta = pq.read_schema(str(path)).metadata or {}
    return meta.get(CAPTURE_MARKER) == CAPTURE_VERSION


# --- the loss log -------------------------------------------------------------


class LossLog:
    """``<session>.loss.jsonl``: what the recorder knows about messages it did not get.

    One JSON object per line, appended and flushed as it happens (so a killed
    recorder leaves a readable log):

    - ``{"event": "start", "time_ns", "instance", "drop_query": true|false}``:
      whether the bus answers the drop query (false: losses are unknown);
    - ``{"event": "drops", "time_ns", "dropped", "total"}``: the bus dropped
      ``dropped`` more messages for the recorder (``total`` since it connected);
    - ``{"event": "end", "time_ns", "messages", "dropped"}``: a clean stop.
    """

    def __init__(self, directory: Path, prefix: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.path = directory / f"{prefix}-{stamp}{LOSS_SUFFIX}"
        directory.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (lives with us)

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time_ns": fields.pop("time_ns", time.time_ns()), **fields}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()


@dataclass
class LossSummary:
    """Losses over all recorder sessions of a capture (``read_losses``)."""

    sessions: int = 0
    unfinished: int = 0  # sessions with no end line: the recorder was killed
    unknown: int = 0  # sessions on a bus that does not answer the drop query
    dropped: int = 0
    events: list[tuple[int, int, str]] = field(default_factory=list)  # (time_ns, dropped, inst)
    #: When each session recorded: (start, end) in ns.  A killed session ends at
    #: the last row of its files (``session_prefix``), or its start without any.
    intervals: list[tuple[int, int]] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return self.unknown == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "unfinished_sessions": self.unfinished,
            "sessions_without_drop_query": self.unknown,
            "dropped": self.dropped if self.known else None,
            "dropped_at_least": self.dropped,
            "events": [{"time_ns": t, "dropped": d, "instance": i} for t, d, i in self.events],
        }


def loss_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Loss logs under ``paths`` (directories searched recursively), sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(p.rglob(f"*{LOSS_SUFFIX}"))
        elif p.name.endswith(LOSS_SUFFIX):
            found.append(p)
    return sorted(found)


def session_prefix(path: Path) -> str:
    """The recorder session a capture file or loss log belongs to:
    ``capture-<instance>-<pid>`` (RotatingCaptureWriter.prefix)."""
    name = path.name
    if name.endswith(LOSS_SUFFIX):
        return name[: -len(LOSS_SUFFIX)].rsplit("-", 1)[0]
    return name.rsplit("-", 2)[0]


def read_losses(files: Iterable[Path], last_ns: dict[str, int] | None = None) -> LossSummary:
    """Sum the loss logs; a torn last line (a killed recorder) is skipped.
    ``last_ns`` gives the last receive time per session prefix, for the end of
    a session that was killed."""
    s = LossSummary()
    for f in files:
        instance = ""
        ended = started = False
        start_ns = end_ns = None
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            event = rec.get("event")
            if event == "start":
                started = True
                start_ns = int(rec.get("time_ns", 0))
                instance = str(rec.get("instance", ""))
                if not rec.get("drop_query"):
                    s.unknown += 1
            elif event == "drops":
                s.dropped += int(rec["dropped"])
                s.events.append((int(rec["time_ns"]), int(rec["dropped"]), instance))
            elif event == "end":
                ended = True
                end_ns = int(rec.get("time_ns", 0))
        if started and start_ns is not None:
            s.sessions += 1
            s.unfinished += not ended
            if end_ns is None:
                end_ns = max(start_ns, (last_ns or {}).get(session_prefix(f), start_ns))
            s.intervals.append((start_ns, end_ns))
    s.events.sort()
    return s
