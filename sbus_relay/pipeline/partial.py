"""Partial sums of raw capture rows, in Spark's Python workers (``mapInArrow``).

``analyze`` reads raw rows (``--raw``, a deeper ``--depth``, a ``--window``
the rollups do not divide, captures without rollups) in one scan of the
columns ``time_ns, key, size, instance``: each task hands its Arrow record
batches to ``partial_sums``, which sums each batch with pyarrow's own hash
group-by on integer codes (``rollup.sets``, what a rollup is made of) at the
report's window and depth, and sums the partial rows of its task once more
before handing them back.  Spark then only sums those partial rows per set
(``analyze.aggregate``): the sums add up exactly (counts, byte sums, minima and
maxima, exact size histograms), so every table is the one Spark's own hash
aggregates of every raw row gave, at a few partial rows per thousand raw ones
instead of two hash aggregates of every row.

The function and the few of ``rollup`` it calls are shipped to the workers by
value (``ship_by_value``): a worker needs Python (the driver's minor version,
as every Python worker of Spark does) and pyarrow, not sbus_relay.  Where the
workers cannot run it at all (no such Python, no pyarrow), ``analyze`` sums
the raw rows with Spark SQL instead (``worker_failure``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

# Names, not the module, in the functions shipped by value (``ship_by_value``):
# each carries the names it uses, where the module would carry all of its own.
from . import rollup
from .rollup import GROUPING_COLUMNS, ROLLUP_SCHEMA, sets

#: What ``mapInArrow`` runs on each task.
BatchFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

#: Partial rows a task keeps before summing them together: bounds its memory
#: (about 100 bytes a row) whatever the number of keys and distinct sizes.
MERGE_ROWS = 1_000_000
#: Raw rows per Arrow batch handed to a task's function
#: (``spark.sql.execution.arrow.maxRecordsPerBatch``, Spark's default 10,000):
#: a batch's partial sums cost about as much for 10,000 rows as for 100,000
#: (most are per distinct key, prefix and size), and a batch of the four
#: scanned columns is a few MiB.
BATCH_ROWS = 1_000_000
#: The Spark setting that sizes those batches.
BATCH_ROWS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: The columns a partial row is grouped on: its set and the set's columns.
GROUPED = ["_set", *GROUPING_COLUMNS]
#: How each summed column of partial rows is summed again.
SUMS = [("messages", "sum"), ("bytes", "sum"), ("first_ns", "min"), ("last_ns", "max")]
#: Words of a Spark failure that say the Python workers could not run at all:
#: no such program, another Python, no pyarrow.  Any other failure of the
#: partial sums is a failure of the run.
WORKER_FAILURE_WORDS = (
    "Cannot run program",
    "PYTHON_VERSION_MISMATCH",
    "PACKAGE_NOT_INSTALLED",
    "No module named 'pyarrow'",
)


def merge(parts: Iterable[pa.Table]) -> pa.Table:
    """Partial rows (``rollup.ROLLUP_SCHEMA``) summed on their set and its columns."""
    table = pa.concat_tables(parts)
    g = table.group_by(GROUPED, use_threads=False).aggregate(SUMS)
    columns = {c: g[c] for c in GROUPED}
    columns.update({name: g[f"{name}_{how}"] for name, how in SUMS})
    return pa.table([columns[f.name] for f in ROLLUP_SCHEMA], schema=ROLLUP_SCHEMA)


def partial_sums(
    window_ns: int, depth: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One task's raw rows (``time_ns, key, size, instance``) as the partial
    rows of the three sets at ``window_ns`` and ``depth``; at most MERGE_ROWS
    partial rows kept at once."""
    kept: list[pa.Table] = []
    rows = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        part = sets(pa.Table.from_batches([batch]), window_ns, depth)
        kept.append(part)
        rows += part.num_rows
        if rows > MERGE_ROWS and len(kept) > 1:
            kept = [merge(kept)]
            rows = kept[0].num_rows
    if kept:
        yield from merge(kept).to_batches()


def summer(window_ns: int, depth: int) -> BatchFunction:
    """The function ``mapInArrow`` runs on each task: ``partial_sums`` at a
    report's window and depth."""
    ship_by_value()
    return functools.partial(partial_sums, window_ns, depth)


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
