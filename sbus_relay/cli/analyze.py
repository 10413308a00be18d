"""``sbus-relay analyze CAPTURES... --out DIR``: traffic statistics and a report (PySpark).

pyspark, pyarrow and matplotlib are imported inside ``run`` only: they are the
optional ``spark`` extra, and ``sbus-relay --help`` must work without them.
The same job runs under ``spark-submit`` through ``sbus_relay/cli/submit.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sbus_relay.pipeline import defaults as D

#: Spark settings for every run: the console progress bar garbles our output.
BASE_CONF = {"spark.ui.showConsoleProgress": "false"}
#: Shuffle partitions for a local run: the default 200 only adds scheduling
#: overhead for aggregates of this size on one machine.
LOCAL_SHUFFLE_PARTITIONS = "8"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's options (the CLI owns parsing)."""

    parser.add_argument(
        "captures",
        nargs="+",
        metavar="CAPTURES",
        help="capture files or directories (only *.parquet is read)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory: Parquet tables, summary.json, report.md, PNGs",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=D.DEFAULT_DEPTH,
        help="key prefix depth in '/'-separated segments (default %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=D.DEFAULT_WINDOW_SECONDS,
        metavar="SEC",
        help="time window in seconds (default %(default)s)",
    )
    parser.add_argument(
        "--top", type=int, default=D.DEFAULT_TOP, help="top keys to keep (default %(default)s)"
    )
    parser.add_argument(
        "--burst-factor",
        type=float,
        default=D.DEFAULT_BURST_FACTOR,
        help="burst: window >= this x the median window (default %(default)s)",
    )
    parser.add_argument(
        "--burst-min-messages",
        type=int,
        default=D.DEFAULT_BURST_MIN_MESSAGES,
        help="burst: and at least this many messages (default %(default)s)",
    )
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL, e.g. spark://host:7077 (default: local[*], "
        "or whatever spark-submit was given)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting (repeatable)",
    )
    parser.add_argument(
        "--no-report", action="store_true", help="write the Parquet tables and summary.json only"
    )


def _check_local_captures(paths: list[str]) -> None:
    """Fail early, in one line, on local paths that hold no capture files.

    URLs (``hdfs://``, ``s3a://``...) are left to Spark: only it can list them.
    """
    local = [p for p in paths if "://" not in p]
    for p in local:
        if not os.path.exists(p):
            raise ValueError(f"no such file or directory: {p}")
    if local and len(local) == len(paths):
        from sbus_relay.pipeline.capture import capture_files

        if not capture_files(local):
            raise ValueError(f"no *{D.CAPTURE_SUFFIX} capture files under {' '.join(paths)}")


def run(args: argparse.Namespace) -> int:
    """Run the analysis; 0 on success, 2 on bad options."""
    from sbus_relay.pipeline import analyze as A

    try:
        opts = A.AnalyzeOptions(
            depth=args.depth,
            window_seconds=args.window,
            top=args.top,
            burst_factor=args.burst_factor,
            burst_min_messages=args.burst_min_messages,
        )
        conf = {}
        for kv in args.conf:
            key, eq, value = kv.partition("=")
            if not eq or not key:
                raise ValueError(f"--conf wants KEY=VALUE, got {kv!r}")
            conf[key] = value
        _check_local_captures(args.captures)
    except ValueError as e:
        print(f"sbus-relay analyze: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    spark = A.build_session(args.master, {**BASE_CONF, **conf})
    try:
        shuffle = "spark.sql.shuffle.partitions"
        if (spark.sparkContext.master or "").startswith("local") and shuffle not in conf:
            spark.conf.set(shuffle, LOCAL_SHUFFLE_PARTITIONS)
        spark.sparkContext.setLogLevel("WARN")
        result = A.run(spark, args.captures, args.out, opts)
    finally:
        spark.stop()
    if not args.no_report:
        from sbus_relay.pipeline.report import write_report

        report = write_report(result, args.out)
        print(f"report: {report}")
    s = result.summary
    print(
        f"analysed {s['messages']:,} messages ({s['keys']:,} keys) "
        f"in {time.monotonic() - t0:.1f} s; tables in {args.out}"
    )
    return 0
