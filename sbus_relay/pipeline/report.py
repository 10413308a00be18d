"""The human report of an analysis: ``report.md`` with PNG charts (matplotlib), and
``report.html``, one self-contained page (plotly, its JavaScript inlined) that works
offline, with zoom over time.

What it owns: the report's text, charts and page.  What it may touch: the
output directory.

Input is the small, already-collected ``AnalysisResult``; nothing here touches
Spark, so the report can be rebuilt or unit-tested without a session.

Charts are drawn to be read at a glance: rates per second (msgs/s and a byte unit
chosen from the data, e.g. MiB/s), every window drawn (an empty one is zero, so
lines never bridge silence), y axes from zero, time in UTC, bursts shaded on the
time series, losses marked.  Tables in the Markdown are never cut silently: a
long one shows its first rows, says "first N of M", and the full table is a CSV
file beside the report.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

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
#: Rows of a long table shown in report.md; all of them are in the CSV beside it.
MAX_REPORT_ROWS = 50
#: Byte units for rates and totals, with their sizes.
BYTE_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))


def byte_unit(largest: float) -> tuple[str, int]:
    """The unit in which ``largest`` reads as a number below 1024."""
    for name, size in BYTE_UNITS:
        if largest < size * 1024:
            return name, size
    return BYTE_UNITS[-1]


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


def _series(result: AnalysisResult) -> tuple[dict[str, dict[str, list[Any]]], float, list[str]]:
    """Per series: times (UTC datetimes), msgs/s and bytes/s; the width (s); names in order."""
    series: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"t": [], "m": [], "b": []})
    width_s = 1.0
    for row in result.chart_series:
        width_s = row["width_ns"] / 1e9
        s = series[row["series"]]
        s["t"].append(datetime.fromtimestamp(row["t"] / 1e9, UTC))
        s["m"].append(row["messages"] / width_s)
        s["b"].append(row["bytes"] / width_s)
    # Biggest series first, "(other)" last, so colours and legend are stable.
    names = sorted(series, key=lambda n: (n == OTHER, -sum(series[n]["m"]), n))
    return series, width_s, names


def _burst_spans(result: AnalysisResult) -> list[tuple[datetime, datetime, str, str]]:
    """(start, end, scope, prefix) of every burst window, UTC."""
    w = result.summary["options"]["window_seconds"]
    out = []
    for r in result.tables.get("bursts", []):
        start = datetime.fromtimestamp(r["window_start_ns"] / 1e9, UTC)
        end = datetime.fromtimestamp(r["window_start_ns"] / 1e9 + w, UTC)
        out.append((start, end, r["scope"], r["prefix"]))
    return out


def _loss_events(result: AnalysisResult) -> list[tuple[datetime, int]]:
    loss = result.summary.get("loss") or {}
    return [
        (datetime.fromtimestamp(e["time_ns"] / 1e9, UTC), e["dropped"])
        for e in loss.get("events", [])
    ]


#: The time-series charts: (field of ``_series``, file name).
TIME_CHARTS = (("m", "messages_per_window.png"), ("b", "bytes_per_window.png"))
#: The bar charts of ranked tables: (table, field, file name, title).
BAR_CHARTS = (
    ("top_keys_by_messages", "messages", "top_keys_messages.png", "top keys by messages"),
    ("top_keys_by_bytes", "bytes", "top_keys_bytes.png", "top keys by payload bytes"),
    ("instances", "messages", "instances.png", "messages per bus instance"),
)
#: The report's interactive page, drawn as one of its parts.
HTML_FILE = "report.html"


def warm_up() -> None:
    """Import and exercise matplotlib and plotly once (fonts found, figure
    classes built), so that a long-lived process draws its first report as
    fast as its later ones (``render``)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig, ax = plt.subplots(figsize=CHART_SIZE)
    ax.plot([0, 1], [0, 1], label="warm")
    ax.legend()
    fig.tight_layout()
    fig.savefig(io.BytesIO(), dpi=CHART_DPI)
    plt.close(fig)
    page = make_subplots(rows=2, cols=1)
    page.add_trace(go.Scatter(x=[0, 1], y=[0, 1]), row=1, col=1)
    page.to_html(full_html=False, include_plotlyjs=False)


def chart_list(result: AnalysisResult) -> list[tuple[str, str]]:
    """(title, file name) of the report's PNG charts, in report order, without
    drawing them: those the result has data for."""
    charts: list[tuple[str, str]] = []
    series, _, names = _series(result)
    if names:
        largest_b = max((max(series[n]["b"], default=0) for n in names), default=0)
        unit, _ = byte_unit(largest_b)
        charts += [("msgs/s per window", TIME_CHARTS[0][1]),
                   (f"{unit}/s per window", TIME_CHARTS[1][1])]  # fmt: skip
    if result.tables.get("size_histogram"):
        charts.append(("Payload sizes", "size_histogram.png"))
    for table, _, fname, title in BAR_CHARTS:
        if result.tables.get(table):
            charts.append((title.capitalize(), fname))
    return charts


def draw_part(result: AnalysisResult, out: Path, part: str) -> None:
    """Draw one part of the report into ``out``: a chart of ``chart_list`` by
    its file name, or HTML_FILE.  The parts are independent of each other, so
    they can be drawn in any order, or at the same time (``render``)."""
    if part == HTML_FILE:
        write_html(result, out / HTML_FILE)
        return
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    for field, fname in TIME_CHARTS:
        if part == fname:
            fig = _time_chart(result, field)
            break
    else:
        if part == "size_histogram.png":
            fig = _histogram_chart(result)
        else:
            (bar,) = [c for c in BAR_CHARTS if c[2] == part]
            fig = _bar_chart(result, bar[0], bar[1], bar[3])
    fig.savefig(out / part, dpi=CHART_DPI)
    plt.close(fig)


def _time_chart(result: AnalysisResult, field: str) -> Any:
    """Rates per window by key prefix (``field`` ``m``: msgs/s, ``b``: bytes/s),
    with bursts and losses marked."""
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    series, width_s, names = _series(result)
    bursts = _burst_spans(result)
    losses = _loss_events(result)
    largest_b = max((max(series[n]["b"], default=0) for n in names), default=0)
    unit, unit_size = byte_unit(largest_b)
    what = "msgs/s" if field == "m" else f"{unit}/s"
    fig, ax = plt.subplots(figsize=CHART_SIZE)
    scale = 1 if field == "m" else unit_size
    for name in names:
        points = series[name]["t"]
        values = [v / scale for v in series[name][field]]
        marker = "." if len(points) <= MAX_MARKED_POINTS else None
        # steps-post: a window's rate holds over the whole window; empty ones are 0.
        ax.plot(points, values, drawstyle="steps-post", marker=marker, lw=1, label=_label(name))
    burst_label = "burst (all traffic)"
    for start, end, scope, _prefix in bursts:
        if scope == "total":
            ax.axvspan(
                float(mdates.date2num(start)),
                float(mdates.date2num(end)),
                color="red",
                alpha=0.15,
                lw=0,
                label=burst_label,
            )
            burst_label = "_"
    prefix_bursts = [b for b in bursts if b[2] == "prefix"]
    if prefix_bursts:
        ax.plot(
            mdates.date2num([b[0] for b in prefix_bursts]), [0] * len(prefix_bursts), "r^",
            ms=7, clip_on=False, label="burst of a prefix",
        )  # fmt: skip
    if losses:
        ax.plot(
            mdates.date2num([t for t, _ in losses]), [0] * len(losses), "kx",
            ms=9, mew=2, clip_on=False, label="messages lost",
        )  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.set_title(f"{what} per {width_s:g} s window, by key prefix")
    ax.set_ylabel(what)
    ax.set_xlabel("time (UTC)")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M:%S", tz=UTC))
    fig.autofmt_xdate()
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def _histogram_chart(result: AnalysisResult) -> Any:
    """Messages per power-of-two payload size bucket."""
    import matplotlib.pyplot as plt

    hist = result.tables.get("size_histogram", [])
    fig, ax = plt.subplots(figsize=CHART_SIZE)
    labels = [f"≥{_human_bytes(r['min_size'])}" if r["bucket"] else "0 B" for r in hist]
    ax.bar(range(len(hist)), [r["messages"] for r in hist])
    ax.set_xticks(range(len(hist)), labels, rotation=45, ha="right", fontsize="small")
    ax.set_title("payload size distribution (power-of-two buckets)")
    ax.set_ylabel("messages")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


def _bar_chart(result: AnalysisResult, table: str, field: str, title: str) -> Any:
    """The first MAX_CHART_KEYS rows of a ranked table as horizontal bars."""
    import matplotlib.pyplot as plt

    rows = result.tables.get(table, [])[:MAX_CHART_KEYS]
    label_field = "instance" if table == "instances" else "key"
    fig, ax = plt.subplots(figsize=(CHART_SIZE[0], 1.0 + 0.35 * len(rows)))
    if field == "bytes":
        bunit, bsize = byte_unit(max(r[field] or 0 for r in rows))
        values = [(r[field] or 0) / bsize for r in rows]
        xlabel = f"payload {bunit}"
    else:
        values = [r[field] for r in rows]
        xlabel = field
    ax.barh([_label(r[label_field]) or "(empty)" for r in rows][::-1], values[::-1])
    ax.set_xlim(left=0)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    return fig


def _cut(rows: list[dict[str, Any]], what: str, csv_name: str) -> tuple[list[dict[str, Any]], str]:
    """The rows shown in report.md and a line saying so when they are not all of them."""
    if len(rows) <= MAX_REPORT_ROWS:
        return rows, ""
    return rows[:MAX_REPORT_ROWS], (
        f"First {MAX_REPORT_ROWS} of {len(rows):,} {what}; all of them are in "
        f"[`{csv_name}`]({csv_name})."
    )


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _loss_lines(summary: dict[str, Any]) -> list[str]:
    loss = summary.get("loss") or {}
    if loss.get("known"):
        n = loss.get("dropped") or 0
        if not n:
            lines = [f"- Loss: **none** (the bus dropped nothing for {loss['sessions']} "
                     "recorder session(s))"]  # fmt: skip
        else:
            events = len(loss.get("events", []))
            lines = [f"- Loss: **{n:,} messages dropped** by the bus for the recorder, not in "
                     f"these numbers ({events} loss event(s), marked x on the charts)"]  # fmt: skip
    else:
        reason = loss.get("reason", "unknown")
        at_least = loss.get("dropped_at_least") or 0
        extra = f"; at least {at_least:,} messages were dropped" if at_least else ""
        lines = [f"- Loss: **unknown** ({reason}){extra}"]
    if loss.get("unfinished_sessions"):  # a killed recorder: its last second may be missing
        lines.append(
            f"- {loss['unfinished_sessions']} recorder session(s) did not finish (killed?): "
            "up to their last second of traffic is missing"
        )
    return lines


class PartDrawer(Protocol):
    """Draws parts of a report (``draw_part``) into ``out``, all of them before it
    returns: ``render.Renderer`` draws them in parallel."""

    def draw(self, result: AnalysisResult, out: Path, parts: list[str]) -> None: ...


def write_report(
    result: AnalysisResult,
    out_dir: str | Path,
    *,
    html: bool = True,
    drawer: PartDrawer | None = None,
) -> Path:
    """Write ``report.md``, its charts and CSVs, and ``report.html`` (unless ``html`` is
    false) into ``out_dir``; return the Markdown report's path.  The charts and the
    page are drawn by ``drawer`` when given, else here, one after the other."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = result.summary
    opts = s["options"]
    pcols = [percentile_name(q) for q in opts["percentiles"]]
    charts = chart_list(result)
    span_s = (s["last_ns"] - s["first_ns"]) / 1e9 if s["messages"] else 0.0

    lines = [
        "# sbus traffic report",
        "",
        f"- Messages: **{s['messages']:,}**, payload bytes: **{_human_bytes(s['bytes'])}**",
        f"- From {_when(s['first_ns'])} to {_when(s['last_ns'])} ({span_s:,.1f} s)",
        f"- {s['keys']:,} distinct keys in {s['prefixes']:,} prefixes (depth {opts['depth']}), "
        f"{s['instances']:,} bus instance(s), {s['windows']:,} non-empty of "
        f"{s.get('span_windows', s['windows']):,} {opts['window_seconds']:g} s windows",
        "- Payload size percentiles: "
        + ", ".join(f"{c} = {_num(s['size_percentiles'].get(c))} B" for c in pcols),
        *_loss_lines(s),
        "",
        "Parquet tables with every number are beside this file; `summary.json` has the "
        "totals; `report.html` is this report with zoomable charts.",
        "",
    ]
    for title, fname in charts:
        lines += [f"## {title}", "", f"![{title}]({fname})", ""]

    prefixes = result.tables.get("size_percentiles", [])
    _write_csv(prefixes, out / "size_percentiles.csv")
    shown, note = _cut(prefixes, "prefixes", "size_percentiles.csv")
    lines += ["## Payload size by prefix", ""]
    if note:
        lines += [note, ""]
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
            for r in shown
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
    per_instance = result.tables.get("instance_prefixes", [])
    if len(result.tables.get("instances", [])) > 1:
        _write_csv(per_instance, out / "instance_prefixes.csv")
        shown, note = _cut(per_instance, "rows", "instance_prefixes.csv")
        lines += ["## Traffic per bus instance and prefix", ""]
        lines += [note, ""] if note else []
        lines += _table(
            ["instance", "prefix", "messages", "bytes"],
            [
                [_md(r["instance"]), _md(r["prefix"]), _num(r["messages"]),
                 _human_bytes(r["bytes"])]
                for r in shown
            ],
        )  # fmt: skip
    bursts = result.tables.get("bursts", [])
    _write_csv(bursts, out / "bursts.csv")
    shown, note = _cut(bursts, "bursts", "bursts.csv")
    lines += [
        "## Bursts",
        "",
        f"Windows with at least {opts['burst_factor']:g}x the median messages per "
        f"{opts['window_seconds']:g} s window of their scope over the whole capture (empty "
        f"windows count as zero), and at least {opts['burst_min_messages']} messages; "
        'strongest first (a ratio of "new": the scope is usually silent).',
        "",
    ]
    if note:
        lines += [note, ""]
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
                    "new" if r["ratio"] is None else f"{r['ratio']:.1f}x",
                ]
                for r in shown
            ],
        )
    else:
        lines += ["No bursts.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    parts = [fname for _, fname in charts]
    if html:
        parts.insert(0, HTML_FILE)  # the largest part first: the others fill in around it
    if drawer is not None:
        drawer.draw(result, out, parts)
    else:
        for part in parts:
            draw_part(result, out, part)
    return path


def write_html(result: AnalysisResult, path: Path) -> Path:
    """One self-contained page (plotly.js inlined: works offline): summary, losses,
    zoomable rate charts over time with bursts and losses marked, the burst table."""
    import html as h

    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = result.summary
    series, width_s, names = _series(result)
    largest_b = max((max(series[n]["b"], default=0) for n in names), default=0)
    unit, unit_size = byte_unit(largest_b)
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
        subplot_titles=(f"msgs/s per {width_s:g} s window", f"{unit}/s per {width_s:g} s window"),
    )  # fmt: skip
    for i, name in enumerate(names):
        for row, field, scale in ((1, "m", 1), (2, "b", unit_size)):
            fig.add_trace(
                go.Scatter(
                    x=series[name]["t"], y=[v / scale for v in series[name][field]],
                    name=name, legendgroup=name, showlegend=row == 1, line_shape="hv",
                    line={"color": _COLOURS[i % len(_COLOURS)]},
                ),
                row=row, col=1,
            )  # fmt: skip
    for start, end, scope, _prefix in _burst_spans(result):
        if scope == "total":
            for row in (1, 2):
                fig.add_vrect(x0=start, x1=end, fillcolor="red", opacity=0.15, line_width=0,
                              row=row, col=1)  # fmt: skip
    prefix_bursts = [b for b in _burst_spans(result) if b[2] == "prefix"]
    if prefix_bursts:
        fig.add_trace(
            go.Scatter(
                x=[b[0] for b in prefix_bursts], y=[0] * len(prefix_bursts), mode="markers",
                marker={"symbol": "triangle-up", "color": "red", "size": 10},
                name="burst of a prefix", text=[b[3] for b in prefix_bursts],
            ),
            row=1, col=1,
        )  # fmt: skip
    losses = _loss_events(result)
    if losses:
        fig.add_trace(
            go.Scatter(
                x=[t for t, _ in losses], y=[0] * len(losses), mode="markers",
                marker={"symbol": "x", "color": "black", "size": 11},
                name="messages lost", text=[f"{n:,} lost" for _, n in losses],
            ),
            row=1, col=1,
        )  # fmt: skip
    fig.update_yaxes(rangemode="tozero", title_text="msgs/s", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", title_text=f"{unit}/s", row=2, col=1)
    fig.update_xaxes(title_text="time (UTC)", rangeslider={"visible": True}, row=2, col=1)
    fig.update_layout(height=800, hovermode="x unified", margin={"t": 40})
    chart = fig.to_html(full_html=False, include_plotlyjs=True) if names else "<p>No traffic.</p>"

    def table(headers: list[str], rows: list[list[str]]) -> str:
        head = "".join(f"<th>{h.escape(x)}</th>" for x in headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{h.escape(c)}</td>" for c in r) + "</tr>" for r in rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    facts = [
        f"Messages: {s['messages']:,}; payload bytes: {_human_bytes(s['bytes'])}",
        f"From {_when(s['first_ns'])} to {_when(s['last_ns'])}",
        f"{s['keys']:,} distinct keys in {s['prefixes']:,} prefixes, "
        f"{s['instances']:,} bus instance(s)",
        *[x.removeprefix("- ").replace("**", "") for x in _loss_lines(s)],
    ]
    bursts = result.tables.get("bursts", [])
    burst_rows = [
        [
            r["scope"], r["prefix"] if r["scope"] == "prefix" else "(all)",
            _when(r["window_start_ns"]), _num(r["messages"]), _num(r["median_messages"]),
            "new" if r["ratio"] is None else f"{r['ratio']:.1f}x",
        ]
        for r in bursts
    ]  # fmt: skip
    top = [
        [str(r["rank"]), r["key"], _num(r["messages"]), _human_bytes(r["bytes"])]
        for r in result.tables.get("top_keys_by_messages", [])
    ]
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>sbus traffic report</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}</style></head><body>
<h1>sbus traffic report</h1>
<ul>{"".join(f"<li>{h.escape(x)}</li>" for x in facts)}</ul>
<p>Drag over a chart to zoom in time, double-click to zoom out; the slider below the
charts pans.  Shaded: bursts of all traffic; red triangles: bursts of one prefix;
black crosses: messages the bus dropped for the recorder.  Times are UTC.</p>
{chart}
<h2>Bursts ({len(bursts):,})</h2>
{
        table(["scope", "prefix", "window start", "messages", "median", "ratio"], burst_rows)
        if bursts
        else "<p>No bursts.</p>"
    }
<h2>Top keys by messages</h2>
{table(["#", "key", "messages", "bytes"], top)}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


#: Series colours shared by both HTML charts (plotly's default palette).
_COLOURS = (
    "#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a",
    "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52",
)  # fmt: skip
