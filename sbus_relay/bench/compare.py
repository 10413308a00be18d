"""Two versions of the bus, compared from their own interleaved bench runs.

What it owns: how runs of a version before a change and after it are set
side by side, and when a figure is worse beyond its noise.  What it may touch:
the JSON files it is given (read only).

    python -m sbus_relay.bench.compare --before B1.json B2.json B3.json \\
                                       --after A1.json A2.json A3.json

Each file is one full ``sbus-relay bench --json`` run; the runs of the two
versions are made in turn (before, after, before, after ...) on a quiet
machine, each version's own bench against its own reference in the same run,
so that what compares is each run's ratios to the reference and its CPU per
delivery, not absolute rates.  For every target (by its label) and every
throughput scenario's CPU per delivery, the table gives each version's
median over its runs with their range, and a verdict: **worse** when every
after-run is on the bad side of every before-run (the ranges do not
overlap), **better** the other way round, else **same** (within the runs'
noise); with fewer than two runs of either version nothing is judged (a
single run has no noise to measure against: **-**).  Printed as a Markdown
table, for docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import TARGETS

#: Verdicts of a row.
WORSE, BETTER, SAME, UNJUDGED = "worse", "better", "same", "-"
#: Runs of each version a verdict needs.
MIN_RUNS = 2


def figures(run: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """A run's figures to compare: label -> (value, higher is better)."""
    out: dict[str, tuple[float, bool]] = {}
    at_least = {t.label: t.at_least for t in TARGETS}
    for verdict in run.get("targets", []):
        value = verdict.get("value")
        if value is not None and verdict["label"] in at_least:
            out[verdict["label"]] = (float(value), at_least[verdict["label"]])
    for name, entry in run.get("scenarios", {}).items():
        ours = entry.get("sides", {}).get("ours", {})
        cpu = ours.get("cpu_us_per_delivery")
        if entry.get("status") == "ok" and cpu:
            out[f"{name}: our CPU us per delivery"] = (float(cpu), False)
    return out


def compare(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per figure both versions have: medians, ranges, verdict."""
    b_runs = [figures(r) for r in before]
    a_runs = [figures(r) for r in after]
    labels = [label for label in (b_runs[0] if b_runs else {}) if any(label in a for a in a_runs)]
    rows = []
    for label in labels:
        b = [r[label][0] for r in b_runs if label in r]
        a = [r[label][0] for r in a_runs if label in r]
        higher = b_runs[0][label][1]
        if higher:
            worse, better = max(a) < min(b), min(a) > max(b)
        else:
            worse, better = min(a) > max(b), max(a) < min(b)
        judged = min(len(a), len(b)) >= MIN_RUNS
        rows.append(
            {
                "figure": label,
                "before": statistics.median(b),
                "before_range": (min(b), max(b)),
                "after": statistics.median(a),
                "after_range": (min(a), max(a)),
                "verdict": (WORSE if worse else BETTER if better else SAME) if judged else UNJUDGED,
            }
        )
    return rows


def _g(value: float) -> str:
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| figure | before: median (range) | after: median (range) | after vs before |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["before_range"]
        alo, ahi = r["after_range"]
        lines.append(
            f"| {r['figure']} | {_g(r['before'])} ({_g(lo)} - {_g(hi)}) | "
            f"{_g(r['after'])} ({_g(alo)} - {_g(ahi)}) | {r['verdict']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sbus_relay.bench.compare")
    parser.add_argument("--before", nargs="+", type=Path, required=True, metavar="JSON")
    parser.add_argument("--after", nargs="+", type=Path, required=True, metavar="JSON")
    args = parser.parse_args(argv)
    try:
        before = [json.loads(p.read_text()) for p in args.before]
        after = [json.loads(p.read_text()) for p in args.after]
    except (OSError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 1
    rows = compare(before, after)
    print(table(rows))
    loads = [r["meta"].get("load_before") for r in (*before, *after)]
    print(f"\nload average before each run: {', '.join(str(x) for x in loads)}")
    worse = [r["figure"] for r in rows if r["verdict"] == WORSE]
    if worse:
        print(f"worse beyond the runs' noise: {', '.join(worse)}")
    return 3 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
