"""The result tables, derived on the driver from the job's small aggregates (pyarrow).

What it owns: the result tables' definitions, computed from the job's small
sets.  What it may touch: the arrays it is given (pyarrow).

The Spark job (``analyze.compute``) scans the captures once into per-(prefix,
window, instance) and per-(prefix, size) counts, whose size depends on the
number of prefixes, windows, instances and distinct payload sizes (at most
409,600), not on the traffic.  Everything in this module works on those
counts: sums over groups, exact percentiles weighted by count, the medians of
the burst test.  Each definition matches ``analyze``'s docstring, and
percentiles follow Spark's ``percentile`` (linear interpolation between the
closest ranks) operation for operation, so a table does not depend on where it
was computed.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Size histogram buckets: powers of two up to the largest sbus packet (409,600 B).
HISTOGRAM_MAX_EXPONENT = 19

TIMESTAMP = pa.timestamp("us", tz="UTC")


def _window_start(ns: Any) -> Any:
    """``window_start_ns`` as a UTC timestamp (microseconds), like Spark's ``timestamp_micros``."""
    return pc.cast(pc.divide(ns, 1000), pa.int64()).cast(TIMESTAMP)


def prefix_windows(cells: pa.Table) -> pa.Table:
    """Messages and bytes per (prefix, window)."""
    g = (
        cells.group_by(["prefix", "window_start_ns"], use_threads=False)
        .aggregate([("messages", "sum"), ("bytes", "sum")])
        .sort_by([("prefix", "ascending"), ("window_start_ns", "ascending")])
    )
    return pa.table(
        {
            "prefix": g["prefix"],
            "window_start_ns": g["window_start_ns"],
            "window_start": _window_start(g["window_start_ns"]),
            "messages": g["messages_sum"],
            "bytes": g["bytes_sum"],
        }
    )


def instances(cells: pa.Table) -> pa.Table:
    """Messages, bytes, first and last receive time per instance."""
    g = cells.group_by("instance", use_threads=False).aggregate(
        [("messages", "sum"), ("bytes", "sum"), ("first_ns", "min"), ("last_ns", "max")]
    )
    return pa.table(
        {
            "instance": g["instance"],
            "messages": g["messages_sum"],
            "bytes": g["bytes_sum"],
            "first_ns": g["first_ns_min"],
            "last_ns": g["last_ns_max"],
        }
    )


def weighted_percentiles(
    values: Sequence[int], counts: Sequence[int], qs: Sequence[float]
) -> list[float | None]:
    """Exact percentiles of ``values`` (ascending, distinct) occurring ``counts`` times.

    Spark's ``percentile`` step by step: position ``(N - 1) * q``, the values at
    its floor and ceiling ranks found in the cumulative counts, and
    ``(higher - position) * low + (position - lower) * high`` between them.
    """
    if not values:
        return [None for _ in qs]
    cum = list(accumulate(counts))
    out: list[float | None] = []
    for q in qs:
        position = (cum[-1] - 1) * q
        lower, higher = math.floor(position), math.ceil(position)
        low = values[bisect_left(cum, lower + 1)]
        if higher == lower:
            out.append(float(low))
            continue
        high = values[bisect_left(cum, higher + 1)]
        if high == low:
            out.append(float(low))
        else:
            out.append((higher - position) * float(low) + (position - lower) * float(high))
    return out


class _Ints(Sequence[int]):
    """An Arrow integer array read as a Python sequence, one element at a time:
    bisection looks at a few of its elements, never converts all of them."""

    def __init__(self, array: pa.Array) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: Any) -> Any:
        return self.array[i].as_py()


def _run_percentiles(
    values: Sequence[int], cum: Sequence[int], start: int, end: int, qs: Sequence[float]
) -> list[float | None]:
    """``weighted_percentiles`` of the rows ``start:end`` of ascending ``values``
    whose counts' running total (over all rows) is ``cum``: the same steps, on
    the run's ranks, without copying it out."""
    base = cum[start - 1] if start else 0
    out: list[float | None] = []
    for q in qs:
        position = (cum[end - 1] - base - 1) * q
        lower, higher = math.floor(position), math.ceil(position)
        low = values[bisect_left(cum, base + lower + 1, start, end)]
        if higher == lower:
            out.append(float(low))
            continue
        high = values[bisect_left(cum, base + higher + 1, start, end)]
        if high == low:
            out.append(float(low))
        else:
            out.append((higher - position) * float(low) + (position - lower) * float(high))
    return out


def size_percentiles(sizes: pa.Table, qs: Sequence[float], names: Sequence[str]) -> pa.Table:
    """Per prefix: messages, bytes, mean size, the ``qs`` percentiles and the largest size.
    The sizes sorted by prefix and size once, each prefix's percentiles are
    found by bisection in its run of them (``_run_percentiles``)."""
    weighted = sizes.append_column("_bytes", pc.multiply(sizes["size"], sizes["n"]))
    g = weighted.group_by("prefix", use_threads=False).aggregate(
        [("n", "sum"), ("_bytes", "sum"), ("size", "max")]
    )
    known = sizes.filter(pc.is_valid(sizes["size"])).sort_by(
        [("prefix", "ascending"), ("size", "ascending")]
    )
    per_prefix: dict[Any, list[float | None]] = {}
    if known.num_rows:
        values = _Ints(known["size"].combine_chunks())
        cum = _Ints(pc.cumulative_sum(known["n"]).combine_chunks())
        runs = pc.run_end_encode(known["prefix"].combine_chunks())
        start = 0
        for prefix, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
            per_prefix[prefix] = _run_percentiles(values, cum, start, end, qs)
            start = end
    prefixes = g["prefix"].to_pylist()
    ps = [per_prefix.get(p) or [None for _ in qs] for p in prefixes]
    messages, nbytes = g["n_sum"], g["_bytes_sum"]
    columns: dict[str, Any] = {
        "prefix": g["prefix"],
        "messages": messages,
        "bytes": nbytes,
        "mean_size": pc.divide(pc.cast(nbytes, pa.float64()), pc.cast(messages, pa.float64())),
    }
    for i, name in enumerate(names):
        columns[name] = pa.array([p[i] for p in ps], pa.float64())
    columns["max_size"] = g["size_max"]
    return pa.table(columns)


def overall_percentiles(sizes: pa.Table, qs: Sequence[float]) -> list[float | None]:
    """The ``qs`` percentiles of every payload size."""
    g = (
        sizes.filter(pc.is_valid(sizes["size"]))
        .group_by("size", use_threads=False)
        .aggregate([("n", "sum")])
        .sort_by("size")
    )
    return weighted_percentiles(g["size"].to_pylist(), g["n_sum"].to_pylist(), qs)


def size_histogram(sizes: pa.Table) -> pa.Table:
    """Messages per power-of-two size bucket: bucket b holds sizes in [2**(b-1), 2**b),
    bucket 0 empty payloads, the last one everything from 2**HISTOGRAM_MAX_EXPONENT."""
    top = HISTOGRAM_MAX_EXPONENT + 1
    buckets = [
        None if s is None else 0 if s == 0 else min(s.bit_length(), top)
        for s in sizes["size"].to_pylist()
    ]
    t = pa.table({"bucket": pa.array(buckets, pa.int32()), "n": sizes["n"]})
    g = t.group_by("bucket", use_threads=False).aggregate([("n", "sum")])
    b = g["bucket"].to_pylist()
    return pa.table(
        {
            "bucket": g["bucket"],
            "min_size": pa.array(
                [None if x is None else 0 if x == 0 else 1 << (x - 1) for x in b], pa.int32()
            ),
            "messages": g["n_sum"],
        }
    )


BURSTS_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.string(), nullable=False),
        ("prefix", pa.string()),
        ("window_start_ns", pa.int64()),
        ("window_start", TIMESTAMP),
        ("messages", pa.int64()),
        ("bytes", pa.int64()),
        pa.field("median_messages", pa.float64(), nullable=False),
        ("ratio", pa.float64()),
    ]
)


def median_with_zeros(counts: list[int], n_windows: int) -> float:
    """The median of ``counts`` padded with zeros to ``n_windows`` values (the empty
    windows of the span): linear interpolation between the two middle ranks."""
    pos = (n_windows - 1) / 2
    lo, hi = math.floor(pos), math.ceil(pos)
    ordered = sorted(counts)
    empty = n_windows - len(ordered)

    def at(rank: int) -> float:
        i = rank - empty
        return float(ordered[i]) if 0 <= i < len(ordered) else 0.0

    low, high = at(lo), at(hi)
    return low + (high - low) * (pos - lo)


def bursts(
    pw: pa.Table, span_windows: int, burst_factor: float, burst_min_messages: int
) -> pa.Table:
    """Windows of a scope (each prefix, and all traffic) with at least ``burst_factor``
    times its median count over all ``span_windows`` windows and ``burst_min_messages``."""
    scopes: dict[tuple[str, Any], dict[int, list[Any]]] = defaultdict(dict)
    for p, w, m, b in zip(
        pw["prefix"].to_pylist(),
        pw["window_start_ns"].to_pylist(),
        pw["messages"].to_pylist(),
        pw["bytes"].to_pylist(),
        strict=True,
    ):
        scopes[("prefix", p)][w] = [m, b]
        total = scopes[("total", "")].setdefault(w, [0, None])
        total[0] += m
        if b is not None:
            total[1] = (total[1] or 0) + b
    n_windows = max(1, span_windows)
    rows: dict[str, list[Any]] = {name: [] for name in BURSTS_SCHEMA.names}
    for (scope, prefix), windows in scopes.items():
        median = median_with_zeros([m for m, _ in windows.values()], n_windows)
        for w, (m, b) in windows.items():
            if m >= median * burst_factor and m >= burst_min_messages:
                for name, value in zip(
                    BURSTS_SCHEMA.names,
                    (scope, prefix, w, None, m, b, median, m / median if median > 0 else None),
                    strict=True,
                ):
                    rows[name].append(value)
    starts = pa.array(rows["window_start_ns"], pa.int64())
    return pa.Table.from_arrays(
        [
            pa.array(rows["scope"], pa.string()),
            pa.array(rows["prefix"], pa.string()),
            starts,
            _window_start(starts),
            pa.array(rows["messages"], pa.int64()),
            pa.array(rows["bytes"], pa.int64()),
            pa.array(rows["median_messages"], pa.float64()),
            pa.array(rows["ratio"], pa.float64()),
        ],
        schema=BURSTS_SCHEMA,
    )
