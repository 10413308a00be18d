"""Capture files: the Parquet schema and the crash-safe rotating writer.

A capture is a directory of Parquet files (zstd), one row per received message:

    time_ns   int64   receive time, ns since the Unix epoch (``time.time_ns()``)
    key       string  routing key; bytes that are not UTF-8 appear as ``\\xNN``
    size      int32   payload size in bytes (always exact, even with no payload)
    payload   binary  the payload, or null when recorded with ``--no-payload``
    instance  string  the bus instance the recorder was attached to

Crash safety: a file is written as ``<name>.parquet.partial`` and renamed to
``<name>.parquet`` only after its footer is written and it is fsync'ed.  Readers
(``analyze``) take ``*.parquet`` only, so a crash or kill -9 never leaves a
half-written file that looks like data; it loses at most the open file.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .defaults import CAPTURE_SUFFIX, PARTIAL_SUFFIX, ROTATE_BYTES, ROTATE_SECONDS

#: Parquet compression codec: zstd compresses keys and payloads well at low CPU cost.
COMPRESSION = "zstd"
#: Rows buffered before a row group is written; bounds memory and sets scan granularity.
ROW_GROUP_ROWS = 65_536
#: Payload bytes buffered before a row group is written; bounds memory with big payloads.
ROW_GROUP_BYTES = 32 * 1024 * 1024
#: Longest instance-derived part of a file name; keeps names under NAME_MAX.
MAX_NAME_PART = 64

CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("time_ns", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("size", pa.int32(), nullable=False),
        pa.field("payload", pa.binary(), nullable=True),
        pa.field("instance", pa.string(), nullable=False),
    ],
    metadata={b"sbus_relay.capture": b"1"},
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def decode_key(key: bytes) -> str:
    """A routing key as text: UTF-8, with any other byte escaped as ``\\xNN``.

    Keys are bytes on the wire (sbus-README "Routing keys"), Parquet and Spark
    want strings; escaping keeps every key distinct and readable.
    """
    return key.decode("utf-8", "backslashreplace")


def safe_name(text: str) -> str:
    """``text`` reduced to characters that are safe in a file name."""
    return _UNSAFE.sub("_", text).strip("_.")[:MAX_NAME_PART] or "bus"


@dataclass
class WriterStats:
    """What the writer has done so far (read by the progress line and tests)."""

    messages: int = 0
    payload_bytes: int = 0
    files_closed: int = 0
    current_file: str = ""


class RotatingCaptureWriter:
    """Append messages; get zstd Parquet files rotated by size and age.

    Memory is bounded by one row group (ROW_GROUP_ROWS rows or ROW_GROUP_BYTES of
    payload, whichever comes first).  Files are opened lazily on the first message,
    so an idle bus leaves no empty files.  Not thread-safe: one recorder loop owns it.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        instance: str,
        keep_payload: bool = True,
        rotate_bytes: int = ROTATE_BYTES,
        rotate_seconds: float = ROTATE_SECONDS,
        row_group_rows: int = ROW_GROUP_ROWS,
        row_group_bytes: int = ROW_GROUP_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rotate_bytes <= 0 or rotate_seconds <= 0:
            raise ValueError("rotation size and age must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.instance = instance
        self.keep_payload = keep_payload
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.row_group_rows = row_group_rows
        self.row_group_bytes = row_group_bytes
        self.stats = WriterStats()
        self._clock = clock
        self._prefix = f"capture-{safe_name(instance)}-{os.getpid()}"
        self._seq = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._partial: Path | None = None
        self._opened_at = 0.0
        self._times: list[int] = []
        self._keys: list[str] = []
        self._sizes: list[int] = []
        self._payloads: list[bytes | None] = []
        self._buffered_bytes = 0

    # --- public API ----------------------------------------------------------

    def append(self, time_ns: int, key: str, payload: bytes) -> None:
        """Record one message; may write a row group and rotate the file."""
        if self._writer is None:
            self._open()
        size = len(payload)
        self._times.append(time_ns)
        self._keys.append(key)
        self._sizes.append(size)
        self._payloads.append(payload if self.keep_payload else None)
        self.stats.messages += 1
        self.stats.payload_bytes += size
        if self.keep_payload:
            self._buffered_bytes += size
        if len(self._times) >= self.row_group_rows or self._buffered_bytes >= self.row_group_bytes:
            self._flush()
            if self._sink is not None and self._sink.tell() >= self.rotate_bytes:
                self.rotate()
        elif self._clock() - self._opened_at >= self.rotate_seconds:
            self.rotate()

    def tick(self) -> None:
        """Rotate if the open file is too old; call it when the bus is quiet."""
        if self._writer is not None and self._clock() - self._opened_at >= self.rotate_seconds:
            self.rotate()

    def rotate(self) -> Path | None:
        """Finish the open file (if any) and return its final path."""
        if self._writer is None or self._sink is None or self._partial is None:
            return None
        self._flush()
        self._writer.close()
        # fsync before the rename, and the directory after it: the rename must
        # never become durable before the data it names.
        fd = os.open(self._partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sink.close()
        final = self._partial.with_name(self._partial.name[: -len(PARTIAL_SUFFIX)] + CAPTURE_SUFFIX)
        os.rename(self._partial, final)
        _fsync_dir(self.directory)
        self._writer = None
        self._sink = None
        self._partial = None
        self.stats.files_closed += 1
        self.stats.current_file = ""
        return final

    def close(self) -> Path | None:
        """Finish the open file; the writer may be used again afterwards."""
        return self.rotate()

    def __enter__(self) -> RotatingCaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------

    def _open(self) -> None:
        self._seq += 1
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self._partial = self.directory / f"{self._prefix}-{stamp}-{self._seq:05d}{PARTIAL_SUFFIX}"
        self._sink = pa.OSFile(str(self._partial), "wb")
        self._writer = pq.ParquetWriter(
            self._sink,
            CAPTURE_SCHEMA,
            compression=COMPRESSION,
            # Dictionary-encode the repetitive string columns only.
            use_dictionary=["key", "instance"],
        )
        self._opened_at = self._clock()
        self.stats.current_file = str(self._partial)

    def _flush(self) -> None:
        if not self._times or self._writer is None:
            return
        n = len(self._times)
        table = pa.Table.from_arrays(
            [
                pa.array(self._times, pa.int64()),
                pa.array(self._keys, pa.string()),
                pa.array(self._sizes, pa.int32()),
                pa.array(self._payloads, pa.binary()),
                pa.repeat(pa.scalar(self.instance, pa.string()), n),
            ],
            schema=CAPTURE_SCHEMA,
        )
        self._writer.write_table(table, row_group_size=n)
        self._times = []
        self._keys = []
        self._sizes = []
        self._payloads = []
        self._buffered_bytes = 0


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def capture_files(paths: list[str]) -> list[Path]:
    """Finished capture files under ``paths`` (files or directories), sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(f for f in p.rglob(f"*{CAPTURE_SUFFIX}") if f.is_file())
        elif p.name.endswith(CAPTURE_SUFFIX):
            found.append(p)
    return sorted(found)
