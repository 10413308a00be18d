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
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
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


def instance_prefixes(cells: pa.Table) -> pa.Table:
    """Messages and bytes per (instance, prefix): what each host's bus carried,
    family by family (a fleet's report), by instance, then prefix."""
    g = (
        cells.group_by(["instance", "prefix"], use_threads=False)
        .aggregate([("messages", "sum"), ("bytes", "sum")])
        .sort_by([("instance", "ascending"), ("prefix", "ascending")])
    )
    return pa.table(
        {
            "instance": g["instance"],
            "prefix": g["prefix"],
            "messages": g["messages_sum"],
            "bytes": g["bytes_sum"],
        }
    )


def weighted_percentiles(values: Any, counts: Any, qs: Sequence[float]) -> list[float | None]:
    """Exact percentiles of ``values`` (ascending integers) occurring ``counts`` times.

    Spark's ``percentile`` step by step: position ``(N - 1) * q``, the values at
    its floor and ceiling ranks found in the cumulative counts, and
    ``(higher - position) * low + (position - lower) * high`` between them.
    """
    ordered = np.asarray(values, dtype=np.int64)
    if not len(ordered):
        return [None for _ in qs]
    cum = np.cumsum(np.asarray(counts, dtype=np.int64))
    out: list[float | None] = []
    for q in qs:
        position = (int(cum[-1]) - 1) * q
        lower, higher = math.floor(position), math.ceil(position)
        low = int(ordered[np.searchsorted(cum, lower + 1)])
        if higher == lower:
            out.append(float(low))
            continue
        high = int(ordered[np.searchsorted(cum, higher + 1)])
        if high == low:
            out.append(float(low))
        else:
            out.append((higher - position) * float(low) + (position - lower) * float(high))
    return out


#: Fewest distinct prefixes for which the size histograms are sorted on three
#: keys rather than on one packed key (``Sizes``), whose prefix part has 30 bits.
PREFIX_SORT_LIMIT = 1 << 30


class Sizes:
    """The (prefix, size, n) histograms as numpy arrays, sorted by prefix, then
    size: each prefix's rows one run, its known (non-null) sizes ascending.
    Made once for the three derivations below (each also takes the table)."""

    def __init__(self, sizes: pa.Table) -> None:
        encoded = pc.dictionary_encode(sizes["prefix"].combine_chunks())
        names = encoded.dictionary
        # Codes renumbered in the prefixes' order, so that sorting on them sorts
        # on the prefixes (bytewise, as Arrow and Spark order strings).
        rank = np.empty(len(names), dtype=np.int64)
        rank[np.asarray(pc.sort_indices(names))] = np.arange(len(names))
        codes = np.asarray(encoded.indices.fill_null(-1), dtype=np.int64)
        self.prefix_of = np.where(codes >= 0, rank[np.maximum(codes, 0)], len(names))
        self.names = [*pc.take(names, pc.sort_indices(names)).to_pylist(), None]
        size = sizes["size"].combine_chunks()
        self.known = np.asarray(size.is_valid(), dtype=bool)
        self.size = np.asarray(size.fill_null(0), dtype=np.int64)
        self.n = np.asarray(sizes["n"].combine_chunks().fill_null(0), dtype=np.int64)
        if len(names) < PREFIX_SORT_LIMIT:
            # One int64 key (a sort of several keys is many times slower): the
            # prefix, then known before not, then the size (an int32's range).
            key = self.prefix_of << 33 | (~self.known).astype(np.int64) << 32
            order = np.argsort(key | (self.size + (1 << 31)))
        else:
            order = np.lexsort((self.size, ~self.known, self.prefix_of))
        self.prefix_of, self.known = self.prefix_of[order], self.known[order]
        self.size, self.n = self.size[order], self.n[order]
        present = np.unique(self.prefix_of)
        self.runs = [
            (int(p), int(np.searchsorted(self.prefix_of, p)),
             int(np.searchsorted(self.prefix_of, p, side="right")))
            for p in present
        ]  # fmt: skip


def _sorted(sizes: pa.Table | Sizes) -> Sizes:
    return sizes if isinstance(sizes, Sizes) else Sizes(sizes)


def size_percentiles(
    sizes: pa.Table | Sizes, qs: Sequence[float], names: Sequence[str]
) -> pa.Table:
    """Per prefix (in the prefixes' order): messages, bytes, mean size, the
    ``qs`` percentiles and the largest size.  Bytes, the mean and the largest
    size are null for a prefix without a known size, as Arrow's sums are."""
    h = _sorted(sizes)
    rows: list[list[Any]] = []
    for p, start, end in h.runs:
        known = h.known[start:end]
        size, n = h.size[start:end][known], h.n[start:end][known]
        messages = int(h.n[start:end].sum())
        nbytes = int((size * n).sum()) if len(size) else None
        largest = int(size.max()) if len(size) else None
        mean = None if nbytes is None else float(nbytes) / float(messages)
        rows.append([h.names[p], messages, nbytes, mean,
                     *weighted_percentiles(size, n, qs), largest])  # fmt: skip
    columns = ["prefix", "messages", "bytes", "mean_size", *names, "max_size"]
    types = [pa.string(), pa.int64(), pa.int64(), pa.float64()]
    types += [pa.float64() for _ in names] + [pa.int64()]
    return pa.table(
        {c: pa.array([r[i] for r in rows], t) for i, (c, t) in enumerate(zip(columns, types,
                                                                              strict=True))}
    )  # fmt: skip


def overall_percentiles(sizes: pa.Table | Sizes, qs: Sequence[float]) -> list[float | None]:
    """The ``qs`` percentiles of every payload size."""
    h = _sorted(sizes)
    size, n = h.size[h.known], h.n[h.known]
    order = np.argsort(size, kind="stable")
    return weighted_percentiles(size[order], n[order], qs)


def size_histogram(sizes: pa.Table | Sizes) -> pa.Table:
    """Messages per power-of-two size bucket, in bucket order: bucket b holds
    sizes in [2**(b-1), 2**b), bucket 0 empty payloads, the last one everything
    from 2**HISTOGRAM_MAX_EXPONENT; sizes not known last, in a null bucket."""
    h = _sorted(sizes)
    # A size's bucket is its bit length: how many of 1, 2, 4... are at most it.
    bounds = np.array([1 << b for b in range(HISTOGRAM_MAX_EXPONENT + 1)], dtype=np.int64)
    bucket = np.searchsorted(bounds, h.size, side="right")
    counts = np.zeros(len(bounds) + 1, dtype=np.int64)
    np.add.at(counts, bucket[h.known], h.n[h.known])
    seen = np.zeros(len(bounds) + 1, dtype=bool)
    seen[bucket[h.known]] = True
    found: list[int | None] = [int(b) for b in np.flatnonzero(seen)]
    messages = [int(counts[b]) for b in found if b is not None]
    if not h.known.all():
        found.append(None)
        messages.append(int(h.n[~h.known].sum()))
    return pa.table(
        {
            "bucket": pa.array(found, pa.int32()),
            "min_size": pa.array(
                [None if b is None else 0 if b == 0 else 1 << (b - 1) for b in found], pa.int32()
            ),
            "messages": pa.array(messages, pa.int64()),
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
