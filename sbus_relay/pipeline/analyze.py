"""The capture analysis job (PySpark), behind ``sbus-relay analyze`` and ``spark-submit``.

Everything is computed with built-in Spark SQL functions, never Python UDFs, so a
cluster's executors need neither sbus_relay nor a matching Python: only the driver
runs this code.  Definitions (the tests recompute each one in plain Python):

- prefix: the first ``depth`` ``/``-separated segments of the key, joined by ``/``
  (``a/b/c`` at depth 2 is ``a/b``; ``a`` is ``a``).
- window: ``time_ns div window_ns * window_ns`` (tumbling windows, UTC epoch aligned).
- bytes: payload bytes (the ``size`` column), keys and framing not counted.
- percentiles: exact, linear interpolation between closest ranks (Spark ``percentile``).
- burst: a window whose message count is at least ``burst_factor`` times the median
  count over the windows in which that scope (a prefix, or all traffic) had traffic,
  and at least ``burst_min_messages``.  Empty windows are not in the median: a key
  family that speaks once an hour would otherwise have a median of zero.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Payload size percentiles reported.
PERCENTILES = (0.5, 0.9, 0.99)
#: Most prefixes drawn as separate series in charts; the rest are summed as "(other)".
MAX_CHART_PREFIXES = 8
#: Most points per chart series; longer captures are re-binned into wider windows.
MAX_CHART_WINDOWS = 1500
#: Most bursts kept in the report (all of them are in the Parquet table).
MAX_REPORT_BURSTS = 50
#: Most prefixes listed in the report's percentile table (all are in Parquet).
MAX_REPORT_PREFIXES = 50
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
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    top: int = DEFAULT_TOP
    burst_factor: float = DEFAULT_BURST_FACTOR
    burst_min_messages: int = DEFAULT_BURST_MIN_MESSAGES
    percentiles: tuple[float, ...] = PERCENTILES

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("depth must be at least 1")
        if self.window_ns < 1_000_000:
            raise ValueError("window must be at least 1 ms")
        if self.top < 1:
            raise ValueError("top must be at least 1")
        if self.burst_factor <= 1.0:
            raise ValueError("burst factor must be above 1")
        if not all(0.0 <= q <= 1.0 for q in self.percentiles):
            raise ValueError("percentiles must be within [0, 1]")

    @property
    def window_ns(self) -> int:
        return round(self.window_seconds * 1e9)


def percentile_name(q: float) -> str:
    """Column name for percentile ``q``: 0.5 -> ``p50``, 0.999 -> ``p99_9``."""
    return "p" + f"{q * 100:g}".replace(".", "_")


@dataclass
class AnalysisResult:
    """What the job produced: the summary and the small tables the report draws."""

    summary: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    chart_series: list[dict[str, Any]] = field(default_factory=list)


def build_session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "sbus-analyze",
) -> SparkSession:
    """A SparkSession; ``master=None`` keeps spark-submit's choice (or ``local[*]``)."""
    from pyspark.sql import SparkSession

    # Python workers (if any) must run the interpreter that has pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def load_captures(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """All finished capture files under ``paths``; ``*.parquet.partial`` is skipped."""
    return (
        spark.read.option("pathGlobFilter", f"*{CAPTURE_SUFFIX}")
        .option("recursiveFileLookup", "true")
        .parquet(*paths)
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


def compute(df: DataFrame, opts: AnalyzeOptions) -> Frames:
    """The analysis of capture rows ``df`` as DataFrames.

    Lazy, except the top-key tables: ranking ``top`` rows runs one job here.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    base = _with_derived(df, opts)
    ts = F.timestamp_micros(F.expr("window_start_ns div 1000")).alias("window_start")
    count = F.count(F.lit(1))

    # Three scans of the captures, each to a small aggregate that the rest derives from:
    # (prefix, window, instance), (prefix, size) and key.  Sizes are at most 409,600
    # (SPEC §1), so (prefix, size) stays small however many messages there are, and
    # exact percentiles weighted by count are cheap.
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
    medians = scoped.groupBy("scope", "prefix").agg(
        F.percentile(F.col("messages"), 0.5).alias("median_messages")
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
            (F.col("messages") / F.col("median_messages")).alias("ratio"),
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


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.collect()]


def run(
    spark: SparkSession,
    paths: Sequence[str],
    out_dir: str | os.PathLike[str],
    opts: AnalyzeOptions,
) -> AnalysisResult:
    """Analyse the captures under ``paths``; write Parquet tables and summary.json to out_dir.

    The report (``report.write_report``) is written separately so that this
    function stays usable from notebooks without matplotlib.
    """
    from pyspark.sql import functions as F

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frames = compute(load_captures(spark, paths), opts)
    try:
        for name in TABLES:
            # Result tables are aggregates: one file each is easiest to use.
            frames.tables[name].coalesce(1).write.mode("overwrite").parquet(str(out / name))
        overall = frames.overall.collect()[0].asDict()
        distinct_keys = frames.key_stats.count()
    finally:
        frames.release()

    # Everything below reads the small written tables, not the captures again.
    tables = {name: spark.read.parquet(str(out / name)) for name in TABLES}
    pw = tables["prefix_windows"]
    inst = _rows(tables["instances"].orderBy(F.col("messages").desc(), "instance"))
    summary: dict[str, Any] = {
        "messages": sum(r["messages"] for r in inst),
        "bytes": sum(r["bytes"] or 0 for r in inst),
        "first_ns": min((r["first_ns"] for r in inst), default=None),
        "last_ns": max((r["last_ns"] for r in inst), default=None),
        "windows": pw.select("window_start_ns").distinct().count(),
        "prefixes": pw.select("prefix").distinct().count(),
        "keys": distinct_keys,
        "instances": len(inst),
        "size_percentiles": overall,
        "options": {**asdict(opts), "percentiles": list(opts.percentiles)},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    result = AnalysisResult(summary=summary)
    result.tables = {
        "size_percentiles": _rows(
            tables["size_percentiles"]
            .orderBy(F.col("messages").desc(), "prefix")
            .limit(MAX_REPORT_PREFIXES)
        ),
        "top_keys_by_messages": _rows(tables["top_keys_by_messages"].orderBy("rank")),
        "top_keys_by_bytes": _rows(tables["top_keys_by_bytes"].orderBy("rank")),
        "instances": inst,
        "bursts": _rows(
            tables["bursts"]
            .orderBy(F.col("ratio").desc(), "window_start_ns")
            .limit(MAX_REPORT_BURSTS)
        ),
        "size_histogram": _rows(tables["size_histogram"].orderBy("bucket")),
    }
    result.chart_series = _chart_series(pw, summary, opts)
    return result


def _chart_series(
    pw: DataFrame, summary: dict[str, Any], opts: AnalyzeOptions
) -> list[dict[str, Any]]:
    """Messages and bytes per (chart window, series), bounded by the MAX_CHART_* limits."""
    from pyspark.sql import functions as F

    if not summary["messages"]:
        return []
    top = [
        r["prefix"]
        for r in pw.groupBy("prefix")
        .agg(F.sum("messages").alias("m"))
        .orderBy(F.col("m").desc(), "prefix")
        .limit(MAX_CHART_PREFIXES)
        .collect()
    ]
    span = summary["last_ns"] - summary["first_ns"] + opts.window_ns
    factor = max(1, math.ceil(span / opts.window_ns / MAX_CHART_WINDOWS))
    width = opts.window_ns * factor
    series = F.when(F.col("prefix").isin(top), F.col("prefix")).otherwise(F.lit(OTHER))
    rows = (
        pw.groupBy(
            series.alias("series"), (F.expr(f"window_start_ns div {width}") * width).alias("t")
        )
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .orderBy("t", "series")
        .collect()
    )
    return [dict(r.asDict(), width_ns=width) for r in rows]
