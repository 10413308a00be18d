"""``sbus-relay bench``: measure the bus live against the reference C sbusd, same run.

What it owns: the bench command's arguments, its printed report and its exit
status.  What it may touch: bench.runner and bench.report.

Starts every server it measures (our ``sbusd -f``, ``sbus-relay serve
--upstream`` and the reference ``sbusd -f``), drives them with the C load
generator in interleaved runs, prints the figures and the targets, and
optionally writes JSON.  See docs/performance.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from sbus_relay.bench.reference import SOURCE_ENV, UPSTREAM
from sbus_relay.bench.runner import SCENARIO_NAMES as SCENARIOS

#: Exit status when a scenario failed or a program could not be built.
EXIT_FAILED = 1
#: Exit status with --check when a target is not met.
EXIT_TARGETS_MISSED = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer messages and one run per side and scenario (about a minute)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        metavar="N",
        help="messages published per throughput run (default 100000, 20000 with --quick)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help="interleaved runs per side, the median is reported (default 3, 1 with --quick)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit with status {EXIT_TARGETS_MISSED} unless every target of the scenarios run"
        " is met (a missed target, a figure that is noise, or one without a reference to"
        " compare with: none counts as met)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="SVG",
        help="also run 1 -> 1 (distinct keys) under py-spy: a flame graph to SVG, "
        "collapsed stacks beside it (.txt), the top functions printed",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--reference",
        type=Path,
        metavar="PATH",
        help="the reference C sbusd binary to measure beside ours (default: built with gcc "
        "from the reference sources, see --reference-src)",
    )
    which.add_argument(
        "--reference-src",
        type=Path,
        metavar="DIR",
        help=f"build the reference from this source tree, a clone of {UPSTREAM} (default: "
        f"${SOURCE_ENV}, else an 'sbus' or 'reference-sbus' directory near the checkout)",
    )
    which.add_argument(
        "--no-reference",
        action="store_true",
        help="measure only our servers (the reference column is left out)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=SCENARIOS,
        default=[],
        metavar="SCENARIO",
        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--sbusd",
        metavar="COMMAND",
        help="measure this command as ours instead of our sbusd (it gets '-f -a PATH' appended)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where the C programs and the reference are compiled "
        "(default ~/.cache/sbus-relay/bench)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the servers' logs")
    parser.add_argument(
        "--pure",
        action="store_true",
        help="run our servers on the pure-Python path (SBUS_PURE_PYTHON=1)",
    )


def run(args: argparse.Namespace) -> int:
    from sbus_relay.bench.build import BuildError
    from sbus_relay.bench.profile import format_summary
    from sbus_relay.bench.report import format_table
    from sbus_relay.bench.runner import BenchOptions, run_bench

    for name in ("messages", "repeat"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"sbus-relay bench: --{name} must be at least 1", file=sys.stderr)
            return 2
    options = BenchOptions(
        quick=args.quick,
        messages=args.messages,
        repeat=args.repeat,
        json_path=args.json,
        profile_path=args.profile,
        sbusd=tuple(shlex.split(args.sbusd)) if args.sbusd else None,
        reference=args.reference,
        reference_src=args.reference_src,
        no_reference=args.no_reference,
        cache_dir=args.cache_dir,
        keep=args.keep,
        only=tuple(args.only),
        check=args.check,
        pure=args.pure,
    )
    try:
        results = run_bench(options, say=lambda line: print(line, file=sys.stderr, flush=True))
    except BuildError as exc:
        print(f"sbus-relay bench: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(
            "sbus-relay bench: interrupted; every process it started was stopped", file=sys.stderr
        )
        return 130
    print(format_table(results))
    if "profile" in results:
        print()
        print(format_summary(results["profile"]))
    if args.json:
        print(f"\nJSON: {args.json}")
    status, why = exit_status(results, args.check)
    if why:
        print(f"sbus-relay bench: {why}", file=sys.stderr)
    return status


def exit_status(results: dict[str, Any], check: bool) -> tuple[int, str]:
    """The exit status of a run, and the line that explains a non-zero one.

    A failed scenario is EXIT_FAILED ("unavailable", e.g. no relay, is only
    reported); with ``check``, a target not met is EXIT_TARGETS_MISSED.
    """
    from sbus_relay.bench.report import MET

    failed = [name for name, s in results["scenarios"].items() if s["status"] == "failed"]
    if failed:
        return EXIT_FAILED, f"{len(failed)} scenario(s) failed: {', '.join(failed)}"
    summary = results["summary"]
    short = sum(summary.values()) - summary[MET]
    if check and short:
        return EXIT_TARGETS_MISSED, f"--check: {short} of {sum(summary.values())} targets not met"
    return 0, ""
