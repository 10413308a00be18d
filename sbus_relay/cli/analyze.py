"""``sbus-relay analyze CAPTURES... --out DIR``: traffic statistics and a report (PySpark).

What it owns: the analyze command's arguments and what it prints.  What it may
touch: pipeline.runner and pipeline.follow.

This module parses and prints; the run itself is ``sbus_relay.pipeline.runner``
(and ``follow`` for ``--follow``).  pyspark, pyarrow and matplotlib are imported
inside ``run`` only: they are the optional ``spark`` extra, and
``sbus-relay --help`` must work without them.  The same options run under
``spark-submit`` through ``sbus_relay/cli/submit.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import types

from sbus_relay.pipeline import defaults as D

from .options import add_spark_arguments, positive_number, spark_settings

#: Exit status for inputs, options or output analyze refuses (and a missing extra).
EXIT_USAGE = 2
#: Exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: Exit status when Spark fails (reading a corrupt file, a lost cluster...).
EXIT_SPARK = 1
PROG = "sbus-relay analyze"


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
        help="output directory: Parquet tables, summary.json, report.md, PNGs "
        "(a new directory, or an earlier analyze output, which is replaced)",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=D.DEFAULT_DEPTH,
        metavar="N",
        help="key prefix depth in '/'-separated segments (default %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=None,
        metavar="SEC",
        help="time window in seconds (default: adapts to the capture's length, "
        "about 100 to 500 windows, and to the traffic's own rhythm)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=D.DEFAULT_TOP,
        metavar="N",
        help="top keys to keep (default %(default)s)",
    )
    parser.add_argument(
        "--burst-factor",
        type=float,
        default=D.DEFAULT_BURST_FACTOR,
        metavar="X",
        help="burst: window >= this x the median window (default %(default)s)",
    )
    parser.add_argument(
        "--burst-min-messages",
        type=int,
        default=D.DEFAULT_BURST_MIN_MESSAGES,
        metavar="N",
        help="burst: and at least this many messages (default %(default)s)",
    )
    add_spark_arguments(parser)
    parser.add_argument(
        "--no-report", action="store_true", help="write the Parquet tables and summary.json only"
    )
    parser.add_argument(
        "--raw",
        action="store_true",
        help="read every capture's raw rows, not the rollup written beside it "
        "(the same tables, slower; a deeper --depth or an odd --window does it anyway)",
    )
    parser.add_argument(
        "--skip-bad-files",
        action="store_true",
        help="skip capture files that are not readable Parquet instead of stopping",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep the report current while `record` writes into the capture directory "
        "(Spark Structured Streaming; Ctrl-C stops it)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="--follow: where the stream keeps its progress and state "
        "(default: OUT.checkpoint beside --out); a restart carries on from it",
    )
    parser.add_argument(
        "--trigger",
        type=positive_number,
        default=D.FOLLOW_TRIGGER_SECONDS,
        metavar="SEC",
        help="--follow: seconds between looks for new capture files (default %(default)s)",
    )


def _say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _show(line: str) -> None:
    print(line, flush=True)


def _on_interrupt() -> None:
    # The broken py4j calls that follow are no news: keep them off the terminal.
    logging.disable(logging.CRITICAL)
    _say("stopping (Ctrl-C)...")


def _stop_at_once(signum: int, frame: types.FrameType | None) -> None:
    """Ctrl-C before Spark runs (or after): say so and stop; while it runs, the
    pipeline's own handler (``session.Interrupts``) takes over and says the same."""
    _on_interrupt()
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """Run the analysis; 0 on success, EXIT_USAGE on refused input, EXIT_SPARK if Spark fails."""
    needed = ("pyarrow", "pyspark") if args.no_report else D.EXTRA_MODULES
    missing = D.missing_extra(needed)
    if missing:
        _say(missing)
        return EXIT_USAGE
    signal.signal(signal.SIGINT, _stop_at_once)  # said at once from here on
    from sbus_relay.pipeline import runner
    from sbus_relay.pipeline.analyze import AnalyzeOptions
    from sbus_relay.pipeline.inputs import InputError
    from sbus_relay.pipeline.session import SparkFailed

    try:
        options = AnalyzeOptions(
            depth=args.depth,
            window_seconds=args.window,
            top=args.top,
            burst_factor=args.burst_factor,
            burst_min_messages=args.burst_min_messages,
        )
        request = runner.Request(
            captures=args.captures,
            out=args.out,
            options=options,
            spark=spark_settings(args),
            report=not args.no_report,
            skip_bad_files=args.skip_bad_files,
            raw=args.raw,
        )
        if not args.follow and args.checkpoint is not None:
            raise InputError("--checkpoint goes with --follow")
        if args.follow:
            from sbus_relay.pipeline import follow

            watch = follow.FollowOptions(checkpoint=args.checkpoint, trigger_seconds=args.trigger)
            _say(follow.follow(request, watch, _say, _on_interrupt, _show))
            return 0
        outcome = runner.analyze(request, _say, _on_interrupt)
    except (InputError, ValueError) as exc:
        _say(str(exc))
        return EXIT_USAGE
    except SparkFailed as exc:
        _say(str(exc))
        return EXIT_SPARK
    except KeyboardInterrupt:
        logging.disable(logging.NOTSET)
        _say("interrupted; nothing written" if not args.follow else "stopped")
        return EXIT_INTERRUPTED
    if not args.no_report:
        print(f"report: {os.path.join(args.out, 'report.md')} and report.html")
    print(outcome.line())
    if outcome.building_archive:
        print(runner.archive_note())
    return 0
