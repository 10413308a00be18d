"""``sbus-relay analyze CAPTURES... --out DIR``: traffic statistics and a report (PySpark).

pyspark, pyarrow and matplotlib are imported inside ``run`` only: they are the
optional ``spark`` extra, and ``sbus-relay --help`` must work without them.
The same job runs under ``spark-submit`` through ``sbus_relay/cli/submit.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

from sbus_relay.pipeline import classarchive
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
#: --master), unless --conf gives them: the throughput collector, a crash report
#: (if any) in the temporary directory rather than the user's, and no web UI (a
#: second saved at start; --conf spark.ui.enabled=true brings it back); the heap
#: is sized from the input (analyze.heap_mib), and the class archive
#: (``classarchive``) added when there is one.  Under spark-submit the JVM already
#: runs and they are moot.
DRIVER_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC -XX:ErrorFile="
    + os.path.join(tempfile.gettempdir(), "sbus-analyze-jvm-crash-%p.log"),
}
#: Executor settings on a cluster (--master other than local), unless --conf
#: gives them: the driver's collector, so both modes run the scan alike (and the
#: class archive when the master listens on loopback: its workers are then on
#: this machine, where the archive is).
CLUSTER_CONF = {
    "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
}
#: Exit status for inputs, options or output analyze refuses (and a missing extra).
EXIT_USAGE = 2
#: Exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
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


def _on_loopback(master: str) -> bool:
    """Whether every host of a ``spark://h1:p,h2:p`` master URL is a loopback address."""
    import ipaddress
    import urllib.parse

    if not master.startswith("spark://"):
        return False
    hosts = [urllib.parse.urlsplit(f"//{h}").hostname for h in master[8:].split(",")]
    for host in hosts:
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host or "").is_loopback:
                return False
        except ValueError:
            return False
    return True


def _note_interrupts(seen: list[int], *, defer: bool = False) -> None:
    """Take over SIGINT: remember it in ``seen`` and, unless ``defer``, raise
    KeyboardInterrupt after muting the logging of the py4j calls it breaks.

    Deferred while the JVM starts: pyspark launches it ignoring SIGINT (it exits
    when its stdin closes, with this process) but an interrupted launch deletes
    the file the JVM writes its port to, and a JVM that fails there never reads
    its stdin: it would outlive us.  Once it runs, pyspark's own handler is
    replaced too: it calls into the JVM from inside the handler while the main
    thread waits on that same connection."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_interrupt(signum: int, frame: types.FrameType | None) -> None:
        seen.append(signum)
        if not defer:
            logging.disable(logging.CRITICAL)
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)


def _jvm_running() -> bool:
    """Whether this process already has a Spark JVM (spark-submit, a notebook)."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def _jvm_process() -> subprocess.Popen[bytes] | None:
    """The JVM process pyspark started for this session (None under spark-submit)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return proc if isinstance(proc, subprocess.Popen) else None


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
    interrupted: list[int] = []
    try:
        cluster = args.master is not None and not args.master.startswith("local")
        heap = {"spark.driver.memory": f"{A.heap_mib(inputs.bytes)}m"}
        session_conf = {
            **BASE_CONF, **DRIVER_CONF, **heap, **(CLUSTER_CONF if cluster else {}), **conf
        }  # fmt: skip
        starting = not _jvm_running()
        own_options = "spark.driver.extraJavaOptions" in conf
        fell_back = False
        archive = classarchive.java_option() if starting and not own_options else None
        driver_options = session_conf["spark.driver.extraJavaOptions"]
        if archive is not None:
            session_conf["spark.driver.extraJavaOptions"] = f"{driver_options} {archive}"
            executor = "spark.executor.extraJavaOptions"
            if cluster and executor not in conf and _on_loopback(args.master):
                session_conf[executor] = f"{session_conf[executor]} {archive}"
        _note_interrupts(interrupted, defer=True)
        try:
            spark = A.build_session(args.master, session_conf, jvm_log=jvm_log)
        except Exception as exc:
            if archive is None or classarchive.writing() or "JAVA_GATEWAY" not in str(exc):
                raise
            # The JVM did not start with the class archive: drop it, start without.
            classarchive.discard()
            archive, fell_back = None, True
            session_conf["spark.driver.extraJavaOptions"] = driver_options
            spark = A.build_session(args.master, session_conf, jvm_log=jvm_log)
        jvm = _jvm_process() if starting else None
        t_session = time.monotonic()
        _note_interrupts(interrupted)
        try:
            if interrupted:  # while the JVM started
                raise KeyboardInterrupt
            spark.sparkContext.setLogLevel("ERROR")
            for key, value in A.partitioning(inputs.bytes, A.parallelism(spark)).items():
                if key not in conf:
                    spark.conf.set(key, value)
            result = A.run(spark, inputs, str(staging or args.out), opts)
            t_analysis = time.monotonic()
        finally:
            spark.stop()
        if classarchive.writing() is not None and not classarchive.wait_for_dump(jvm):
            print("sbus-relay analyze: the JVM did not write its class archive", file=sys.stderr)
            return EXIT_SPARK
        t_stopped = time.monotonic()
        if not args.no_report:
            from sbus_relay.pipeline.report import write_report

            write_report(result, staging or args.out)
        t_report = time.monotonic()
        if staging is not None:
            I.swap_into_place(staging, args.out)
            staging = None
    except (Exception, KeyboardInterrupt) as exc:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        if interrupted or isinstance(exc, KeyboardInterrupt):
            # Ctrl-C reaches the JVM too: whatever failed after it is no news.
            logging.disable(logging.NOTSET)
            with contextlib.suppress(OSError):
                os.unlink(jvm_log)  # nothing failed: nothing worth keeping
            print("sbus-relay analyze: interrupted; nothing written", file=sys.stderr)
            return EXIT_INTERRUPTED
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
    building = starting and archive is None and not fell_back and classarchive.build_later()
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
    if building:
        where = classarchive.cache_dir()
        print(
            f"note: building a class archive in the background so that Spark starts "
            f"faster next time (about 175 MB in {where}; once per Java and pyspark; "
            f"{classarchive.ENV_SWITCH}=0 turns it off)"
        )
    return 0
