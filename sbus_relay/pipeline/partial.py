"""Partial sums of raw capture rows, in Spark's Python workers.

What it owns: the partial sums of raw rows in Spark's Python workers.  What it
may touch: the capture files they read (pyarrow).

``analyze`` reads raw rows (``--raw``, a deeper ``--depth``, a ``--window``
the rollups do not divide, captures without rollups).  Of local capture files
(checked by the driver: ``inputs.resolve``), Spark's Python workers read the
columns ``time_ns, key, size, instance`` of their row groups themselves, with
pyarrow (``file_sums``), and sum each row group with pyarrow's own hash
group-by on integer codes (``rollup.sets``, what a rollup is made of) at the
report's window and depth; each task sums its partial rows once more before
handing them to Spark, which only sums those per set (``analyze.file_sums``).
The sums add up exactly (counts, byte sums, minima and maxima, exact size
histograms), so every table is the one Spark's own hash aggregates of every
raw row give (``analyze.aggregate``), at about one partial row per hundred
raw ones.  The row groups are spread over the tasks by rows (``plan``).

Why the workers read the files: handing Spark's own scan to a Python worker
(``mapInArrow``) turns every column into rows and back into Arrow in the JVM,
which costs as much as Spark's own aggregates of those rows.

The functions and the few of ``rollup`` they call are shipped to the workers
by value (``ship_by_value``): a worker needs Python (the driver's minor
version, as every Python worker of Spark does) and pyarrow, not sbus_relay.
Where the workers cannot run them (``worker_failure``: no such Python, no
pyarrow) or cannot read a file (``READ_FAILURE``: a corrupt data page, a path
the server does not have), ``analyze`` sums the raw rows with Spark SQL
instead, whose scan then fails or skips the file (``--skip-bad-files``) as
it always did.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator

import pyarrow as pa

# Names, not the module, in the functions shipped by value (``ship_by_value``):
# each carries the names it uses, where the module would carry all of its own.
from . import rollup
from .rollup import sets, sum_stored

#: What ``mapInArrow`` runs on each task.
BatchFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

#: Partial rows a task keeps before summing them together: bounds its memory
#: (about 100 bytes a row) whatever the number of keys and distinct sizes.
MERGE_ROWS = 1_000_000
#: The capture columns read (never the payload).
SCANNED = ["time_ns", "key", "size", "instance"]
#: Rows a worker reads at once: a capture's row group (``capture.PARQUET_ROW_GROUP_ROWS``),
#: about 40 MiB of the scanned columns; a bigger row group is read in parts.
READ_ROWS = 1_048_576
#: What a failure to read a capture file in a worker says (``file_sums``).
READ_FAILURE = "sbus_relay: a Python worker could not read the capture file"
#: A row group of a capture file: (path, index).
Unit = tuple[str, int]
#: Words of a Spark failure that say the Python workers could not run at all:
#: no such program, another Python, no pyarrow.  Any other failure of the
#: partial sums is a failure of the run.
WORKER_FAILURE_WORDS = (
    "Cannot run program",
    "PYTHON_VERSION_MISMATCH",
    "PACKAGE_NOT_INSTALLED",
    "No module named 'pyarrow'",
)


def file_sums(
    window_ns: int, depth: int, plan: list[list[Unit]], tasks: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The partial rows of the three sets at ``window_ns`` and ``depth`` of the
    row groups of the tasks numbered in ``tasks`` (``plan``), read READ_ROWS
    rows at a time; at most MERGE_ROWS partial rows kept at once.  A file that
    cannot be read raises READ_FAILURE."""
    kept: list[pa.Table] = []
    rows = 0
    for batch in tasks:
        for task in batch.column(0).to_pylist():
            for path, group in plan[task]:
                for table in _read(path, group):
                    part = sets(table, window_ns, depth)
                    kept.append(part)
                    rows += part.num_rows
                    if rows > MERGE_ROWS and len(kept) > 1:
                        kept = [sum_stored(kept)]
                        rows = kept[0].num_rows
    if kept:
        yield from sum_stored(kept).to_batches()


def _read(path: str, group: int) -> Iterator[pa.Table]:
    """The scanned columns of one row group, READ_ROWS rows at a time; any
    failure to read raises READ_FAILURE (Spark SQL then reads the file)."""
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(READ_ROWS, [group], SCANNED)
        while (batch := next(batches, None)) is not None:
            yield pa.Table.from_batches([batch])
    except Exception as exc:  # whatever the reader raises
        raise RuntimeError(f"{READ_FAILURE} {path}: {exc}") from None


def plan(groups: list[tuple[str, int, int]], tasks: int) -> list[list[Unit]]:
    """Row groups ``(path, row group, rows)`` spread over at most ``tasks``
    tasks, each of about as many rows (the largest groups first, each to the
    task with the fewest rows so far); no empty task."""
    tasks = max(1, min(tasks, len(groups)))
    load = [0] * tasks
    out: list[list[Unit]] = [[] for _ in range(tasks)]
    for path, group, rows in sorted(groups, key=lambda g: (-g[2], g[0], g[1])):
        i = load.index(min(load))
        out[i].append((path, group))
        load[i] += rows
    return [t for t in out if t]


def row_groups(paths: list[str]) -> list[tuple[str, int, int]]:
    """``(path, row group, rows)`` of each row group of the capture files."""
    import pyarrow.parquet as pq

    out = []
    for path in paths:
        meta = pq.read_metadata(path)
        out += [(path, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
    return out


def summer(window_ns: int, depth: int, tasks: list[list[Unit]]) -> BatchFunction:
    """The function ``mapInArrow`` runs on each task (one row: its number in
    ``tasks``): ``file_sums`` at a report's window and depth."""
    ship_by_value()
    return functools.partial(file_sums, window_ns, depth, tasks)


def ship_by_value() -> None:
    """Pickle this module and ``rollup`` by value in what Spark ships to its
    workers, so that a worker without sbus_relay runs them (each function
    carries the names it uses; pyarrow is imported by name)."""
    from pyspark import cloudpickle

    for module in (sys.modules[__name__], rollup):
        cloudpickle.register_pickle_by_value(module)


def worker_failure(message: str) -> bool:
    """Whether a Spark failure says the Python workers could not run at all."""
    return any(word in message for word in WORKER_FAILURE_WORDS)
