"""The analysis in DuckDB: the benchmark's peer, computing everything ``analyze`` writes.

What it owns: the DuckDB analysis that checks analyze's tables.  What it may
touch: the capture files it reads, the output directory it writes.

    python -m sbus_relay.bench.peer CAPTURE_DIR OUT_DIR

The same inputs (the capture files, their footers giving the span and so the
window, as ``analyze`` does), the same seven tables and the same summary
figures, with the same definitions (``analyze``'s docstring): prefixes cut at
``DEPTH`` segments, windows aligned on the epoch, exact percentiles
interpolated like Spark's ``percentile``, the burst medians over every window
of the span.  Tables go to ``OUT_DIR/<table>.parquet``, the summary to
``OUT_DIR/summary.json``; the last line printed is ``analysis N s``, the time
from connecting to the files written.  ``same_tables`` compares an output with
analyze's, so the benchmark can show the two did the same work.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sbus_relay.pipeline.analyze import (
    PERCENTILES,
    TABLES,
    AnalyzeOptions,
    percentile_name,
)
from sbus_relay.pipeline.inputs import resolve
from sbus_relay.pipeline.windows import auto_window, recorded_windows, rhythm_window

#: Statements of ``queries`` that aggregate the captures (the rest derive tables).
AGGREGATES = 4
#: Options of the comparison: analyze's defaults.
OPTIONS = AnalyzeOptions()


def _percentile_sql(q: float, name: str) -> str:
    """Spark's ``percentile`` from cumulative counts ``cum`` of ascending ``size``
    per group (``total`` rows): the values at the floor and ceiling ranks of
    ``(total - 1) * q``, interpolated as ``(hi - pos) * low + (pos - lo) * high``."""
    pos = f"((total - 1)::double * {q!r}::double)"
    low = f"min(size) filter (where cum >= floor({pos}) + 1)"
    high = f"min(size) filter (where cum >= ceil({pos}) + 1)"
    return (
        f"case when any_value(total) is null then null "
        f"when floor(any_value({pos})) = ceil(any_value({pos})) or {low} = {high} "
        f"then {low}::double "
        f"else (ceil(any_value({pos})) - any_value({pos})) * {low}::double "
        f"+ (any_value({pos}) - floor(any_value({pos}))) * {high}::double end as {name}"
    )


def rebin_sql(window_ns: int) -> str:
    """The cells summed into longer windows (the traffic's rhythm, ``rhythm_window``)."""
    w = window_ns
    return (
        "create or replace temp table cells as select prefix, "
        f"(window_start_ns // {w}) * {w} as window_start_ns, instance, "
        "sum(messages)::bigint as messages, sum(bytes)::bigint as bytes, "
        "min(first_ns) as first_ns, max(last_ns) as last_ns from cells group by all"
    )


def queries(files: list[str], opts: AnalyzeOptions, windows: int, out: str) -> list[str]:
    """The statements, in order: the captures and three aggregates of them (AGGREGATES),
    then the tables; ``windows`` is the number of windows the burst medians run over."""
    w = opts.window_ns
    depth = opts.depth
    # Everything before the depth-th "/": Spark's substring_index(key, "/", depth).
    prefix = f"regexp_extract(key, '^[^/]*(/[^/]*){{0,{depth - 1}}}')"
    src = "read_parquet([" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "])"
    base = (
        f"select time_ns, key, size::bigint as size, instance, {prefix} as prefix, "
        f"(time_ns // {w}) * {w} as window_start_ns from {src}"
    )
    qs = opts.percentiles
    names = [percentile_name(q) for q in qs]
    pcts = ", ".join(_percentile_sql(q, n) for q, n in zip(qs, names, strict=True))
    n = max(1, windows)
    pos = (n - 1) / 2
    lo, hi = math.floor(pos), math.ceil(pos)
    ts = "make_timestamp(window_start_ns // 1000) as window_start"

    def copy(select: str, name: str) -> str:
        return f"copy ({select}) to '{out}/{name}.parquet' (format parquet)"

    return [
        f"create temp view base as {base}",
        "create temp table cells as select prefix, window_start_ns, instance, "
        "count(*) as messages, sum(size)::bigint as bytes, min(time_ns) as first_ns, "
        "max(time_ns) as last_ns from base group by all",
        "create temp table sizes as select prefix, size, count(*) as n from base group by all",
        "create temp table keys as select key, count(*) as messages, sum(size)::bigint as bytes "
        "from base group by all",
        "create temp table pw as select prefix, window_start_ns, "
        "sum(messages)::bigint as messages, sum(bytes)::bigint as bytes from cells group by all",
        copy(f"select prefix, window_start_ns, {ts}, messages, bytes from pw", "prefix_windows"),
        copy(
            "with s as (select prefix, size, n, "
            "sum(n) over (partition by prefix order by size) as cum, "
            "sum(n) over (partition by prefix) as total from sizes where size is not null), "
            f"p as (select prefix, {pcts} from s group by prefix), "
            "t as (select prefix, sum(n)::bigint as messages, sum(size * n)::bigint as bytes, "
            "max(size) as max_size from sizes group by prefix) "
            "select t.prefix, messages, bytes, bytes / messages as mean_size, "
            f"{', '.join(names)}, max_size "
            "from t left join p on t.prefix is not distinct from p.prefix",
            "size_percentiles",
        ),
        copy(
            "select row_number() over (order by messages desc, bytes desc, key)::int as rank, "
            f"key, messages, bytes from keys order by rank limit {opts.top}",
            "top_keys_by_messages",
        ),
        copy(
            "select row_number() over (order by bytes desc, messages desc, key)::int as rank, "
            f"key, messages, bytes from keys order by rank limit {opts.top}",
            "top_keys_by_bytes",
        ),
        copy(
            "select instance, sum(messages)::bigint as messages, sum(bytes)::bigint as bytes, "
            "min(first_ns) as first_ns, max(last_ns) as last_ns from cells group by all",
            "instances",
        ),
        copy(
            "select instance, prefix, sum(messages)::bigint as messages, "
            "sum(bytes)::bigint as bytes from cells group by all",
            "instance_prefixes",
        ),
        copy(
            "with scoped as (select 'prefix' as scope, prefix, window_start_ns, messages, bytes "
            "from pw union all select 'total', '', window_start_ns, sum(messages)::bigint, "
            "sum(bytes)::bigint from pw group by window_start_ns), "
            "ranked as (select scope, prefix, messages, "
            "row_number() over (partition by scope, prefix order by messages) - 1 as rn, "
            "count(*) over (partition by scope, prefix) as k from scoped), "
            f"m as (select scope, prefix, "
            f"coalesce(max(messages) filter (where rn = {lo} - ({n} - k)), 0)::double as lo_v, "
            f"coalesce(max(messages) filter (where rn = {hi} - ({n} - k)), 0)::double as hi_v "
            "from ranked group by all), "
            f"b as (select s.*, lo_v + (hi_v - lo_v) * {pos - lo!r}::double as median_messages "
            "from scoped s join m using (scope, prefix)) "
            f"select scope, prefix, window_start_ns, {ts}, messages, bytes, median_messages, "
            "case when median_messages > 0 then messages / median_messages end as ratio "
            f"from b where messages >= median_messages * {opts.burst_factor!r}::double "
            f"and messages >= {opts.burst_min_messages}",
            "bursts",
        ),
        copy(
            "with b as (select case when size = 0 then 0 else "
            "least(floor(log2(size))::int + 1, 20) end as bucket, n from sizes) "
            "select bucket, case when bucket = 0 then 0 else (1 << (bucket - 1)) end::int "
            "as min_size, sum(n)::bigint as messages from b group by bucket",
            "size_histogram",
        ),
    ]


def summary_sql(opts: AnalyzeOptions) -> str:
    """The summary's figures from the aggregates (the tables above are written)."""
    pcts = ", ".join(_percentile_sql(q, percentile_name(q)) for q in opts.percentiles)
    return (
        "with a as (select size, sum(n)::bigint as n from sizes "
        "where size is not null group by size), "
        "s as (select size, n, sum(n) over (order by size) as cum, sum(n) over () as total "
        f"from a), p as (select {pcts} from s) "
        "select (select sum(messages) from cells), (select sum(bytes) from cells), "
        "(select min(first_ns) from cells), (select max(last_ns) from cells), "
        "(select count(distinct window_start_ns) from pw), "
        "(select count(distinct prefix) from pw), (select count(*) from keys), "
        "(select count(distinct instance) from cells), p.* from p"
    )


def analyse(directory: str, out: str, opts: AnalyzeOptions = OPTIONS) -> float:
    """Run the peer analysis of the captures under ``directory`` into ``out``; return
    the seconds from connecting to DuckDB to everything written (the footers are
    read before, as analyze reads them before Spark starts)."""
    import duckdb

    inputs = resolve([directory], recover_journals=False)
    first, last = inputs.first_ns, inputs.last_ns
    span = None if first is None or last is None else last - first
    base = replace(opts, window_seconds=auto_window(span))
    Path(out).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    con = duckdb.connect()
    aggregates = queries(inputs.paths, base, 1, out)[:AGGREGATES]
    for sql in aggregates:
        con.execute(sql)
    # The window follows the traffic's rhythm, and the bursts the recorded windows,
    # with analyze's own functions.
    totals = con.sql(
        "select window_start_ns, sum(messages)::bigint as messages from cells group by all"
    ).to_arrow_table()
    w = rhythm_window(totals, base.window_ns)
    if w != base.window_ns:
        con.execute(rebin_sql(w))
    opts = replace(base, window_seconds=w / 1e9)
    active = [r[0] for r in con.execute("select distinct window_start_ns from cells").fetchall()]
    sessions = inputs.losses.intervals if inputs.losses is not None else []
    recorded = recorded_windows(w, first, last, sessions, active)
    span_windows = 1 if first is None or last is None else last // w - first // w + 1
    for sql in queries(inputs.paths, opts, recorded, out)[AGGREGATES:]:
        con.execute(sql)
    row = con.execute(summary_sql(opts)).fetchone()
    assert row is not None
    con.close()
    keys = ["messages", "bytes", "first_ns", "last_ns", "windows", "prefixes", "keys"]
    summary: dict[str, Any] = dict(zip(keys, row[:7], strict=True))
    summary["instances"] = row[7]
    summary["span_windows"] = span_windows
    summary["recorded_windows"] = recorded
    summary["size_percentiles"] = dict(
        zip([percentile_name(q) for q in opts.percentiles], row[8:], strict=True)
    )
    summary["options"] = {**asdict(opts), "percentiles": list(opts.percentiles)}
    Path(out, "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return time.monotonic() - t0


def _rows(table: Any) -> list[tuple[Any, ...]]:
    """A table's rows, timestamp columns left out, floats rounded to 9 significant digits."""
    import pyarrow as pa

    cols = [
        c for c, t in zip(table.column_names, table.schema.types, strict=True)
        if not pa.types.is_timestamp(t)
    ]  # fmt: skip
    out = []
    for r in table.select(sorted(cols)).to_pylist():
        out.append(tuple(float(f"{v:.9g}") if isinstance(v, float) else v for v in r.values()))
    return sorted(out, key=repr)


def same_tables(peer_out: str, analyze_out: str) -> list[str]:
    """The tables (and summary figures) on which the peer and analyze differ."""
    import pyarrow.parquet as pq

    differ = []
    for name in TABLES:
        a = pq.read_table(Path(peer_out, f"{name}.parquet"))
        b = pq.read_table(Path(analyze_out, name))
        if _rows(a) != _rows(b):
            differ.append(name)
    a_sum = json.loads(Path(peer_out, "summary.json").read_text())
    b_sum = json.loads(Path(analyze_out, "summary.json").read_text())
    for key in ("messages", "bytes", "first_ns", "last_ns", "windows", "span_windows",
                "recorded_windows", "prefixes", "keys", "instances"):  # fmt: skip
        if a_sum[key] != b_sum[key]:
            differ.append(f"summary.{key}")
    for name, value in a_sum["size_percentiles"].items():
        other = b_sum["size_percentiles"][name]
        if (value is None) != (other is None) or (
            value is not None and not math.isclose(value, other, rel_tol=1e-9)
        ):
            differ.append(f"summary.{name}")
    return differ


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sbus_relay.bench.peer CAPTURE_DIR OUT_DIR", file=sys.stderr)
        return 2
    print(f"analysis {analyse(args[0], args[1]):.2f} s")
    return 0


assert OPTIONS.percentiles == PERCENTILES

if __name__ == "__main__":
    sys.exit(main())
