"""``sbus-relay analyze CAPTURES... --out DIR``: traffic statistics and a report (PySpark).

pyspark, pyarrow and matplotlib are imported inside ``run`` only: they are the
optional ``spark`` extra, and ``sbus-relay --help`` must work without them.
The same job runs under ``spark-submit`` through ``sbus_relay/cli/submit.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

from sbus_relay.pipeline import defaults as D

#: Spark settings for every run: the console progress bar garbles our output;
#: adaptive query execution sizes the shuffles from the data (local or cluster);
#: and no task waits for a "local" executor (the default 3 s per stage is most of
#: a cluster run's time: every stage reads small cached aggregates).
BASE_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.locality.wait": "0s",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
}
#: Driver JVM settings when analyze starts the JVM itself (a local run, or
#: --master), unless --conf gives them: the throughput collector and no web UI (a
#: second saved at start; --conf spark.ui.enabled=true brings it back); the heap
#: is sized from the input (analyze.heap_mib).  Under spark-submit the JVM already
#: runs and they are moot.
DRIVER_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
}
#: Executor settings on a cluster (--master other than local), unless --conf
#: gives them: the driver's collector, so both modes run the scan alike.
CLUSTER_CONF = {
    "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
}
#: Exit status for inputs, options or output analyze refuses (and a missing extra).
EXIT_USAGE = 2
#: Exit status when Spark fails (reading a corrupt file, a lost cluster...).
EXIT_SPARK = 1


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
        default=None,
        metavar="SEC",
        help="time window in seconds (default: adapts to the capture's length, "
        "about 100 to 500 windows)",
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
    parser.add_argument(
        "--skip-bad-files",
        action="store_true",
        help="skip capture files that are not readable Parquet instead of stopping",
    )


def _spark_error(exc: BaseException) -> str:
    """The first meaningful line of a Spark/Java failure."""
    text = str(getattr(exc, "desc", None) or exc)
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[0][:300] if lines else type(exc).__name__


def run(args: argparse.Namespace) -> int:
    """Run the analysis; 0 on success, EXIT_USAGE on refused input, EXIT_SPARK if Spark fails."""
    needed = ("pyarrow", "pyspark") if args.no_report else D.EXTRA_MODULES
    missing = D.missing_extra(needed)
    if missing:
        print(f"sbus-relay analyze: {missing}", file=sys.stderr)
        return EXIT_USAGE
    from sbus_relay.pipeline import analyze as A
    from sbus_relay.pipeline import inputs as I

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
        I.check_output(args.out, args.captures)
        inputs = I.resolve(args.captures, skip_bad=args.skip_bad_files)
    except ValueError as e:
        print(f"sbus-relay analyze: {e}", file=sys.stderr)
        return EXIT_USAGE
    for note in inputs.notes:
        print(f"sbus-relay analyze: {note}", file=sys.stderr)
    if args.skip_bad_files:
        conf.setdefault("spark.sql.files.ignoreCorruptFiles", "true")
    t0 = time.monotonic()
    local_out = not I.is_url(args.out)
    staging = I.staging_dir(args.out) if local_out else None
    jvm_log = os.path.join(tempfile.gettempdir(), f"sbus-analyze-{os.getpid()}.log")
    try:
        cluster = args.master is not None and not args.master.startswith("local")
        heap = {"spark.driver.memory": f"{A.heap_mib(inputs.bytes)}m"}
        session_conf = {
            **BASE_CONF, **DRIVER_CONF, **heap, **(CLUSTER_CONF if cluster else {}), **conf
        }  # fmt: skip
        spark = A.build_session(args.master, session_conf, jvm_log=jvm_log)
        t_session = time.monotonic()
        try:
            spark.sparkContext.setLogLevel("ERROR")
            for key, value in A.partitioning(inputs.bytes, A.parallelism(spark)).items():
                if key not in conf:
                    spark.conf.set(key, value)
            result = A.run(spark, inputs, str(staging or args.out), opts)
            t_analysis = time.monotonic()
        finally:
            spark.stop()
        t_stopped = time.monotonic()
        if not args.no_report:
            from sbus_relay.pipeline.report import write_report

            write_report(result, staging or args.out)
        t_report = time.monotonic()
        if staging is not None:
            I.swap_into_place(staging, args.out)
            staging = None
    except Exception as exc:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        if not isinstance(exc, PySparkException | Py4JError):
            raise
        message = _spark_error(exc)
        if "JAVA_GATEWAY_EXITED" in message or "Connection refused" in message:
            hint = " (is --master right and the cluster up? see the log)"
        elif args.skip_bad_files:
            hint = ""
        else:
            hint = " (a corrupt capture file? try --skip-bad-files)"
        print(
            f"sbus-relay analyze: Spark failed: {message}{hint}; Spark's log: {jvm_log}",
            file=sys.stderr,
        )
        return EXIT_SPARK
    finally:
        if staging is not None:
            I.discard(staging)
    with contextlib.suppress(OSError):
        os.unlink(jvm_log)  # a clean run: nothing in it worth keeping
    s = result.summary
    if not args.no_report:
        print(f"report: {os.path.join(args.out, 'report.md')} and report.html")
    loss = s["loss"]
    if loss.get("known"):
        lost = f"{loss['dropped']:,} lost by the bus" if loss["dropped"] else "nothing lost"
    else:
        lost = "loss unknown"
    report = "" if args.no_report else f", report {t_report - t_stopped:.1f} s"
    print(
        f"analysed {s['messages']:,} messages ({s['keys']:,} keys; {lost}) "
        f"in {time.monotonic() - t0:.1f} s (Spark start {t_session - t0:.1f} s, "
        f"analysis {t_analysis - t_session:.1f} s{report}); "
        f"{s['options']['window_seconds']:g} s windows; tables in {args.out}"
    )
    return 0
