"""Targets, ratios and the printed tables of ``sbus-relay bench``.

Every figure compared here was measured in the same run: ours against the C
reference sbusd (interleaved), the relay path against the direct path, the
stalled-subscriber run against the clean one.  Nothing is quoted.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """One goal: a figure of a scenario, its bound, and how to show both."""

    scenario: str
    label: str
    metric: str  # key in the scenario entry that holds the measured figure
    bound: float
    at_least: bool  # True: figure >= bound; False: figure < bound (or <=, see ``inclusive``)
    unit: str  # "x", "%", "B", "us"
    inclusive: bool = True


#: Medians of interleaved runs, distinct keys, 64-byte payloads.
TARGETS: tuple[Target, ...] = (
    Target("1to1", "1 -> 1, ours / reference", "ratio", 0.6, True, "x"),
    Target("2to4", "2 -> 4, ours / reference", "ratio", 0.8, True, "x"),
    Target("idle_patterns", "10k idle patterns, ours / reference", "ratio", 5.0, True, "x"),
    Target(
        "stalled", "stalled subscriber: cost to the others", "overhead", 0.20, False, "%", False
    ),
    Target("relay_up", "relay -> master / direct", "ratio", 0.5, True, "x"),
    Target("relay_down", "master -> relay / direct", "ratio", 0.5, True, "x"),
    Target("memory", "memory per idle client", "per_client_bytes", 4096, False, "B"),
    Target("memory", "memory per stored pattern", "per_pattern_bytes", 150, False, "B"),
    Target("clients_1000", "p99, 1,000 clients at 10k msg/s", "p99_us", 1000, False, "us", False),
)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _met(target: Target, value: float) -> bool:
    if target.at_least:
        return value >= target.bound
    return value <= target.bound if target.inclusive else value < target.bound


def evaluate(name: str, entry: dict[str, Any]) -> None:
    """Add the ratio, the figures the targets read, and each target's verdict."""
    sides = entry.get("sides", {})
    ours = sides.get("ours", {})
    if name == "memory":
        entry["per_client_bytes"] = ours.get("per_client_bytes")
        entry["per_pattern_bytes"] = ours.get("per_pattern_bytes")
    else:
        other = sides.get(entry.get("compare", ""), {})
        usable = other and not other.get("stalled")
        entry["ratio"] = ratio(ours.get("median"), other.get("median")) if usable else None
        entry["p99_us"] = ours.get("p99_us")
        if name == "stalled" and entry["ratio"] is not None:
            entry["overhead"] = 1.0 - entry["ratio"]
    verdicts = []
    for target in TARGETS:
        if target.scenario != name:
            continue
        value = entry.get(target.metric)
        verdicts.append(
            {
                "label": target.label,
                "value": value,
                "target": _fmt_bound(target),
                "met": None if value is None else _met(target, float(value)),
            }
        )
    if verdicts:
        entry["targets"] = verdicts


def _fmt_bound(t: Target) -> str:
    op = ">=" if t.at_least else ("<=" if t.inclusive else "<")
    if t.unit == "%":
        return f"{op} {t.bound * 100:g} %"
    if t.unit == "B":
        return f"{op} {t.bound:,.0f} B"
    if t.unit == "us":
        return f"{op} {t.bound:,.0f} us"
    return f"{op} {t.bound:g}x"


def _fmt_value(t: Target, value: float | None) -> str:
    if value is None:
        return "-"
    if t.unit == "%":
        return f"{value * 100:.1f} %"
    if t.unit == "B":
        return f"{value:,.0f} B"
    if t.unit == "us":
        return f"{value:,.0f} us"
    return f"{value:.2f}x"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _side_line(title: str, side: str, s: dict[str, Any], note: str) -> str:
    rate = "stalls" if s.get("stalled") else _fmt(s.get("median"), ",.0f")
    return (
        f"{title:<46} {side:<9} {rate:>10} {_fmt(s.get('p50_us'), ',.0f'):>8} "
        f"{_fmt(s.get('p99_us'), ',.0f'):>8} {_fmt(s.get('cpu_us_per_delivery'), '.2f'):>8} "
        f"{s.get('rss_bytes', 0) / 2**20:>7.1f}  {note}"
    )


def format_table(results: dict[str, Any]) -> str:
    """The figures per scenario and side, then the targets."""
    scenarios: dict[str, Any] = results["scenarios"]
    head = (
        f"{'scenario':<46} {'side':<9} {'deliv/s':>10} {'p50 us':>8} {'p99 us':>8} "
        f"{'cpu us':>8} {'RSS MiB':>7}  ours/other"
    )
    lines = [head, "-" * len(head)]
    left_out = {s.get("reference_left_out") for s in scenarios.values()} - {None, ""}
    if len(left_out) == 1:  # the same reason everywhere: say it once, above the table
        lines.insert(0, f"reference left out: {left_out.pop()}")
        left_out = set()
    for name, s in scenarios.items():
        if name == "memory":
            continue
        if s["status"] != "ok":
            lines.append(f"{s['title']:<46} {s['status'].upper()}: {s.get('reason', '')}")
            continue
        title = s["title"]
        for side, figures in s["sides"].items():
            note = ""
            if side == "ours" and s.get("ratio") is not None and not s.get("fixed_rate"):
                note = f"{s['ratio']:.2f}x {s['compare']}"
            if side == "reference" and figures.get("stalled"):
                note = (
                    f"delivered {figures['delivered']:,} of {figures['expected']:,}, then nothing"
                )
            lines.append(_side_line(title, side, figures, note))
            title = ""
        if s.get("reference_left_out") in left_out:
            lines.append(f"{'':<46} reference left out: {s['reference_left_out']}")
    mem = scenarios.get("memory")
    if mem:
        lines.append("")
        if mem["status"] != "ok":
            lines.append(f"memory: {mem['status'].upper()}: {mem.get('reason', '')}")
        else:
            for side, figures in mem["sides"].items():
                lines.append(
                    f"memory {side:<9} {figures['per_client_bytes']:>9,.0f} B per idle client "
                    f"({mem['clients']:,} clients), {figures['per_pattern_bytes']:>6,.0f} B per "
                    f"pattern ({mem['patterns']:,} patterns)"
                )
            if mem.get("reference_left_out") in left_out:
                lines.append(f"memory reference left out: {mem['reference_left_out']}")
    lines += ["", *format_targets(results)]
    meta = results["meta"]
    lines += [
        "",
        f"deliv/s: deliveries per second at the reading subscribers; p50/p99: send-to-receive "
        f"latency; cpu us: server CPU time per delivery; RSS: server memory after the run. "
        f"Medians of {meta['repeat']} interleaved runs, {meta['payload_bytes']}-byte payloads.",
    ]
    return "\n".join(lines)


def format_targets(results: dict[str, Any]) -> list[str]:
    """One line per target: measured figure, bound, met or not."""
    lines = [f"{'target':<46} {'measured':>12} {'bound':>12}  met"]
    lines.append("-" * len(lines[0]))
    by_label = {t.label: t for t in TARGETS}
    for target in TARGETS:
        entry = results["scenarios"].get(target.scenario)
        if entry is None:
            continue
        if entry["status"] != "ok":
            lines.append(f"{target.label:<46} {entry['status']:>12} {_fmt_bound(target):>12}  -")
            continue
        verdict = next(v for v in entry.get("targets", []) if v["label"] == target.label)
        met = {None: "-", True: "met", False: "NOT MET"}[verdict["met"]]
        value = _fmt_value(by_label[target.label], verdict["value"])
        if verdict["value"] is None and entry.get("reference_left_out"):
            value = "no ref"
        lines.append(f"{target.label:<46} {value:>12} {verdict['target']:>12}  {met}")
    return lines
