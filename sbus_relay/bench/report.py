"""Reference figures, targets, and the printed table of ``sbus-relay bench``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: The C reference ``sbusd``, measured on this machine (2 cores), quoted from the
#: issue as ranges; the benchmark compares against their midpoints, in
#: deliveries per second with 64-byte payloads.
REFERENCE_RANGES: dict[str, tuple[float, float]] = {
    "1to1": (90_000.0, 220_000.0),
    "2to4": (165_000.0, 235_000.0),
    "1to2_idle": (12_000.0, 15_000.0),
    "1to1_stalled": (0.0, 0.0),  # the reference stalls: nothing is delivered
}
REFERENCE: dict[str, float] = {k: (lo + hi) / 2 for k, (lo, hi) in REFERENCE_RANGES.items()}

#: Targets from the issue.
TARGET_VS_REFERENCE = {"1to1": 0.6, "2to4": 0.6, "1to2_idle": 3.0}
TARGET_STALLED_OVERHEAD = 0.20  # a never-reading subscriber costs the others < 20 %
TARGET_RELAY_VS_BUS = 0.5  # relay -> master at least half a single bus (1 -> 1)
TARGET_BYTES_PER_CLIENT = 16 * 1024
TARGET_BYTES_PER_PATTERN = 300


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fmt_met(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def format_table(results: dict[str, Any]) -> str:
    """The human table: one line per scenario, then latency and memory."""
    scenarios: dict[str, Any] = results["scenarios"]
    head = (
        f"{'scenario':<40} {'msgs/s':>10} {'limit':>10} {'vs limit':>9} "
        f"{'vs ref':>7}  {'target':<22} {'met':<3}"
    )
    lines = [head, "-" * len(head)]
    for name, s in scenarios.items():
        if name in ("latency", "memory"):
            continue
        if s["status"] != "ok":
            lines.append(f"{s['title']:<40} {s['status'].upper()}: {s.get('reason', '')}")
            continue
        lines.append(
            f"{s['title']:<40} {_fmt_rate(s['median']):>10} "
            f"{_fmt_rate(s.get('baseline_median')):>10} "
            f"{_fmt_ratio(s.get('ratio_baseline')):>9} {_fmt_ratio(s.get('ratio_reference')):>7}  "
            f"{s.get('target') or '':<22} {_fmt_met(s.get('met'))}"
        )
        if s.get("note"):
            lines.append(f"{'':<4}{s['note']}")
    lat = scenarios.get("latency")
    if lat:
        if lat["status"] == "ok":
            lines.append(
                f"{lat['title']:<40} p50 {lat['p50_us']:,.0f} us, p99 {lat['p99_us']:,.0f} us"
                f"  (limit: p50 {lat['baseline_p50_us']:,.0f} us, "
                f"p99 {lat['baseline_p99_us']:,.0f} us)"
            )
        else:
            lines.append(f"{lat['title']:<40} {lat['status'].upper()}: {lat.get('reason', '')}")
    mem = scenarios.get("memory")
    if mem:
        if mem["status"] == "ok":
            lines.append(
                f"{'memory per idle client':<40} {mem['per_client_bytes']:>10,.0f} B"
                f"{'':<29}{'< 16 KiB':<22} {_fmt_met(mem['met_client'])}"
            )
            lines.append(
                f"{'memory per stored pattern':<40} {mem['per_pattern_bytes']:>10,.0f} B"
                f"{'':<29}{'< 300 B':<22} {_fmt_met(mem['met_pattern'])}"
            )
        else:
            lines.append(f"{mem['title']:<40} {mem['status'].upper()}: {mem.get('reason', '')}")
    lines.append("")
    lines.append(
        "msgs/s: deliveries per second counted at the reading subscribers (median of "
        f"{results['meta']['repeat']}); limit: the same load on forwarder.c; ref: the C sbusd "
        "as quoted in the issue (midpoints)."
    )
    return "\n".join(lines)
