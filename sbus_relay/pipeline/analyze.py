"""The capture analysis job (PySpark), behind ``sbus-relay analyze`` and ``spark-submit``.

Everything is computed with built-in Spark SQL functions, never Python UDFs, so a
cluster's executors need neither sbus_relay nor a matching Python: only the driver
runs this code.  Definitions (the tests recompute each one in plain Python):

- prefix: the first ``depth`` ``/``-separated segments of the key, joined by ``/``
  (``a/b/c`` at depth 2 is ``a/b``; ``a`` is ``a``).
- window: ``time_ns div window_ns * window_ns`` (tumbling windows, UTC epoch aligned).
  Unless given, its length adapts to the capture's span (``auto_window``): a
  "nice" length (1 s, 5 s, 1 min, 5 min...) giving about 100 to 500 windows.
- bytes: payload bytes (the ``size`` column), keys and framing not counted.
- percentiles: exact, linear interpolation between closest ranks (Spark ``percentile``).
- burst: a window whose message count is at least ``burst_factor`` times the median
  count of that scope (a prefix, or all traffic) over every window of the capture's
  span, empty windows counting as zero, and at least ``burst_min_messages``.  So a
  prefix heard only during its burst is a burst of that prefix (its median is 0),
  and ``burst_min_messages`` keeps a family that speaks once an hour from being one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .defaults import (
    CAPTURE_SUFFIX,
    DEFAULT_BURST_FACTOR,
    DEFAULT_BURST_MIN_MESSAGES,
    DEFAULT_DEPTH,
    DEFAULT_TOP,
    DEFAULT_WINDOW_SECONDS,
)
from .inputs import Inputs, resolve

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Payload size percentiles reported.
PERCENTILES = (0.5, 0.9, 0.99)
#: Most prefixes drawn as separate series in charts; the rest are summed as "(other)".
MAX_CHART_PREFIXES = 8
#: Most points per chart series; longer captures are re-binned into wider windows.
MAX_CHART_WINDOWS = 500
#: Window lengths (seconds) the default window is chosen from: easy to read.
NICE_WINDOWS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30,
    60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
)  # fmt: skip
#: Most windows the default window gives over the capture (the least is about 100).
TARGET_WINDOWS = 500
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
#: Size histogram buckets: powers of two up to the largest sbus packet (409,600 B).
HISTOGRAM_MAX_EXPONENT = 19

OTHER = "(other)"
#: Names of the Parquet result tables under the output directory.
TABLES = (
    "prefix_windows",
    "size_percentiles",
    "top_keys_by_messages",
    "top_keys_by_bytes",
    "instances",
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


def auto_window(span_ns: int | None) -> float:
    """The default window for a capture spanning ``span_ns``: the shortest nice
    length giving at most TARGET_WINDOWS windows (so about 100 to 500)."""
    if not span_ns or span_ns <= 0:
        return 1.0
    for w in NICE_WINDOWS:
        if span_ns / (w * 1e9) <= TARGET_WINDOWS:
            return float(w)
    return float(NICE_WINDOWS[-1])


def percentile_name(q: float) -> str:
    """Column name for percentile ``q``: 0.5 -> ``p50``, 0.999 -> ``p99_9``."""
    return "p" + f"{q * 100:g}".replace(".", "_")


@dataclass
class AnalysisResult:
    """What the job produced: the summary and the small tables the report draws."""

    summary: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    chart_series: list[dict[str, Any]] = field(default_factory=list)


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


def build_session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "sbus-analyze",
    jvm_log: str | None = None,
) -> SparkSession:
    """A SparkSession; ``master=None`` keeps spark-submit's choice (or ``local[*]``).

    With ``jvm_log``, the JVM that this starts writes its stderr (Spark's log and
    any Java stack trace) into that file instead of the terminal.
    """
    from pyspark.sql import SparkSession

    # Python workers (if any) must run the interpreter that has pyarrow: no
    # PYSPARK_PYTHON needed from the user.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    )
    if master is not None:
        builder = builder.master(master)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    if jvm_log is None:
        return builder.getOrCreate()
    # The JVM inherits descriptor 2 when it is launched: point it at the log for
    # that moment only, so this process's own stderr is unchanged.
    sys.stderr.flush()
    saved = os.dup(2)
    log_fd = os.open(jvm_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 2)
        return builder.getOrCreate()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log_fd)


def load_captures(spark: SparkSession, inputs: Inputs) -> DataFrame:
    """The capture rows: the checked files, or every ``*.parquet`` under the URLs."""
    from .capture import CAPTURE_SCHEMA

    reader = spark.read
    if inputs.checked:
        # Our schema, not one inferred from a footer: names and types are ours.
        ddl = "time_ns long, key string, size int, payload binary, instance string"
        assert len(CAPTURE_SCHEMA) == len(ddl.split(","))
        return reader.schema(ddl).parquet(*inputs.paths)
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


@dataclass
class Frames:
    """The job's lazy DataFrames: ``tables`` (keyed by TABLES names) and helpers."""

    tables: dict[str, DataFrame]
    key_stats: DataFrame
    overall: DataFrame
    cached: list[DataFrame]

    def release(self) -> None:
        """Drop the cached intermediate aggregates."""
        for df in self.cached:
            df.unpersist()


def compute(df: DataFrame, opts: AnalyzeOptions, span_windows: int = 1) -> Frames:
    """The analysis of capture rows ``df`` as DataFrames.

    ``span_windows`` is the number of windows from the first message's to the
    last's (the burst medians count the empty ones as zero).  Lazy, except the
    top-key tables: ranking ``top`` rows runs one job here.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    base = _with_derived(df, opts)
    ts = F.timestamp_micros(F.expr("window_start_ns div 1000")).alias("window_start")
    count = F.count(F.lit(1))

    # Three scans of the captures, each to a small aggregate that the rest derives
    # from: (prefix, window, instance), (prefix, size) and key.  All three are of
    # low cardinality, which is what keeps them fast: one aggregate per (key,
    # window, instance) would save a scan but costs more than it saves.  Sizes are
    # at most 409,600 (docs/protocol.md), so (prefix, size) stays small however many
    # messages there are, and exact percentiles weighted by count are cheap.
    cells = (
        base.groupBy("prefix", "window_start_ns", "instance").agg(
            count.alias("messages"),
            F.sum("size").alias("bytes"),
            F.min("time_ns").alias("first_ns"),
            F.max("time_ns").alias("last_ns"),
        )
    ).persist(StorageLevel.MEMORY_AND_DISK)
    size_counts = (base.groupBy("prefix", "size").agg(count.alias("n"))).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    key_stats = (
        base.groupBy("key").agg(count.alias("messages"), F.sum("size").alias("bytes"))
    ).persist(StorageLevel.MEMORY_AND_DISK)

    prefix_windows = (
        cells.groupBy("prefix", "window_start_ns")
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .select("prefix", "window_start_ns", ts, "messages", "bytes")
    )
    instances = cells.groupBy("instance").agg(
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.min("first_ns").alias("first_ns"),
        F.max("last_ns").alias("last_ns"),
    )

    pcols = [percentile_name(q) for q in opts.percentiles]
    size_percentiles = (
        size_counts.groupBy("prefix")
        .agg(
            F.sum("n").alias("messages"),
            F.sum(F.col("size") * F.col("n")).alias("bytes"),
            F.percentile(F.col("size"), list(opts.percentiles), F.col("n")).alias("_p"),
            F.max("size").alias("max_size"),
        )
        .select(
            "prefix",
            "messages",
            "bytes",
            (F.col("bytes") / F.col("messages")).alias("mean_size"),
            *[F.col("_p")[i].alias(n) for i, n in enumerate(pcols)],
            "max_size",
        )
    )
    overall = size_counts.agg(
        F.percentile(F.col("size"), list(opts.percentiles), F.col("n")).alias("_p")
    ).select(*[F.col("_p")[i].alias(n) for i, n in enumerate(pcols)])

    def top_by(first: str, second: str) -> DataFrame:
        order = [F.col(first).desc(), F.col(second).desc(), F.col("key").asc()]
        # At most opts.top rows: ranking them on the driver avoids a global
        # (single-partition) window, which Spark warns about on every run.
        top = key_stats.orderBy(*order).limit(opts.top).collect()
        return df.sparkSession.createDataFrame(
            [(i + 1, r["key"], r["messages"], r["bytes"]) for i, r in enumerate(top)],
            "rank int, key string, messages long, bytes long",
        )

    totals = prefix_windows.groupBy("window_start_ns").agg(
        F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")
    )
    scoped = prefix_windows.select(
        F.lit("prefix").alias("scope"), "prefix", "window_start_ns", "messages", "bytes"
    ).unionByName(
        totals.select(
            F.lit("total").alias("scope"),
            F.lit("").alias("prefix"),
            "window_start_ns",
            "messages",
            "bytes",
        )
    )
    # The median over all span_windows windows, the empty ones being zeros: with
    # the k non-empty counts sorted (rank rn from 0), the value at overall rank j
    # is 0 for j < W - k, else the one at rn = j - (W - k).
    n_windows = max(1, span_windows)
    pos = (n_windows - 1) / 2
    lo, hi = math.floor(pos), math.ceil(pos)
    by_scope = Window.partitionBy("scope", "prefix")
    ranked = scoped.select(
        "scope",
        "prefix",
        "messages",
        (F.row_number().over(by_scope.orderBy("messages")) - 1).alias("rn"),
        F.count(F.lit(1)).over(by_scope).alias("k"),
    )

    def at(rank: int) -> Any:
        hit = F.col("rn") == F.lit(rank) - (F.lit(n_windows) - F.col("k"))
        return F.coalesce(F.max(F.when(hit, F.col("messages"))), F.lit(0)).cast("double")

    medians = (
        ranked.groupBy("scope", "prefix")
        .agg(at(lo).alias("_lo"), at(hi).alias("_hi"))
        .select(
            "scope",
            "prefix",
            (F.col("_lo") + (F.col("_hi") - F.col("_lo")) * (pos - lo)).alias("median_messages"),
        )
    )
    bursts = (
        scoped.join(medians, ["scope", "prefix"])
        .where(
            (F.col("messages") >= F.col("median_messages") * opts.burst_factor)
            & (F.col("messages") >= opts.burst_min_messages)
        )
        .select(
            "scope",
            "prefix",
            "window_start_ns",
            ts,
            "messages",
            "bytes",
            "median_messages",
            F.when(
                F.col("median_messages") > 0, F.col("messages") / F.col("median_messages")
            ).alias("ratio"),
        )
    )

    # Bucket b holds sizes in [2**(b-1), 2**b); bucket 0 holds empty payloads.
    bucket = F.when(F.col("size") == 0, F.lit(0)).otherwise(
        F.least(F.floor(F.log2(F.col("size"))).cast("int") + 1, F.lit(HISTOGRAM_MAX_EXPONENT + 1))
    )
    size_histogram = (
        size_counts.groupBy(bucket.alias("bucket"))
        .agg(F.sum("n").alias("messages"))
        .select(
            "bucket",
            F.when(F.col("bucket") == 0, F.lit(0))
            .otherwise(F.expr("shiftleft(1, bucket - 1)"))
            .alias("min_size"),
            "messages",
        )
    )

    tables = {
        "prefix_windows": prefix_windows,
        "size_percentiles": size_percentiles,
        "top_keys_by_messages": top_by("messages", "bytes"),
        "top_keys_by_bytes": top_by("bytes", "messages"),
        "instances": instances,
        "bursts": bursts,
        "size_histogram": size_histogram,
    }
    return Frames(tables, key_stats, overall, [cells, size_counts, key_stats])


def _write_table(df: DataFrame, out: str, name: str) -> None:
    """One result table as ``<out>/<name>/part-00000.parquet``.

    The tables are aggregates, small enough for the driver: a local output is
    collected as Arrow and written with pyarrow, which saves a Spark write job
    (and its output committer) per table; a URL output is written by Spark.
    """
    if "://" in out:
        df.coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
        return
    import pyarrow.parquet as pq

    directory = Path(out, name)
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(df.toArrow(), directory / "part-00000.parquet", compression="zstd")


def _read(spark: SparkSession, out: str, name: str) -> Any:
    """A written result table as a pyarrow Table (plain file I/O for local output)."""
    import pyarrow.parquet as pq

    if "://" in out:
        return spark.read.parquet(f"{out}/{name}").toArrow()
    return pq.read_table(os.path.join(out, name))


def _sorted_rows(table: Any, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = table.sort_by(keys).to_pylist() if table.num_rows else []
    return rows


def run(
    spark: SparkSession,
    paths: Sequence[str] | Inputs,
    out_dir: str | os.PathLike[str],
    opts: AnalyzeOptions,
) -> AnalysisResult:
    """Analyse the captures (paths, or already resolved ``Inputs``); write the Parquet
    tables and summary.json into out_dir.

    The report (``report.write_report``) is written separately so that this
    function stays usable from notebooks without matplotlib.
    """
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    inputs = paths if isinstance(paths, Inputs) else resolve(list(paths))
    out = str(out_dir)
    if "://" not in out:
        Path(out).mkdir(parents=True, exist_ok=True)
    df = load_captures(spark, inputs)
    first_ns, last_ns = inputs.first_ns, inputs.last_ns
    if first_ns is None:
        span = df.agg(F.min("time_ns").alias("a"), F.max("time_ns").alias("b")).collect()[0]
        first_ns, last_ns = span["a"], span["b"]
    if opts.window_seconds is None:
        span_ns = None if first_ns is None or last_ns is None else last_ns - first_ns
        opts = replace(opts, window_seconds=auto_window(span_ns))
    w = opts.window_ns
    span_windows = 1 if first_ns is None or last_ns is None else last_ns // w - first_ns // w + 1
    frames = compute(df, opts, span_windows)
    try:
        for name in TABLES:
            _write_table(frames.tables[name], out, name)
        overall = frames.overall.collect()[0].asDict()
        distinct_keys = frames.key_stats.count()
    finally:
        frames.release()

    # Everything below reads the small written tables, not the captures again.
    tables = {name: _read(spark, out, name) for name in TABLES}
    pw = tables["prefix_windows"]
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
        "prefixes": pc.count_distinct(pw["prefix"]).as_py() if pw.num_rows else 0,
        "keys": distinct_keys,
        "instances": len(inst),
        "size_percentiles": overall,
        "options": {**asdict(opts), "percentiles": list(opts.percentiles)},
        "inputs": {
            "files": len(inputs.paths) if inputs.checked else None,
            "skipped": inputs.skipped,
            "notes": inputs.notes,
        },
        "loss": _loss(inputs),
    }
    text = json.dumps(summary, indent=2) + "\n"
    if "://" in out:  # a directory holding one text file, like the tables
        one = spark.createDataFrame([(text,)], "value string").coalesce(1)
        one.write.mode("overwrite").text(f"{out}/summary.json")
    else:
        Path(out, "summary.json").write_text(text)

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
        grid = cells.setdefault(name, [[0, 0] for _ in range(n)])
        cell = grid[(t // width * width - t0) // width]
        cell[0] += m
        cell[1] += b or 0
    return [
        {"series": name, "t": t0 + i * width, "messages": m, "bytes": b, "width_ns": width}
        for name, grid in cells.items()
        for i, (m, b) in enumerate(grid)
    ]
