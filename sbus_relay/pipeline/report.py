"""The human report of an analysis: ``report.md`` plus PNG charts (matplotlib).

Input is the small, already-collected ``AnalysisResult``; nothing here touches
Spark, so the report can be rebuilt or unit-tested without a session.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .analyze import OTHER, AnalysisResult, percentile_name

#: Chart size in inches (at CHART_DPI): wide enough for a day of minute windows.
CHART_SIZE = (11.0, 4.5)
#: Chart resolution; 100 dpi keeps each PNG well under 200 KB.
CHART_DPI = 100
#: Longest key shown in full in tables and bar labels; longer ones are elided.
MAX_LABEL = 60
#: Series longer than this are drawn as plain lines: dots would blot them out.
MAX_MARKED_POINTS = 120
#: Keys drawn in the top-keys bar chart.
MAX_CHART_KEYS = 15


def _label(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _md(text: str) -> str:
    """Text made safe inside a Markdown table cell and code span."""
    return "`" + _label(text).replace("`", "'").replace("|", "\\|") + "`" if text else "`(empty)`"


def _when(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.1f}"
    return f"{x:,}"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return [*lines, ""]


def _charts(result: AnalysisResult, out: Path) -> list[tuple[str, str]]:
    """Draw the PNGs; return (title, file name) pairs in report order."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    charts: list[tuple[str, str]] = []
    series: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"t": [], "m": [], "b": []})
    width_s = 0.0
    for row in result.chart_series:
        s = series[row["series"]]
        s["t"].append(datetime.fromtimestamp(row["t"] / 1e9, UTC))
        s["m"].append(row["messages"])
        s["b"].append(row["bytes"])
        width_s = row["width_ns"] / 1e9
    # Biggest series first, "(other)" last, so colours and legend are stable.
    names = sorted(series, key=lambda n: (n == OTHER, -sum(series[n]["m"]), n))
    for field, what, fname in (
        ("m", "messages", "messages_per_window.png"),
        ("b", "payload bytes", "bytes_per_window.png"),
    ):
        if not names:
            break
        fig, ax = plt.subplots(figsize=CHART_SIZE)
        for name in names:
            points = series[name]["t"]
            marker = "." if len(points) <= MAX_MARKED_POINTS else None
            ax.plot(points, series[name][field], marker=marker, lw=1, label=_label(name))
        ax.set_title(f"{what} per {width_s:g} s window, by key prefix")
        ax.set_ylabel(what)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M:%S"))
        fig.autofmt_xdate()
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        fig.savefig(out / fname, dpi=CHART_DPI)
        plt.close(fig)
        charts.append((f"{what.capitalize()} per window", fname))

    hist = result.tables.get("size_histogram", [])
    if hist:
        fig, ax = plt.subplots(figsize=CHART_SIZE)
        labels = [f"≥{_human_bytes(r['min_size'])}" if r["bucket"] else "0 B" for r in hist]
        ax.bar(range(len(hist)), [r["messages"] for r in hist])
        ax.set_xticks(range(len(hist)), labels, rotation=45, ha="right", fontsize="small")
        ax.set_title("payload size distribution (power-of-two buckets)")
        ax.set_ylabel("messages")
        fig.tight_layout()
        fig.savefig(out / "size_histogram.png", dpi=CHART_DPI)
        plt.close(fig)
        charts.append(("Payload sizes", "size_histogram.png"))

    for table, field, fname, title in (
        ("top_keys_by_messages", "messages", "top_keys_messages.png", "top keys by messages"),
        ("top_keys_by_bytes", "bytes", "top_keys_bytes.png", "top keys by payload bytes"),
        ("instances", "messages", "instances.png", "messages per bus instance"),
    ):
        rows = result.tables.get(table, [])[:MAX_CHART_KEYS]
        if not rows:
            continue
        label_field = "instance" if table == "instances" else "key"
        fig, ax = plt.subplots(figsize=(CHART_SIZE[0], 1.0 + 0.35 * len(rows)))
        ax.barh(
            [_label(r[label_field]) or "(empty)" for r in rows][::-1],
            [r[field] for r in rows][::-1],
        )
        ax.set_title(title)
        ax.set_xlabel(field)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=CHART_DPI)
        plt.close(fig)
        charts.append((title.capitalize(), fname))
    return charts


def write_report(result: AnalysisResult, out_dir: str | Path) -> Path:
    """Write ``report.md`` and its charts into ``out_dir``; return the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = result.summary
    opts = s["options"]
    pcols = [percentile_name(q) for q in opts["percentiles"]]
    charts = _charts(result, out)
    span_s = (s["last_ns"] - s["first_ns"]) / 1e9 if s["messages"] else 0.0

    lines = [
        "# sbus traffic report",
        "",
        f"- Messages: **{s['messages']:,}**, payload bytes: **{_human_bytes(s['bytes'])}**",
        f"- From {_when(s['first_ns'])} to {_when(s['last_ns'])} ({span_s:,.1f} s)",
        f"- {s['keys']:,} distinct keys in {s['prefixes']:,} prefixes (depth {opts['depth']}), "
        f"{s['instances']:,} bus instance(s), {s['windows']:,} non-empty "
        f"{opts['window_seconds']:g} s windows",
        "- Payload size percentiles: "
        + ", ".join(f"{c} = {_num(s['size_percentiles'].get(c))} B" for c in pcols),
        "",
        "Parquet tables with every number are beside this file; `summary.json` has the totals.",
        "",
    ]
    for title, fname in charts:
        lines += [f"## {title}", "", f"![{title}]({fname})", ""]

    lines += ["## Payload size by prefix", ""]
    lines += _table(
        ["prefix", "messages", "bytes", "mean", *pcols, "max"],
        [
            [
                _md(r["prefix"]),
                _num(r["messages"]),
                _human_bytes(r["bytes"]),
                _num(r["mean_size"]),
                *[_num(r[c]) for c in pcols],
                _num(r["max_size"]),
            ]
            for r in result.tables.get("size_percentiles", [])
        ],
    )
    for table, title in (
        ("top_keys_by_messages", "Top keys by messages"),
        ("top_keys_by_bytes", "Top keys by bytes"),
    ):
        lines += [f"## {title}", ""]
        lines += _table(
            ["#", "key", "messages", "bytes"],
            [
                [str(r["rank"]), _md(r["key"]), _num(r["messages"]), _human_bytes(r["bytes"])]
                for r in result.tables.get(table, [])
            ],
        )
    lines += ["## Traffic per bus instance", ""]
    lines += _table(
        ["instance", "messages", "bytes", "first", "last"],
        [
            [
                _md(r["instance"]),
                _num(r["messages"]),
                _human_bytes(r["bytes"]),
                _when(r["first_ns"]),
                _when(r["last_ns"]),
            ]
            for r in result.tables.get("instances", [])
        ],
    )
    bursts = result.tables.get("bursts", [])
    lines += [
        "## Bursts",
        "",
        f"Windows with at least {opts['burst_factor']:g}x the median messages per non-empty "
        f"window of their scope (and at least {opts['burst_min_messages']} messages), "
        "strongest first.",
        "",
    ]
    if bursts:
        lines += _table(
            ["scope", "prefix", "window start", "messages", "median", "ratio"],
            [
                [
                    r["scope"],
                    _md(r["prefix"]) if r["scope"] == "prefix" else "(all)",
                    _when(r["window_start_ns"]),
                    _num(r["messages"]),
                    _num(r["median_messages"]),
                    f"{r['ratio']:.1f}x",
                ]
                for r in bursts
            ],
        )
    else:
        lines += ["No bursts.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
