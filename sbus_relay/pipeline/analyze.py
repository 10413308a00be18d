"""The capture analysis job (PySpark), behind ``sbus-relay analyze`` and ``spark-submit``.

What it owns: the Spark job: which sets are computed and how they are read.
What it may touch: the Spark session it is given, the captures and rollups it
reads.

Every table derives from three sets, (prefix, window, instance), (prefix,
size) and key: read from the captures' rollups (``rollup``, re-binned and cut
by ``reaggregate``) or aggregated from raw rows, whichever ``sources`` chose
per file; ``compute`` collects the small sets, from which the driver derives
the tables (``derive``).  Rollups, and raw rows of URLs, are read with
built-in Spark SQL functions only (``aggregate``); raw rows of local capture
files are summed by Spark's Python workers with pyarrow (``file_sums``,
``partial``), which need pyarrow and the driver's Python, not sbus_relay;
where they cannot run, Spark SQL does it (``compute_sets``).  Definitions
(the tests recompute each one in plain Python):

- prefix: the first ``depth`` ``/``-separated segments of the key, joined by ``/``
  (``a/b/c`` at depth 2 is ``a/b``; ``a`` is ``a``).
- window: ``time_ns div window_ns * window_ns`` (tumbling windows, UTC epoch aligned).
  Unless given, its length adapts to the capture's span (``auto_window``): a
  "nice" length (1 s, 5 s, 1 min, 5 min...) giving about 100 to 500 windows; then
  to the traffic's rhythm (``rhythm_window``): traffic in batches gets windows at
  least as long as the gap between them.
- bytes: payload bytes (the ``size`` column), keys and framing not counted.
- percentiles: exact, linear interpolation between closest ranks (Spark ``percentile``).
- burst: a window whose message count is at least ``burst_factor`` times the median
  count of that scope (a prefix, or all traffic) over every window a recorder ran in
  (``recorded_windows``: the capture's span when there are no loss logs), empty
  windows counting as zero, and at least ``burst_min_messages``.  So a
  prefix heard only during its burst is a burst of that prefix (its median is 0),
  and ``burst_min_messages`` keeps a family that speaks once an hour from being one.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import derive as D
from . import partial as P
from . import rollup as R
from .defaults import (
    CAPTURE_SUFFIX,
    DEFAULT_BURST_FACTOR,
    DEFAULT_BURST_MIN_MESSAGES,
    DEFAULT_DEPTH,
    DEFAULT_TOP,
    DEFAULT_WINDOW_SECONDS,
)
from .inputs import SUMMARY_FILE, Inputs, resolve
from .sources import Sources, plan
from .windows import auto_window, recorded_windows, rhythm_window

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Payload size percentiles reported.
PERCENTILES = (0.5, 0.9, 0.99)
#: Most prefixes drawn as separate series in charts; the rest are summed as "(other)".
MAX_CHART_PREFIXES = 8
#: Most points per chart series; longer captures are re-binned into wider windows.
MAX_CHART_WINDOWS = 500
#: Scan tasks per core the input is split into (see ``partitioning``).
SCANS_PER_CORE = 2
#: Smallest scan split: below this, task overhead dominates.
MIN_SPLIT_BYTES = 4 * 1024 * 1024
#: Largest scan split: Spark's own default.
MAX_SPLIT_BYTES = 128 * 1024 * 1024
#: Input bytes per shuffle partition: the aggregates are far smaller than the input.
SHUFFLE_PARTITION_BYTES = 64 * 1024 * 1024
#: Most shuffle partitions: Spark's default, reached at about 12 GiB of captures.
MAX_SHUFFLE_PARTITIONS = 200
#: JVM heap for the tasks of a run: MIN_HEAP_MIB, plus HEAP_PER_INPUT_MIB per MiB
#: of captures, at most MAX_HEAP_MIB (see ``heap_mib``).
MIN_HEAP_MIB = 1024
HEAP_PER_INPUT_MIB = 0.25
MAX_HEAP_MIB = 4096
#: Size histogram buckets: powers of two up to the largest sbus packet (409,600 B).
HISTOGRAM_MAX_EXPONENT = D.HISTOGRAM_MAX_EXPONENT

#: The scan's grouping sets: what every table derives from (``rollup``).
CELLS = R.CELLS
SIZES = R.SIZES
KEYS = R.KEYS
GROUPING_SETS = (CELLS, SIZES, KEYS)
GROUPING_COLUMNS = R.GROUPING_COLUMNS
grouping_id = R.grouping_id

OTHER = "(other)"
#: The capture schema (``capture.CAPTURE_SCHEMA``) as Spark reads it.
CAPTURE_DDL = "time_ns long, key string, size int, payload binary, instance string"
#: The capture columns the job reads (never the payload).
SCANNED = ("time_ns", "key", "size", "instance")
#: Types of the collected sets, whichever Spark produced them.
CELLS_SCHEMA = pa.schema(
    [
        ("prefix", pa.string()),
        ("window_start_ns", pa.int64()),
        ("instance", pa.string()),
        ("messages", pa.int64()),
        ("bytes", pa.int64()),
        ("first_ns", pa.int64()),
        ("last_ns", pa.int64()),
    ]
)
SIZES_SCHEMA = pa.schema([("prefix", pa.string()), ("size", pa.int64()), ("n", pa.int64())])
#: Names of the Parquet result tables under the output directory.
TABLES = (
    "prefix_windows",
    "size_percentiles",
    "top_keys_by_messages",
    "top_keys_by_bytes",
    "instances",
    "instance_prefixes",
    "bursts",
    "size_histogram",
)


@dataclass(frozen=True)
class AnalyzeOptions:
    """Knobs of the analysis; validated on construction."""

    depth: int = DEFAULT_DEPTH
    #: None: adapt to the capture's span (``auto_window``).
    window_seconds: float | None = None
    top: int = DEFAULT_TOP
    burst_factor: float = DEFAULT_BURST_FACTOR
    burst_min_messages: int = DEFAULT_BURST_MIN_MESSAGES
    percentiles: tuple[float, ...] = PERCENTILES

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("depth must be at least 1")
        if self.window_seconds is not None and self.window_ns < 1_000_000:
            raise ValueError("window must be at least 1 ms")
        if self.top < 1:
            raise ValueError("top must be at least 1")
        if self.burst_factor <= 1.0:
            raise ValueError("burst factor must be above 1")
        if not all(0.0 <= q <= 1.0 for q in self.percentiles):
            raise ValueError("percentiles must be within [0, 1]")

    @property
    def window_ns(self) -> int:
        w = DEFAULT_WINDOW_SECONDS if self.window_seconds is None else self.window_seconds
        return round(w * 1e9)


def percentile_name(q: float) -> str:
    """Column name for percentile ``q``: 0.5 -> ``p50``, 0.999 -> ``p99_9``."""
    return "p" + f"{q * 100:g}".replace(".", "_")


@dataclass
class AnalysisResult:
    """What the job produced: the summary and the small tables the report draws."""

    summary: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    chart_series: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds of the Spark job (its result on the driver) and of the tables
    #: derived and written (``run``).
    job_s: float = 0.0
    tables_s: float = 0.0


def partitioning(input_bytes: int, parallelism: int) -> dict[str, str]:
    """Spark settings sized from the input: scan splits that give every core about
    SCANS_PER_CORE tasks, and shuffle partitions of about SHUFFLE_PARTITION_BYTES
    of input each (never fewer than the cores, never more than MAX_SHUFFLE_PARTITIONS).
    Adaptive query execution then coalesces the small shuffles further."""
    cores = max(1, parallelism)
    split = input_bytes // (cores * SCANS_PER_CORE) + 1
    split = min(max(split, MIN_SPLIT_BYTES), MAX_SPLIT_BYTES)
    shuffles = min(
        max(cores, math.ceil(input_bytes / SHUFFLE_PARTITION_BYTES)), MAX_SHUFFLE_PARTITIONS
    )
    return {
        "spark.sql.files.maxPartitionBytes": str(split),
        "spark.sql.shuffle.partitions": str(shuffles),
    }


def heap_mib(input_bytes: int) -> int:
    """The heap for the JVM that runs the tasks, sized from the input.  The scan
    keeps per-task hash tables of the aggregates, not the rows, so 1 GiB does for
    10M rows (the job ran as fast in 512 MiB, 1 and 2 GiB); bigger captures bring
    more keys and distinct sizes, hence a quarter of the input on top, to 4 GiB."""
    extra = input_bytes / 2**20 * HEAP_PER_INPUT_MIB
    return int(min(MAX_HEAP_MIB, MIN_HEAP_MIB + extra))


def load_captures(spark: SparkSession, inputs: Inputs) -> DataFrame:
    """The capture rows: the checked files, or every ``*.parquet`` under the URLs."""
    from .capture import CAPTURE_SCHEMA

    reader = spark.read
    if inputs.checked:
        # Our schema, not one inferred from a footer: names and types are ours.
        assert len(CAPTURE_SCHEMA) == len(CAPTURE_DDL.split(","))
        return reader.schema(CAPTURE_DDL).parquet(*inputs.paths)
    return (
        reader.option("pathGlobFilter", f"*{CAPTURE_SUFFIX}")
        .option("recursiveFileLookup", "true")
        .parquet(*inputs.paths)
    )


def _with_derived(df: DataFrame, opts: AnalyzeOptions) -> DataFrame:
    from pyspark.sql import functions as F

    w = opts.window_ns
    return df.select(
        F.col("time_ns"),
        F.col("key"),
        F.col("size").cast("long").alias("size"),
        F.col("instance"),
        # substring_index: everything before the depth-th "/" (the whole key if fewer);
        # no per-row array as split/slice/concat would build.
        F.substring_index(F.col("key"), "/", opts.depth).alias("prefix"),
        (F.expr(f"time_ns div {w}") * F.lit(w)).alias("window_start_ns"),
    )


def aggregate(df: DataFrame, opts: AnalyzeOptions) -> DataFrame:
    """The capture rows ``df`` aggregated once into the three sets every table
    derives from, each row tagged with its set (``_set``, ``rollup.grouping_id``),
    in the rollup's columns (``rollup.ROLLUP_DDL``).  Lazy.

    One hash aggregate at the finest grain the cells and keys need, (key,
    window, instance), from which the (prefix, window, instance) cells and the
    per-key counts are summed (a key's prefix is cut once per aggregated row,
    not per message); and one of (prefix, size), the exact size histograms.
    No row is expanded by grouping sets."""
    from pyspark.sql import functions as F

    derived = _with_derived(df, opts)
    fine = derived.groupBy("key", "window_start_ns", "instance").agg(*_sums())
    cells = (
        fine.withColumn("prefix", F.substring_index(F.col("key"), "/", opts.depth))
        .groupBy(*CELLS)
        .agg(*_resums())
    )
    keys = fine.groupBy("key").agg(*_resums())
    sizes = derived.groupBy(*SIZES).agg(F.count(F.lit(1)).alias("messages"))
    return (
        _as_sets(cells, R.CELL_SET)
        .unionByName(_as_sets(sizes, R.SIZE_SET))
        .unionByName(_as_sets(keys, R.KEY_SET))
    )


def file_sums(spark: SparkSession, paths: list[str], opts: AnalyzeOptions) -> DataFrame:
    """``aggregate`` of the rows of local capture files ``paths``, summed by
    Spark's Python workers (``partial``): each task reads its share of the row
    groups with pyarrow and hands over their partial sums, which Spark sums per
    set, as it sums rollups.  As many tasks as Spark would scan splits of the
    files (``spark.sql.files.maxPartitionBytes``, set by ``partitioning``; else
    MAX_SPLIT_BYTES).  Lazy."""
    groups = P.row_groups(paths)
    size = sum(os.path.getsize(p) for p in paths)
    given = spark.conf.get("spark.sql.files.maxPartitionBytes", None) or ""
    split = int(given) if given.isdigit() and int(given) > 0 else MAX_SPLIT_BYTES
    plan = P.plan(groups, math.ceil(size / split))
    summer = P.summer(opts.window_ns, opts.depth, plan)
    partials = spark.range(0, len(plan), 1, len(plan)).mapInArrow(summer, R.ROLLUP_DDL)
    return partials.groupBy("_set", *GROUPING_COLUMNS).agg(*_resums())


def _as_sets(df: DataFrame, set_id: int) -> DataFrame:
    """``df``'s rows in the rollup's columns, tagged ``set_id``; absent columns null."""
    from pyspark.sql import functions as F

    columns = [c.split() for c in R.ROLLUP_DDL.split(", ")]
    have = set(df.columns)
    return df.select(
        *[
            F.lit(set_id).cast(t).alias(c)
            if c == "_set"
            else (F.col(c) if c in have else F.lit(None)).cast(t).alias(c)
            for c, t in columns
        ]
    )


@dataclass
class Computed:
    """What the Spark job returns: the small aggregates, on the driver."""

    #: (prefix, window, instance): messages, bytes, first_ns, last_ns.
    cells: Any
    #: (prefix, size): n.
    sizes: Any
    top_by_messages: Any
    top_by_bytes: Any
    distinct_keys: int


def reaggregate(state: DataFrame, window_ns: int, depth: int | None = None) -> DataFrame:
    """The three sets from stored sets (rollups, ``follow``'s state): the cells
    re-binned into windows of ``window_ns`` (a multiple of the stored windows,
    so exactly), prefixes cut to ``depth`` segments (at most the stored depth)
    when given, and every set summed again.  Lazy."""
    from pyspark.sql import functions as F

    window = F.expr(f"window_start_ns div {window_ns} * {window_ns}")
    if depth is not None:
        state = state.withColumn("prefix", F.substring_index(F.col("prefix"), "/", depth))
    return (
        state.withColumn("window_start_ns", F.when(F.col("_set") == R.CELL_SET, window))
        .groupBy("_set", *GROUPING_COLUMNS)
        .agg(*_resums())
    )


def _sums() -> list[Any]:
    """The aggregates of raw rows: messages, bytes, first and last receive time."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("messages"),
        F.sum("size").alias("bytes"),
        F.min("time_ns").alias("first_ns"),
        F.max("time_ns").alias("last_ns"),
    ]


def _resums() -> list[Any]:
    """The same aggregates of aggregated rows."""
    from pyspark.sql import functions as F

    return [
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.min("first_ns").alias("first_ns"),
        F.max("last_ns").alias("last_ns"),
    ]


#: The parts of the job's one result (``compute``), told apart by ``_part``.
CELLS_PART = 0
SIZES_PART = 1
KEY_COUNT_PART = 2
TOP_BY_MESSAGES_PART = 3
TOP_BY_BYTES_PART = 4
#: The columns of the job's result: every part's rows in one table, the
#: columns a part has no use for null.
RESULT_COLUMNS = (
    ("_part", "int"), ("prefix", "string"), ("window_start_ns", "long"),
    ("instance", "string"), ("size", "long"), ("key", "string"), ("rank", "int"),
    ("messages", "long"), ("bytes", "long"), ("first_ns", "long"), ("last_ns", "long"),
)  # fmt: skip
#: RESULT_COLUMNS as Arrow types.
_ARROW_TYPES = {"int": pa.int32(), "long": pa.int64(), "string": pa.string()}
RESULT_SCHEMA = pa.schema([(c, _ARROW_TYPES[t]) for c, t in RESULT_COLUMNS])


def _part(df: DataFrame, part: int, columns: dict[str, Any]) -> DataFrame:
    """``df``'s ``columns`` (result column: expression) as rows of ``part`` of
    the result; absent columns null.  Its columns are named, never asked for
    (on a Connect server every question about a plan is a round trip)."""
    from pyspark.sql import functions as F

    return df.select(
        *[
            (F.lit(part) if c == "_part" else columns.get(c, F.lit(None))).cast(t).alias(c)
            for c, t in RESULT_COLUMNS
        ]
    )


def result_parts(
    stored: DataFrame, opts: AnalyzeOptions, grain: tuple[int, int] | None = None
) -> DataFrame:
    """The job's one result, lazily, from ``stored`` rows of the three sets
    (rollups at their own grain, raw rows aggregated: ``job_sets``): each set
    summed on its own columns at the report's depth and window (the cells
    re-binned exactly: the stored windows divide the report's), and as rows:

    - the cells and the size histograms, whose number is bounded by prefixes x
      windows x instances and prefixes x distinct sizes (at most 409,600), not
      by the traffic: the driver derives the tables from them (``derive``);
    - of the per-key counts, which are unbounded and stay in Spark: their
      number and the two top-key rankings, ranked there.

    Each set is read with a filter on ``_set`` that Spark pushes to the files:
    a rollup keeps each set in row groups of its own, so each part reads only
    its own rows.  With ``grain`` (depth, window), the rows are one rollup's,
    each set summed already at that depth and window: a set is summed again
    only where the report's depth (every set but the keys) or window (the
    cells) differs from it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = opts.window_ns
    in_set = F.col("_set")
    prefix = F.substring_index(F.col("prefix"), "/", opts.depth)
    same_depth = grain is not None and grain[0] == opts.depth
    cells = stored.where(in_set == F.lit(R.CELL_SET)).select(
        prefix.alias("prefix"),
        F.expr(f"window_start_ns div {w} * {w}").alias("window_start_ns"),
        *("instance", "messages", "bytes", "first_ns", "last_ns"),
    )
    if not (same_depth and grain is not None and grain[1] == w):
        cells = cells.groupBy(*CELLS).agg(*_resums())
    sizes = stored.where(in_set == F.lit(R.SIZE_SET)).select(
        prefix.alias("prefix"), "size", "messages"
    )
    if not same_depth:
        sizes = sizes.groupBy(*SIZES).agg(F.sum("messages").alias("messages"))
    keys = stored.where(in_set == F.lit(R.KEY_SET)).select("key", "messages", "bytes")
    if grain is None:
        keys = keys.groupBy("key").agg(
            F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")
        )

    def top_by(first: str, second: str, part: int) -> DataFrame:
        order = [F.col(first).desc(), F.col(second).desc(), F.col("key").asc()]
        # At most opts.top rows, ranked there (one partition of that many rows).
        ranked = keys.orderBy(*order).limit(opts.top)
        rank = F.row_number().over(Window.partitionBy(F.lit(0)).orderBy(*order))
        columns = {"key": F.col("key"), "rank": rank}
        return _part(ranked, part, {**columns, **{c: F.col(c) for c in ("messages", "bytes")}})

    col = {c: F.col(c) for c in ("prefix", "window_start_ns", "instance", "size", "messages")}
    col.update({c: F.col(c) for c in ("bytes", "first_ns", "last_ns")})
    parts = [
        _part(cells, CELLS_PART, {c: col[c] for c in (*CELLS, "messages", "bytes",
                                                      "first_ns", "last_ns")}),
        _part(sizes, SIZES_PART, {c: col[c] for c in (*SIZES, "messages")}),
        _part(keys.agg(F.count(F.lit(1)).alias("messages")), KEY_COUNT_PART,
              {"messages": col["messages"]}),
        top_by("messages", "bytes", TOP_BY_MESSAGES_PART),
        top_by("bytes", "messages", TOP_BY_BYTES_PART),
    ]  # fmt: skip
    result = parts[0]
    for part in parts[1:]:
        result = result.unionAll(part)
    return result


def compute(
    stored: DataFrame,
    opts: AnalyzeOptions,
    persist: bool = False,
    grain: tuple[int, int] | None = None,
) -> Computed:
    """The job: ``result_parts`` of ``stored`` (summed at ``grain`` when given),
    computed in one query and collected as Arrow in one round trip.
    ``persist``: keep ``stored`` while the query runs, for rows that would
    otherwise be computed once per part (the Python workers' sums, which Spark
    cannot filter before they are made)."""
    from pyspark import StorageLevel

    if persist:
        stored = stored.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        result = result_parts(stored, opts, grain).toArrow()
    finally:
        if persist:
            stored.unpersist()
    return split(result)


def split(result: pa.Table) -> Computed:
    """The job's result apart: the cells sorted and typed alike wherever Spark
    ran (so are the tables derived from them), the size histograms typed (what
    is derived from them does not depend on their order), the rankings in rank
    order, the number of distinct keys.  The parts come in order (a union's
    partitions are its children's, in turn): each is then a slice of the
    result, else a filter of it."""
    import pyarrow.compute as pc

    parts = result["_part"].combine_chunks() if result.num_rows else pa.array([], pa.int32())
    runs = pc.run_end_encode(parts)
    ends = runs.run_ends.to_pylist()
    starts = [0, *ends[:-1]]
    where = dict(zip(runs.values.to_pylist(), zip(starts, ends, strict=True), strict=True))
    ordered = len(where) == len(ends)

    def part(n: int, columns: list[str]) -> pa.Table:
        table = result.select(columns)
        if ordered:
            start, end = where.get(n, (0, 0))
            return table.slice(start, end - start)
        return table.filter(pc.equal(parts, n))

    cells = part(CELLS_PART, [*CELLS, "messages", "bytes", "first_ns", "last_ns"])
    cells = cells.cast(CELLS_SCHEMA).sort_by([(c, "ascending") for c in CELLS])
    sizes = part(SIZES_PART, [*SIZES, "messages"]).rename_columns([*SIZES, "n"])
    sizes = sizes.cast(SIZES_SCHEMA)

    def ranked(n: int) -> pa.Table:
        top = part(n, ["rank", "key", "messages", "bytes"]).sort_by("rank")
        return ranking(*(top[c].to_pylist() for c in ("key", "messages", "bytes")))

    distinct = pc.sum(part(KEY_COUNT_PART, ["messages"])["messages"]).as_py() or 0
    return Computed(cells, sizes, ranked(TOP_BY_MESSAGES_PART), ranked(TOP_BY_BYTES_PART),
                    distinct)  # fmt: skip


def ranking(keys: list[Any], messages: list[Any], nbytes: list[Any]) -> pa.Table:
    """A top-keys table from its rows, in rank order."""
    return pa.table(
        {
            "rank": pa.array(range(1, len(keys) + 1), pa.int32()),
            "key": pa.array(keys, pa.string()),
            "messages": pa.array(messages, pa.int64()),
            "bytes": pa.array(nbytes, pa.int64()),
        }
    )


def compute_local(state: pa.Table, opts: AnalyzeOptions) -> Computed:
    """``compute`` of stored sets with pyarrow on the driver, for stored sets
    that are local files and small (``follow``'s state): the same result,
    hence the same tables, byte for byte.  Each set is summed on its own
    columns; prefixes are cut once per distinct prefix."""
    import pyarrow.compute as pc

    w = opts.window_ns

    def rows(set_id: int) -> pa.Table:
        return state.filter(pc.equal(state["_set"], set_id))

    cells = rows(R.CELL_SET)
    codes, names = _cut(cells["prefix"], opts.depth)
    cells = pa.table(
        {
            "prefix": codes,
            "window_start_ns": pc.multiply(pc.divide(cells["window_start_ns"], w), w),
            **{c: cells[c] for c in ("instance", "messages", "bytes", "first_ns", "last_ns")},
        }
    ).group_by(list(CELLS), use_threads=False)
    cells = cells.aggregate(
        [("messages", "sum"), ("bytes", "sum"), ("first_ns", "min"), ("last_ns", "max")]
    )
    cells = cells.set_column(
        cells.schema.get_field_index("prefix"), "prefix", pc.take(names, cells["prefix"])
    )
    sizes = rows(R.SIZE_SET)
    codes, names = _cut(sizes["prefix"], opts.depth)
    sizes = pa.table({"prefix": codes, "size": sizes["size"], "messages": sizes["messages"]})
    sizes = sizes.group_by(list(SIZES), use_threads=False).aggregate([("messages", "sum")])
    sizes = sizes.set_column(
        sizes.schema.get_field_index("prefix"), "prefix", pc.take(names, sizes["prefix"])
    )

    keys = rows(R.KEY_SET)
    k = keys.group_by("key", use_threads=False).aggregate([("messages", "sum"), ("bytes", "sum")])
    k = pa.table({"key": k["key"], "messages": k["messages_sum"], "bytes": k["bytes_sum"]})

    def top_by(first: str, second: str, part: int) -> pa.Table:
        order = [(first, "descending"), (second, "descending"), ("key", "ascending")]
        top = k.sort_by(order).slice(0, opts.top)
        rank = pa.array(range(1, top.num_rows + 1), pa.int32())
        return result_rows(top.num_rows, part, key=top["key"], rank=rank,
                           messages=top["messages"], bytes=top["bytes"])  # fmt: skip

    return split(
        pa.concat_tables(
            [
                result_rows(
                    cells.num_rows, CELLS_PART, prefix=cells["prefix"],
                    window_start_ns=cells["window_start_ns"], instance=cells["instance"],
                    messages=cells["messages_sum"], bytes=cells["bytes_sum"],
                    first_ns=cells["first_ns_min"], last_ns=cells["last_ns_max"],
                ),
                result_rows(sizes.num_rows, SIZES_PART, prefix=sizes["prefix"],
                            size=sizes["size"], messages=sizes["messages_sum"]),
                result_rows(1, KEY_COUNT_PART, messages=pa.array([k.num_rows], pa.int64())),
                top_by("messages", "bytes", TOP_BY_MESSAGES_PART),
                top_by("bytes", "messages", TOP_BY_BYTES_PART),
            ]
        )
    )  # fmt: skip


def result_rows(rows: int, part: int, **columns: Any) -> pa.Table:
    """``rows`` rows of ``part`` of the job's result (RESULT_SCHEMA): its
    columns given, the others null."""
    return pa.table(
        {
            f.name: pa.repeat(pa.scalar(part, f.type), rows)
            if f.name == "_part"
            else columns.get(f.name, pa.nulls(rows, f.type))
            for f in RESULT_SCHEMA
        }
    ).cast(RESULT_SCHEMA)


def _cut(prefixes: Any, depth: int) -> tuple[Any, Any]:
    """Stored prefixes cut to ``depth`` segments, each distinct one once: (a code
    per row, the cut prefixes the codes index), so that sums group on integers."""
    import pyarrow.compute as pc

    if isinstance(prefixes, pa.ChunkedArray):
        prefixes = prefixes.combine_chunks() if prefixes.num_chunks else pa.array([], pa.string())
    encoded = pc.dictionary_encode(prefixes)
    cut = pc.dictionary_encode(R.prefixes(encoded.dictionary, depth))
    return pc.take(cut.indices, encoded.indices), cut.dictionary


def _rebin(cells: Any, window_ns: int) -> Any:
    """Cells summed into windows of ``window_ns`` (a multiple of theirs)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    starts = pc.multiply(pc.divide(cells["window_start_ns"], window_ns), window_ns)
    g = (
        cells.set_column(cells.schema.get_field_index("window_start_ns"), "window_start_ns", starts)
        .group_by(list(CELLS), use_threads=False)
        .aggregate([("messages", "sum"), ("bytes", "sum"), ("first_ns", "min"), ("last_ns", "max")])
    )
    table = pa.table(
        {
            **{c: g[c] for c in CELLS},
            "messages": g["messages_sum"],
            "bytes": g["bytes_sum"],
            "first_ns": g["first_ns_min"],
            "last_ns": g["last_ns_max"],
        }
    )
    return table.cast(CELLS_SCHEMA).sort_by([(c, "ascending") for c in CELLS])


def _write_table(spark: SparkSession, table: Any, out: str, name: str) -> None:
    """One result table as ``<out>/<name>/part-00000.parquet``: written by the driver
    with pyarrow, or by Spark for a URL output."""
    if "://" in out:
        spark.createDataFrame(table).coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
        return
    import pyarrow.parquet as pq

    directory = Path(out, name)
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / "part-00000.parquet", compression="zstd")


def _sorted_rows(table: Any, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = table.sort_by(keys).to_pylist() if table.num_rows else []
    return rows


def run(
    spark: SparkSession,
    paths: Sequence[str] | Inputs,
    out_dir: str | os.PathLike[str],
    opts: AnalyzeOptions,
    sources: Sources | None = None,
    say: Callable[[str], None] | None = None,
) -> AnalysisResult:
    """Analyse the captures (paths, or already resolved ``Inputs``); write the Parquet
    tables and summary.json into out_dir.  ``sources`` says which files are read
    through their rollups (``sources.plan``; by default every capture whose
    rollup serves, rolling up those without one beside them where it may).

    The report (``report.write_report``) is written separately so that this
    function stays usable from notebooks without matplotlib.  ``say`` gets the
    note of a run whose raw rows Spark SQL summed for its workers (``compute_sets``).
    """
    from pyspark.sql import functions as F

    inputs = paths if isinstance(paths, Inputs) else resolve(list(paths))
    first_ns, last_ns = inputs.first_ns, inputs.last_ns
    if first_ns is None:
        df = load_captures(spark, inputs)
        span = df.agg(F.min("time_ns").alias("a"), F.max("time_ns").alias("b")).collect()[0]
        first_ns, last_ns = span["a"], span["b"]
    base = span_options(opts, first_ns, last_ns)
    if sources is None:
        sources = (
            plan(inputs.file_rows, base.depth, base.window_ns, directories=inputs.directories)
            if inputs.checked
            else Sources(raw=list(inputs.paths))
        )
    t0 = time.monotonic()
    job = compute_sets(spark, inputs, sources, base, say)
    t1 = time.monotonic()
    files = len(inputs.paths) if inputs.checked else None
    result = finish(spark, job, opts, base, inputs, files, out_dir)
    result.job_s, result.tables_s = t1 - t0, time.monotonic() - t1
    return result


def compute_sets(
    spark: SparkSession,
    inputs: Inputs,
    sources: Sources,
    opts: AnalyzeOptions,
    say: Callable[[str], None] | None = None,
) -> Computed:
    """``compute`` of ``job_sets``.  When Spark's Python workers summed raw rows
    and failed to run at all (``partial.worker_failure``: executors without the
    driver's Python or without pyarrow) or to read a file (``partial.READ_FAILURE``),
    the same with Spark SQL's own scan and aggregates (slower): its scan fails
    on a bad file, or skips it (``--skip-bad-files``), in Spark's own words.  The
    note of a run that fell back for its workers goes to ``say``."""
    from .session import is_spark_error

    if not (sources.raw and inputs.checked):
        return compute(job_sets(spark, inputs, sources, opts), opts, grain=sources.grain)
    try:
        return compute(job_sets(spark, inputs, sources, opts), opts, persist=True)
    except Exception as exc:
        text = str(exc)
        if not is_spark_error(exc):
            raise
        if P.worker_failure(text):
            if say is not None:
                say(
                    "note: Spark's Python workers could not run (no Python of the driver's "
                    "version with pyarrow on the executors?): the raw rows were summed by "
                    "Spark SQL instead, which is slower"
                )
        elif P.READ_FAILURE not in text:
            raise
    return compute(job_sets(spark, inputs, sources, opts, in_workers=False), opts)


def job_sets(
    spark: SparkSession,
    inputs: Inputs,
    sources: Sources,
    opts: AnalyzeOptions,
    in_workers: bool = True,
) -> Any:
    """The stored rows of the report's three sets (``result_parts`` sums them):
    the rollups' rows as they are, the raw captures' aggregated, together.
    Local capture files are summed ``in_workers`` (``file_sums``), others by
    Spark SQL (``aggregate``)."""
    parts = []
    if sources.rollups:
        parts.append(spark.read.schema(R.ROLLUP_DDL).parquet(*sources.rollups))
    if sources.raw and in_workers and inputs.checked:
        parts.append(file_sums(spark, sources.raw, opts))
    elif sources.raw:
        raw = load_captures(spark, replace(inputs, paths=sources.raw))
        parts.append(aggregate(raw, opts))
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def span_options(opts: AnalyzeOptions, first_ns: int | None, last_ns: int | None) -> AnalyzeOptions:
    """``opts`` with the window of the span (``auto_window``) unless one is given."""
    if opts.window_seconds is not None:
        return opts
    span_ns = None if first_ns is None or last_ns is None else last_ns - first_ns
    return replace(opts, window_seconds=auto_window(span_ns))


def finish(
    spark: SparkSession,
    job: Computed,
    asked: AnalyzeOptions,
    opts: AnalyzeOptions,
    inputs: Inputs,
    files: int | None,
    out_dir: str | os.PathLike[str],
) -> AnalysisResult:
    """From the collected aggregates (cells in windows of ``opts``) to the tables
    and summary.json in ``out_dir``: the window follows the traffic's rhythm
    unless one was ``asked`` for, the bursts are judged over the windows the
    recorders ran in.  Shared by a batch run and each update of a followed one."""
    import pyarrow.compute as pc

    out = str(out_dir)
    if "://" not in out:
        Path(out).mkdir(parents=True, exist_ok=True)
    cells = job.cells
    if asked.window_seconds is None:
        window_ns = rhythm_window(cells, opts.window_ns)
        if window_ns != opts.window_ns:
            cells = _rebin(cells, window_ns)
            opts = replace(opts, window_seconds=window_ns / 1e9)
    w = opts.window_ns
    pcols = [percentile_name(q) for q in opts.percentiles]
    pw = D.prefix_windows(cells)
    first_ns = pc.min(cells["first_ns"]).as_py() if cells.num_rows else None
    last_ns = pc.max(cells["last_ns"]).as_py() if cells.num_rows else None
    span_windows = 1 if first_ns is None or last_ns is None else last_ns // w - first_ns // w + 1
    sessions = inputs.losses.intervals if inputs.losses is not None else []
    active = pw["window_start_ns"].to_pylist()
    recorded = recorded_windows(w, first_ns, last_ns, sessions, active)
    sizes = D.Sizes(job.sizes)
    tables = {
        "prefix_windows": pw,
        "size_percentiles": D.size_percentiles(sizes, opts.percentiles, pcols),
        "top_keys_by_messages": job.top_by_messages,
        "top_keys_by_bytes": job.top_by_bytes,
        "instances": D.instances(cells),
        "instance_prefixes": D.instance_prefixes(cells),
        "bursts": D.bursts(pw, recorded, opts.burst_factor, opts.burst_min_messages),
        "size_histogram": D.size_histogram(sizes),
    }
    for name in TABLES:
        _write_table(spark, tables[name], out, name)
    overall = dict(zip(pcols, D.overall_percentiles(sizes, opts.percentiles), strict=True))
    inst = _sorted_rows(
        tables["instances"], [("messages", "descending"), ("instance", "ascending")]
    )
    summary: dict[str, Any] = {
        "messages": sum(r["messages"] for r in inst),
        "bytes": sum(r["bytes"] or 0 for r in inst),
        "first_ns": min((r["first_ns"] for r in inst), default=None),
        "last_ns": max((r["last_ns"] for r in inst), default=None),
        "windows": pc.count_distinct(pw["window_start_ns"]).as_py() if pw.num_rows else 0,
        "span_windows": span_windows if inst else 0,
        "recorded_windows": recorded if inst else 0,
        "prefixes": pc.count_distinct(pw["prefix"]).as_py() if pw.num_rows else 0,
        "keys": job.distinct_keys,
        "instances": len(inst),
        "size_percentiles": overall,
        "options": {**asdict(opts), "percentiles": list(opts.percentiles)},
        "inputs": {"files": files, "skipped": inputs.skipped, "notes": inputs.notes},
        "loss": _loss(inputs),
    }
    text = json.dumps(summary, indent=2) + "\n"
    if "://" in out:  # a directory holding one text file, like the tables
        one = spark.createDataFrame([(text,)], "value string").coalesce(1)
        one.write.mode("overwrite").text(f"{out}/{SUMMARY_FILE}")
    else:
        Path(out, SUMMARY_FILE).write_text(text)

    result = AnalysisResult(summary=summary)
    result.tables = {
        "size_percentiles": _sorted_rows(
            tables["size_percentiles"], [("messages", "descending"), ("prefix", "ascending")]
        ),
        "top_keys_by_messages": _sorted_rows(
            tables["top_keys_by_messages"], [("rank", "ascending")]
        ),
        "top_keys_by_bytes": _sorted_rows(tables["top_keys_by_bytes"], [("rank", "ascending")]),
        "instances": inst,
        "instance_prefixes": _sorted_rows(
            tables["instance_prefixes"], [("instance", "ascending"), ("messages", "descending")]
        ),
        "bursts": _bursts_in_order(tables["bursts"]),
        "size_histogram": _sorted_rows(tables["size_histogram"], [("bucket", "ascending")]),
    }
    result.chart_series = chart_series(pw, summary, opts)
    return result


def _loss(inputs: Inputs) -> dict[str, Any]:
    """The loss figures of the recorder sessions behind the inputs."""
    if inputs.losses is None:
        return {"known": False, "reason": "loss logs are read from local captures only"}
    d = inputs.losses.as_dict()
    d["known"] = inputs.losses.known and inputs.losses.sessions > 0
    if not inputs.losses.sessions:
        d["reason"] = "no loss log beside the captures (not written by sbus-relay record)"
    elif not inputs.losses.known:
        d["reason"] = "a recorder ran on a bus that does not answer the drop query"
    return d


def _bursts_in_order(table: Any) -> list[dict[str, Any]]:
    """Strongest first: no median (a prefix heard only in bursts), then by ratio, messages."""
    rows: list[dict[str, Any]] = table.to_pylist()
    rows.sort(
        key=lambda r: (
            r["ratio"] is not None,
            -(r["ratio"] or 0.0),
            -r["messages"],
            r["window_start_ns"],
            r["scope"],
            r["prefix"],
        )
    )
    return rows


def chart_series(pw: Any, summary: dict[str, Any], opts: AnalyzeOptions) -> list[dict[str, Any]]:
    """Messages and bytes per (chart window, series), every window of the span
    present (zero when empty), at most MAX_CHART_WINDOWS windows and
    MAX_CHART_PREFIXES prefixes (the rest summed as OTHER)."""
    if not summary["messages"] or not pw.num_rows:
        return []
    totals: dict[str, int] = defaultdict(int)
    prefixes = pw["prefix"].to_pylist()
    starts = pw["window_start_ns"].to_pylist()
    msgs = pw["messages"].to_pylist()
    nbytes = pw["bytes"].to_pylist()
    for p, m in zip(prefixes, msgs, strict=True):
        totals[p] += m
    top = set(sorted(totals, key=lambda p: (-totals[p], p))[:MAX_CHART_PREFIXES])
    w = opts.window_ns
    first = summary["first_ns"] // w * w
    span = summary["last_ns"] // w * w - first + w
    factor = max(1, math.ceil(span / w / MAX_CHART_WINDOWS))
    width = w * factor
    t0 = first // width * width
    n = (summary["last_ns"] // width * width - t0) // width + 1
    cells: dict[str, list[list[int]]] = {}
    for p, t, m, b in zip(prefixes, starts, msgs, nbytes, strict=True):
        name = p if p in top else OTHER
        grid = cells.get(name)
        if grid is None:  # a series' windows made once, not for every row it has
            grid = cells[name] = [[0, 0] for _ in range(n)]
        cell = grid[(t // width * width - t0) // width]
        cell[0] += m
        cell[1] += b or 0
    return [
        {"series": name, "t": t0 + i * width, "messages": m, "bytes": b, "width_ns": width}
        for name, grid in cells.items()
        for i, (m, b) in enumerate(grid)
    ]
