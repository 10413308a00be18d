"""The analysis job on generated captures, against numbers computed in plain Python.

The captures are written here with pyarrow (no bus needed); every expected number
is recomputed independently from the same rows, with the definitions stated in
``sbus_relay/pipeline/analyze.py``'s docstring.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from sbus_relay.pipeline import analyze as A  # noqa: E402
from sbus_relay.pipeline.capture import CAPTURE_SCHEMA  # noqa: E402
from sbus_relay.pipeline.report import write_report  # noqa: E402

from .conftest import SPARK_TEST_TIMEOUT  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(SPARK_TEST_TIMEOUT)]

T0 = 1_700_000_000 * 10**9
WINDOW_S = 10.0
W = int(WINDOW_S * 1e9)
OPTS = A.AnalyzeOptions(
    depth=2, window_seconds=WINDOW_S, top=5, burst_factor=3.0, burst_min_messages=5
)
# Edge cases of prefix cutting: no "/", trailing "/", leading "/", empty segment, non-ASCII.
KEYS = [
    "sensors/temp/1", "sensors/temp/2", "sensors/hum/1", "app/orders/new", "app/orders/paid",
    "app/x", "solo", "a/b/", "/lead/x", "a//b", "média/é/1", "deep/er/and/deeper/still",
]  # fmt: skip
INSTANCES = ["hostA", "hostB", "relay:c"]


Row = dict[str, Any]


def make_rows(seed: int = 7, n: int = 3000) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        t = T0 + rng.randrange(0, 60 * 10**9)  # six 10 s windows
        rows.append(
            {
                "time_ns": t,
                "key": rng.choice(KEYS),
                "size": rng.choice([0, 1, 2, 3, 100, 1000, rng.randrange(0, 5000)]),
                "instance": rng.choice(INSTANCES),
            }
        )
    # A burst: 1000 messages on one key family inside one window (its usual is ~80).
    for _ in range(1000):
        rows.append(
            {
                "time_ns": T0 + 70 * 10**9 + rng.randrange(0, W),
                "key": "app/orders/new",
                "size": 10,
                "instance": "hostA",
            }
        )
    # One message exactly on a window boundary.
    rows.append({"time_ns": T0 + 20 * W, "key": "solo", "size": 409_600, "instance": "hostB"})
    return rows


def write_captures(rows: list[Row], directory: Path) -> None:
    directory.mkdir()
    (directory / "nested").mkdir()
    chunks = [rows[:1000], rows[1000:2500], rows[2500:]]
    for i, chunk in enumerate(chunks):
        target = directory / ("nested" if i == 1 else ".") / f"capture-{i}.parquet"
        table = pa.Table.from_pylist(
            [dict(r, payload=None if i else b"x" * r["size"]) for r in chunk],
            schema=CAPTURE_SCHEMA,
        )
        pq.write_table(table, target, compression="zstd")
    # A file left behind by a crash must be ignored, however valid it looks.
    junk = [dict(rows[0], key="junk/partial/1", payload=None)] * 50
    pq.write_table(
        pa.Table.from_pylist(junk, schema=CAPTURE_SCHEMA), directory / "capture-9.parquet.partial"
    )


def prefix(key: str, depth: int) -> str:
    return "/".join(key.split("/")[:depth])


def percentile(values: list[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, Spark's percentile)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def read(out: Path, name: str) -> list[Row]:
    return pq.read_table(out / name).to_pylist()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def analysed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Row], Path, Any]:
    base = tmp_path_factory.mktemp("analyze")
    rows = make_rows()
    write_captures(rows, base / "captures")
    out = base / "out"
    result = A.run(spark, [str(base / "captures")], out, OPTS)
    write_report(result, out)
    return rows, out, result


def test_messages_and_bytes_per_prefix_and_window(analysed: tuple[list[Row], Path, Any]) -> None:
    rows, out, _ = analysed
    expected: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        cell = expected[(prefix(r["key"], 2), r["time_ns"] // W * W)]
        cell[0] += 1
        cell[1] += r["size"]
    got = {
        (r["prefix"], r["window_start_ns"]): [r["messages"], r["bytes"]]
        for r in read(out, "prefix_windows")
    }
    assert got == dict(expected)
    assert ("a/", T0 // W * W) in got or any(p == "a/" for p, _ in got)  # "a//b" -> "a/"
    assert not any(p.startswith("junk") for p, _ in got)


def test_size_percentiles(analysed: tuple[list[Row], Path, Any]) -> None:
    rows, out, result = analysed
    sizes: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        sizes[prefix(r["key"], 2)].append(r["size"])
    got = {r["prefix"]: r for r in read(out, "size_percentiles")}
    assert set(got) == set(sizes)
    for p, values in sizes.items():
        g = got[p]
        assert g["messages"] == len(values)
        assert g["bytes"] == sum(values)
        assert g["max_size"] == max(values)
        assert g["mean_size"] == pytest.approx(sum(values) / len(values))
        for q in OPTS.percentiles:
            assert g[A.percentile_name(q)] == pytest.approx(percentile(values, q)), (p, q)
    everything = [r["size"] for r in rows]
    summary = json.loads((out / "summary.json").read_text())
    for q in OPTS.percentiles:
        assert summary["size_percentiles"][A.percentile_name(q)] == pytest.approx(
            percentile(everything, q)
        )
    assert result.summary == summary


def test_top_keys(analysed: tuple[list[Row], Path, Any]) -> None:
    rows, out, _ = analysed
    m: Counter[str] = Counter()
    b: Counter[str] = Counter()
    for r in rows:
        m[r["key"]] += 1
        b[r["key"]] += r["size"]
    by_m = sorted(m, key=lambda k: (-m[k], -b[k], k))[: OPTS.top]
    by_b = sorted(m, key=lambda k: (-b[k], -m[k], k))[: OPTS.top]
    got_m = sorted(read(out, "top_keys_by_messages"), key=lambda r: r["rank"])
    got_b = sorted(read(out, "top_keys_by_bytes"), key=lambda r: r["rank"])
    assert [(r["rank"], r["key"], r["messages"], r["bytes"]) for r in got_m] == [
        (i + 1, k, m[k], b[k]) for i, k in enumerate(by_m)
    ]
    assert [(r["key"], r["messages"], r["bytes"]) for r in got_b] == [(k, m[k], b[k]) for k in by_b]


def test_instances(analysed: tuple[list[Row], Path, Any]) -> None:
    rows, out, _ = analysed
    expected: dict[str, Row] = {}
    for r in rows:
        e = expected.setdefault(
            r["instance"], {"messages": 0, "bytes": 0, "first_ns": r["time_ns"], "last_ns": 0}
        )
        e["messages"] += 1
        e["bytes"] += r["size"]
        e["first_ns"] = min(e["first_ns"], r["time_ns"])
        e["last_ns"] = max(e["last_ns"], r["time_ns"])
    got = {r.pop("instance"): r for r in read(out, "instances")}
    assert got == expected
    per_prefix: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        counts = per_prefix[(r["instance"], prefix(r["key"], 2))]
        counts[0] += 1
        counts[1] += r["size"]
    table = read(out, "instance_prefixes")  # by instance, then prefix
    assert [(r["instance"], r["prefix"]) for r in table] == sorted(per_prefix)
    assert {(r["instance"], r["prefix"]): [r["messages"], r["bytes"]] for r in table} == dict(
        per_prefix
    )


def test_bursts(analysed: tuple[list[Row], Path, Any]) -> None:
    rows, out, _ = analysed
    per_scope: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
    for r in rows:
        w = r["time_ns"] // W * W
        per_scope[("prefix", prefix(r["key"], 2))][w] += 1
        per_scope[("total", "")][w] += 1
    first = min(r["time_ns"] for r in rows) // W
    last = max(r["time_ns"] for r in rows) // W
    expected = set()
    for (scope, p), windows in per_scope.items():
        # Over every window of the capture's span, the empty ones counting as zero.
        median = statistics.median(windows.get(i * W, 0) for i in range(first, last + 1))
        for w, n in windows.items():
            if n >= OPTS.burst_factor * median and n >= OPTS.burst_min_messages:
                expected.add((scope, p, w, n, float(median)))
    got = {
        (r["scope"], r["prefix"], r["window_start_ns"], r["messages"], r["median_messages"])
        for r in read(out, "bursts")
    }
    assert got == expected
    # The planted burst is found, for its prefix.
    assert any(s == "prefix" and p == "app/orders" and w == T0 + 70 * 10**9 for s, p, w, *_ in got)


def test_size_histogram_and_summary(analysed: tuple[list[Row], Path, Any]) -> None:
    rows, out, _ = analysed
    hist: Counter[int] = Counter()
    for r in rows:
        s = r["size"]
        hist[0 if s == 0 else min(s.bit_length(), A.HISTOGRAM_MAX_EXPONENT + 1)] += 1
    got = {r["bucket"]: (r["min_size"], r["messages"]) for r in read(out, "size_histogram")}
    assert got == {k: (0 if k == 0 else 1 << (k - 1), v) for k, v in hist.items()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["messages"] == len(rows)
    assert summary["bytes"] == sum(r["size"] for r in rows)
    assert summary["keys"] == len({r["key"] for r in rows})
    assert summary["prefixes"] == len({prefix(r["key"], 2) for r in rows})
    assert summary["windows"] == len({r["time_ns"] // W for r in rows})
    assert summary["first_ns"] == min(r["time_ns"] for r in rows)
    assert summary["last_ns"] == max(r["time_ns"] for r in rows)


def test_report_has_charts(analysed: tuple[list[Row], Path, Any]) -> None:
    _, out, _ = analysed
    report = (out / "report.md").read_text()
    images = [
        line.split("](")[1].rstrip(")") for line in report.splitlines() if line.startswith("![")
    ]
    assert len(images) >= 4
    for name in images:
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG"), name
    assert "app/orders" in report and "## Bursts" in report
    assert f"{len(make_rows()):,}" in report


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        A.AnalyzeOptions(depth=0)
    with pytest.raises(ValueError):
        A.AnalyzeOptions(window_seconds=0)
    with pytest.raises(ValueError):
        A.AnalyzeOptions(burst_factor=1.0)
    assert A.percentile_name(0.999) == "p99_9"


def test_empty_capture_gives_an_empty_report(spark: Any, tmp_path: Path) -> None:
    """A capture of an idle bus: zero rows, no crash, a report that says so."""
    (tmp_path / "cap").mkdir()
    pq.write_table(CAPTURE_SCHEMA.empty_table(), tmp_path / "cap" / "capture-0.parquet")
    result = A.run(spark, [str(tmp_path / "cap")], tmp_path / "out", OPTS)
    report = write_report(result, tmp_path / "out").read_text()
    assert result.summary["messages"] == 0 and result.summary["first_ns"] is None
    assert result.summary["size_percentiles"] == {"p50": None, "p90": None, "p99": None}
    assert read(tmp_path / "out", "prefix_windows") == []
    assert "Messages: **0**" in report and "No bursts." in report
