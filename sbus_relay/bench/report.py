"""Targets, ratios and the printed tables of ``sbus-relay bench``.

Every figure compared here was measured in the same run: ours against the C
reference sbusd (interleaved), the relay path against the direct path, the
stalled-subscriber run against the clean one, the run with subscription churn
against the calm one.  Nothing is quoted.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """One goal: a figure of a scenario, its bound, and how to show both.

    A real figure is above ``low`` (or at it, with ``low_inclusive``) and at
    most ``high``: rates, bytes and microseconds are above 0, a cost is from
    0 to 100 %.  A figure outside that is the runs' noise, not a measurement
    (one side's run was slowed by something else on the machine): it is shown
    as noise, with what was measured, and judges nothing.
    """

    scenario: str
    label: str
    metric: str  # key in the scenario entry that holds the measured figure
    bound: float
    at_least: bool  # True: figure >= bound; False: figure < bound (or <=, see ``inclusive``)
    unit: str  # "x", "%", "B", "us"
    inclusive: bool = True
    low: float = 0.0
    low_inclusive: bool = False
    high: float | None = None


#: Medians of interleaved runs, distinct keys, 64-byte payloads.  The one table
#: of goals: the printed targets, the JSON's verdicts, ``--check`` and
#: docs/performance.md all come from it.
TARGETS: tuple[Target, ...] = (
    Target("1to1", "1 -> 1, ours / reference", "ratio", 1.5, True, "x"),
    Target("wildcards", "wildcard/prefix/secret, ours / reference", "ratio", 1.2, True, "x"),
    Target("2to4", "2 -> 4, ours / reference", "ratio", 2.5, True, "x"),
    Target("idle_patterns", "10k idle patterns, ours / reference", "ratio", 20.0, True, "x"),
    Target(
        "stalled",
        "stalled subscriber: cost to the others",
        "overhead",
        0.05,
        False,
        "%",
        False,
        low_inclusive=True,
        high=1.0,
    ),
    Target("churn", "1,000 (un)subscriptions/s, rate / without", "ratio", 0.9, True, "x"),
    Target("relay_up", "relay -> master, rate / direct", "ratio", 0.8, True, "x"),
    Target("relay_up", "relay -> master, CPU / direct", "cpu_ratio", 2.0, False, "x"),
    Target("relay_down", "master -> relay, rate / direct", "ratio", 0.8, True, "x"),
    Target("relay_down", "master -> relay, CPU / direct", "cpu_ratio", 2.0, False, "x"),
    Target("clients_1000", "p99, 1,000 clients, ours / reference", "p99_ratio", 1.0, False, "x"),
    Target("memory", "memory per idle client", "per_client_bytes", 512, False, "B"),
    Target("memory", "memory per stored pattern", "per_pattern_bytes", 100, False, "B"),
    Target(
        "upgrade", "live upgrade: lost, duplicated, reordered", "lost_or_reordered", 0, False,
        "msgs", low_inclusive=True,
    ),
    Target("upgrade", "live upgrade: longest hand-over", "handover_max_ms", 1000, False, "ms"),
    Target(
        "restart", "master restart: relays ready again after", "relays_ready_max_ms", 100, False,
        "ms", low_inclusive=True,
    ),
    Target("client", "Python subscriber, best of ours / nats-py", "sub_ratio", 1.0, True, "x"),
    Target(
        "client", "2 -> 4 batched, bus CPU per delivery / NATS's", "cpu_ratio_2to4", 1.0, False,
        "x",
    ),
    Target("fleet", "host -> host rate, buses / native nats-py", "ratio", 1.0, True, "x"),
    Target(
        "fleet", "CPU per message per bus, its link included", "cpu_us_per_msg_max", 2.0, False,
        "us.2",
    ),
    Target(
        "fleet", "p99 added by two buses at 10,000 msg/s", "p99_added_ms", 0.3, False, "ms.2",
        low=-1e9,
    ),
)  # fmt: skip
#: Load average (1 min) above which a scenario that records it (``fleet``)
#: is no measure: its targets are not judged.
LOAD_MAX = 2.0

#: A target's verdicts: its figure meets the bound, misses it, is noise (outside
#: what is possible), or was not measured (no reference, the scenario failed or
#: was not run).
MET, MISSED, NOISE, UNMEASURED = "met", "missed", "noise", "unmeasured"
#: How each verdict is printed in the targets table.
VERDICT_WORDS = {MET: "met", MISSED: "NOT MET", NOISE: "noise", UNMEASURED: "-"}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _met(target: Target, value: float) -> bool:
    if target.at_least:
        return value >= target.bound
    return value <= target.bound if target.inclusive else value < target.bound


def _possible(target: Target, value: float) -> bool:
    above = value >= target.low if target.low_inclusive else value > target.low
    return above and (target.high is None or value <= target.high)


def evaluate(name: str, entry: dict[str, Any]) -> None:
    """Add the ratio, the figures the targets read, and each target's verdict."""
    sides = entry.get("sides", {})
    ours = sides.get("ours", {})
    if name in ("upgrade", "restart", "client", "fleet"):
        pass  # their figures are the entry's own (``continuity``)
    elif name == "memory":
        entry["per_client_bytes"] = ours.get("per_client_bytes")
        entry["per_pattern_bytes"] = ours.get("per_pattern_bytes")
    else:
        other = sides.get(entry.get("compare", ""), {})
        usable = other and not other.get("stalled")
        entry["ratio"] = ratio(ours.get("median"), other.get("median")) if usable else None
        entry["cpu_ratio"] = (
            ratio(ours.get("cpu_us_per_delivery"), other.get("cpu_us_per_delivery"))
            if usable
            else None
        )
        entry["p99_us"] = ours.get("p99_us")
        entry["p99_ratio"] = ratio(ours.get("p99_us"), other.get("p99_us")) if usable else None
        if name == "stalled" and entry["ratio"] is not None:
            entry["overhead"] = 1.0 - entry["ratio"]
    verdicts = [verdict(t, entry) for t in TARGETS if t.scenario == name]
    loaded = entry.get("load_max")
    if loaded is not None and loaded > LOAD_MAX and entry.get("status") == "ok":
        for v in verdicts:
            v.update(met=None, verdict=UNMEASURED, note=loaded_note(loaded))
    if verdicts:
        entry["targets"] = verdicts


def loaded_note(load: float) -> str:
    """The one line that refuses a run on a busy machine."""
    return f"load average {load:g} above {LOAD_MAX:g}: not a measure (rerun on a quiet machine)"


def verdict(target: Target, entry: dict[str, Any] | None) -> dict[str, Any]:
    """One target's verdict on a scenario's entry (None: the scenario was not run)."""
    value = None if entry is None or entry.get("status") != "ok" else entry.get(target.metric)
    result: dict[str, Any] = {
        "scenario": target.scenario,
        "label": target.label,
        "metric": target.metric,
        "value": value,
        "bound": target.bound,
        "target": _fmt_bound(target),
        "met": None,
        "verdict": UNMEASURED,
        "note": "",
    }
    if value is None:
        if entry is None:
            result["note"] = "not run"
        elif entry.get("status") != "ok":
            result["note"] = f"scenario {entry.get('status')}: {entry.get('reason', '')}"
        elif entry.get("reference_left_out"):
            result["note"] = "no reference to compare with"
        else:
            result["note"] = "no figure"
        return result
    if not _possible(target, float(value)):
        result["verdict"] = NOISE
        result["note"] = _noise_note(target, entry or {}, float(value))
        return result
    met = _met(target, float(value))
    result["met"] = met
    result["verdict"] = MET if met else MISSED
    return result


def _noise_note(target: Target, entry: dict[str, Any], value: float) -> str:
    measured = _fmt_value(target, value)
    if target.metric == "overhead" and entry.get("ratio") is not None:
        measured = f"ours ran {entry['ratio']:.2f}x the {entry.get('compare', 'other')} side"
    return (
        f"measured {measured}, which no real run gives: the machine's noise is larger"
        " than the effect; rerun with more --repeat on a quieter machine"
    )


def all_verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target's verdict, in ``TARGETS`` order, for the scenarios that were asked for."""
    scenarios: dict[str, Any] = results["scenarios"]
    asked = results["meta"].get("only") or None
    out = []
    for target in TARGETS:
        if asked is not None and target.scenario not in asked:
            continue
        entry = scenarios.get(target.scenario)
        found = [v for v in (entry or {}).get("targets", []) if v["label"] == target.label]
        out.append(found[0] if found else verdict(target, entry))
    return out


def summarize(verdicts: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many targets got each verdict."""
    counts = dict.fromkeys((MET, MISSED, NOISE, UNMEASURED), 0)
    for v in verdicts:
        counts[v["verdict"]] += 1
    return counts


def summary_line(counts: dict[str, int]) -> str:
    """``targets: 7 met, 1 NOT MET, 1 noise`` (only the verdicts that occur)."""
    parts = [f"{counts[MET]} met"]
    parts += [f"{counts[k]} {VERDICT_WORDS[k] if k != UNMEASURED else 'not measured'}"
              for k in (MISSED, NOISE, UNMEASURED) if counts[k]]  # fmt: skip
    return f"targets: {', '.join(parts)} of {sum(counts.values())}"


_BOUND_FORMATS = {
    "us.2": "{op} {v:.1f} us",
    "ms.2": "{op} {v:.1f} ms",
    "%": "{op} {v:g} %",
    "B": "{op} {v:,.0f} B",
    "us": "{op} {v:,.0f} us",
    "ms": "{op} {v:,.0f} ms",
    "msgs": "{op} {v:,.0f}",
}
_VALUE_FORMATS = {
    "us.2": "{v:.2f} us",
    "ms.2": "{v:.2f} ms",
    "%": "{v:.1f} %",
    "B": "{v:,.0f} B",
    "us": "{v:,.0f} us",
    "ms": "{v:,.1f} ms",
    "msgs": "{v:,.0f}",
}


def _fmt_bound(t: Target) -> str:
    op = ">=" if t.at_least else ("<=" if t.inclusive else "<")
    bound = t.bound * 100 if t.unit == "%" else t.bound
    return _BOUND_FORMATS.get(t.unit, "{op} {v:g}x").format(op=op, v=bound)


def _fmt_value(t: Target, value: float | None) -> str:
    if value is None:
        return "-"
    shown = value * 100 if t.unit == "%" else value
    return _VALUE_FORMATS.get(t.unit, "{v:.2f}x").format(v=shown)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _side_line(title: str, side: str, s: dict[str, Any], note: str) -> str:
    rate = "stalls" if s.get("stalled") else _fmt(s.get("median"), ",.0f")
    return (
        f"{title:<46} {side:<9} {rate:>10} {_fmt(s.get('p50_us'), ',.0f'):>8} "
        f"{_fmt(s.get('p99_us'), ',.0f'):>8} {_fmt(s.get('cpu_us_per_delivery'), '.2f'):>8} "
        f"{_fmt(s.get('load_cpu_us_per_delivery'), '.2f'):>8} "
        f"{s.get('rss_bytes', 0) / 2**20:>7.1f}  {note}"
    )


def format_table(results: dict[str, Any]) -> str:
    """The figures per scenario and side, then the targets."""
    scenarios: dict[str, Any] = results["scenarios"]
    head = (
        f"{'scenario':<46} {'side':<9} {'deliv/s':>10} {'p50 us':>8} {'p99 us':>8} "
        f"{'cpu us':>8} {'load us':>8} {'RSS MiB':>7}  ours/other"
    )
    #: scenarios with a line of their own, below the table
    apart = ("memory", "footprint", "upgrade", "restart", "client")
    lines = [head, "-" * len(head)] if set(scenarios) - set(apart) else []
    left_out = {s.get("reference_left_out") for s in scenarios.values()} - {None, ""}
    if len(left_out) == 1:  # the same reason everywhere: say it once, above the table
        lines.insert(0, f"reference left out: {left_out.pop()}")
        left_out = set()
    for name, s in scenarios.items():
        if name in apart:
            continue
        if s["status"] != "ok":
            lines.append(f"{s['title']:<46} {s['status'].upper()}: {s.get('reason', '')}")
            continue
        title = s["title"]
        for side, figures in s["sides"].items():
            note = ""
            if side == "ours" and s.get("ratio") is not None and not s.get("fixed_rate"):
                note = f"{s['ratio']:.2f}x {s['compare']}"
            if figures.get("churn_per_s"):
                churn = f"beside {figures['churn_per_s']:,.0f} (un)subscriptions/s"
                note = f"{note}, {churn}" if note else churn
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
    foot = scenarios.get("footprint")
    if foot:
        lines += ["", *format_footprint(foot)]
    for name in ("upgrade", "restart"):
        if name in scenarios:
            lines += ["", format_continuity(scenarios[name])]
    if "client" in scenarios:
        lines += ["", *format_client(scenarios["client"])]
    if "fleet" in scenarios:
        lines += ["", *format_fleet(scenarios["fleet"])]
    lines += ["", *format_targets(results)]
    meta = results["meta"]
    runs = f"Medians of {meta['repeat']} interleaved runs" if meta["repeat"] != 1 else "One run"
    lines += [
        "",
        f"deliv/s: deliveries per second at the reading subscribers; p50/p99: send-to-receive "
        f"latency; cpu us: server CPU time per delivery; load us: the load generators' CPU "
        f"time per delivery (they share the cores); RSS: server memory after the run. "
        f"{runs}, {meta['payload_bytes']}-byte payloads.",
    ]
    if meta.get("hot_path"):
        lines.append(f"Our servers ran the {meta['hot_path']} hot path.")
    if "load_before" in meta:
        lines.append(
            f"Machine: {meta['cpus']} cores, load average {meta['load_before']:g} before the run"
            f" and {meta.get('load_after', meta['load_before']):g} after it."
        )
    return "\n".join(lines)


def format_continuity(entry: dict[str, Any]) -> str:
    """One line on traffic across an upgrade or a restart."""
    if entry["status"] != "ok":
        return f"{entry['title']}: {entry['status'].upper()}: {entry.get('reason', '')}"
    line = (
        f"{entry['title']}: {entry['delivered']:,} of {entry['expected']:,} delivered "
        f"({entry['rate']:,} msg/s for {entry['seconds']:g} s), {entry['gaps']} "
        f"{'gap' if entry['gaps'] == 1 else 'gaps'}, "
        f"{entry['reordered']} duplicated or reordered"
    )
    if "handover_ms" in entry:
        line += "; hand-over " + ", ".join(f"{ms:g}" for ms in entry["handover_ms"]) + " ms"
    if "relays_ready_ms" in entry:
        line += "; relays ready " + ", ".join(f"{ms:g}" for ms in entry["relays_ready_ms"])
        line += " ms after the new master listened"
    return line


def format_client(entry: dict[str, Any]) -> list[str]:
    """The client library's figures: subscriber rates, 2 -> 4 CPU, the restart."""
    if entry["status"] != "ok":
        return [f"{entry['title']}: {entry['status'].upper()}: {entry.get('reason', '')}"]
    lines = [f"{entry['title']} ({entry['messages']:,} messages):"]
    nats = entry["rates"].get("nats-py")
    for name, rate in entry["rates"].items():
        versus = f"  {rate / nats:.2f}x nats-py" if nats and name != "nats-py" else ""
        lines.append(f"  {name:<22} {rate:>12,.0f} msg/s{versus}")
    for side, cpu in entry["cpu_us_per_delivery_2to4"].items():
        lines.append(f"  2 -> 4 batched, {side:<7} {cpu:>8.2f} us server CPU per delivery")
    if entry.get("nats_left_out"):
        lines.append(f"  NATS left out: {entry['nats_left_out']}")
    r = entry["restart"]
    lines.append(
        f"  master restart at {r['rate']:,} msg/s: longest gap {r['gap_ms']:g} ms, "
        f"{r['lost']:,} of {r['published']:,} lost, {r['reordered']} reordered; "
        f"master away {r['master_down_ms']:g} ms"
    )
    return lines


#: The fleet scenario's sides, as its lines name them.
FLEET_SIDES = {
    "native": "two native nats-py clients",
    "buses": "through two buses (a client per message)",
    "batched": "through two buses, a batched sbus client",
    "limit": "nats-server between two C clients (the limit)",
}


def format_fleet(entry: dict[str, Any]) -> list[str]:
    """The fleet scenario's figures: each side, CPU per bus, memory, the load."""
    if entry.get("status") != "ok":
        return [f"fleet: {str(entry.get('status', '')).upper()}: {entry.get('reason', '')}"]
    lines = [f"fleet (engine {entry.get('engine') or '?'}), {entry['messages']:,} messages a run:"]
    for side, title in FLEET_SIDES.items():
        s = entry["sides"].get(side)
        if s is None:
            continue
        line = f"  {title:<48} {s['median']:>10,.0f} msg/s"
        if "p99_us" in s:
            line += (
                f"  p50/p99 at 10,000/s {_fmt(s['p50_us'], ',.0f')}/{_fmt(s['p99_us'], ',.0f')} us"
            )
        if "cpu_us_per_msg" in s:
            (ab, al), (bb, bl) = s["cpu_us_parts"]
            line += (
                f"  CPU per message: sending bus {ab:.2f} + its link {al:.2f} us,"
                f" receiving {bb:.2f} + {bl:.2f} us"
            )
        lines.append(line)
    for when in ("rss_idle", "rss_load"):
        if when in entry:
            shown = ", ".join(
                f"host {h}: master {r['master'] / 2**20:.1f} MiB + link {r['link'] / 2**20:.1f} MiB"
                for h, r in zip("ab", entry[when], strict=False)
            )
            lines.append(f"  RSS {'idle' if when == 'rss_idle' else 'under load'}: {shown}")
    lines.append(f"  load average {entry['load_before']:g} before, {entry['load_after']:g} after")
    if entry["load_max"] > LOAD_MAX:
        lines.append(f"  {loaded_note(entry['load_max'])}")
    return lines


def format_footprint(foot: dict[str, Any]) -> list[str]:
    """An idle relay's RSS beside its floor, and what it imports only when asked."""
    if foot["status"] != "ok":
        return [f"footprint: {foot['status'].upper()}: {foot.get('reason', '')}"]
    lines = [f"idle relay: {foot['idle_relay_rss'] / 2**20:.1f} MiB RSS (with its master)"]
    if "floor" not in foot:  # a JSON from before the floor: each library alone
        python = foot["imports"]["python"]
        lines.append(f"  {'a bare python':<34} {python / 2**20:>6.1f} MiB")
        for name, rss in foot["imports"].items():
            if name != "python":
                lines.append(f"  {'+ import ' + name:<34} {(rss - python) / 2**20:>6.1f} MiB")
        return lines
    lines.append("  its floor, in a fresh interpreter:")
    for name, rss in foot["floor"].items():
        lines.append(f"    {name:<46} {rss / 2**20:>6.1f} MiB")
    lines.append("  imported only when asked (over python alone):")
    for name, rss in foot["on_demand"].items():
        lines.append(f"    + {name:<44} {rss / 2**20:>6.1f} MiB")
    return lines


def format_targets(results: dict[str, Any]) -> list[str]:
    """One line per target: measured figure, bound, and the verdict (with its note
    when the figure is noise or missing), then the summary line."""
    lines = [f"{'target':<46} {'measured':>12} {'bound':>12}  met"]
    lines.append("-" * len(lines[0]))
    by_label = {t.label: t for t in TARGETS}
    verdicts = results.get("targets") or all_verdicts(results)
    for v in verdicts:
        target = by_label.get(v["label"])
        if v["verdict"] == NOISE:
            value = "noise"
        elif v["value"] is None:
            value = "no ref" if v["note"] == "no reference to compare with" else "-"
        else:
            value = _fmt_value(target, v["value"]) if target else f"{v['value']:g}"
        word = VERDICT_WORDS[v["verdict"]]
        shown = v["verdict"] == NOISE or (v["verdict"] == UNMEASURED and v["value"] is not None)
        note = f"  ({v['note']})" if shown and v["note"] else ""
        lines.append(f"{v['label']:<46} {value:>12} {v['target']:>12}  {word}{note}")
    lines += ["", summary_line(summarize(verdicts))]
    return lines
