"""Charts and reports an operator reads at a glance: zeros for silence, adaptive windows,
bursts found per prefix, no table cut silently, an offline HTML report with the losses."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from sbus_relay.pipeline import analyze as A  # noqa: E402
from sbus_relay.pipeline import windows as W  # noqa: E402
from sbus_relay.pipeline.capture import CAPTURE_SCHEMA, LossLog  # noqa: E402
from sbus_relay.pipeline.report import MAX_REPORT_ROWS, write_report  # noqa: E402

from .conftest import SPARK_TEST_TIMEOUT  # noqa: E402

T0 = 1_700_000_040 * 10**9  # on a minute boundary
MIN = 60 * 10**9


def test_empty_windows_are_zero_in_chart_series() -> None:
    """A prefix with 50 messages in 3 of 60 minutes is drawn as 57 zeros and 3 peaks."""
    rows = [("steady/x", T0 + i * MIN, 10, 100) for i in range(60)]
    rows += [("rare/x", T0 + i * MIN, 50, 5000) for i in (5, 30, 55)]
    pw = pa.table(
        {
            "prefix": [r[0] for r in rows],
            "window_start_ns": [r[1] for r in rows],
            "messages": [r[2] for r in rows],
            "bytes": [r[3] for r in rows],
        }
    )
    summary = {"messages": 750, "first_ns": T0, "last_ns": T0 + 60 * MIN - 1}
    series = A.chart_series(pw, summary, A.AnalyzeOptions(window_seconds=60))
    rare = [r for r in series if r["series"] == "rare/x"]
    assert len(rare) == 60
    assert [r["messages"] for r in rare].count(0) == 57
    assert {r["t"] for r in rare} == {T0 + i * MIN for i in range(60)}


@pytest.mark.parametrize("span_s", [0.05, 1, 45, 600, 3600, 86400, 7 * 86400])
def test_default_window_gives_100_to_500_points(span_s: float) -> None:
    w = W.auto_window(int(span_s * 1e9))
    assert 100 <= span_s / w <= 500 or (w == W.NICE_WINDOWS[0] and span_s / w <= 500)


def bursty_rows() -> list[dict[str, Any]]:
    """Two minutes: 20 msgs/s steady, a 200-message burst every 6 s on two prefixes,
    and a prefix ("flash/") heard only during one burst of its own."""
    rows = []
    for i in range(120 * 20):
        rows.append({"time_ns": T0 + i * 50_000_000, "key": f"steady/k{i % 5}", "size": 10})
    for b in range(20):
        for offset, key in ((3, "steady/k0"), (1, "other/k1")):
            start = T0 + b * 6 * 10**9 + offset * 10**9
            for j in range(200):
                rows.append({"time_ns": start + j * 1_000_000, "key": key, "size": 10})
    for j in range(100):
        rows.append({"time_ns": T0 + 61 * 10**9 + j * 1_000_000, "key": "flash/x", "size": 99})
    for r in rows:
        r.update(payload=None, instance="i")
    rows.sort(key=lambda r: r["time_ns"])
    return rows


@pytest.fixture(scope="module")
def bursty(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    base = tmp_path_factory.mktemp("bursty")
    (base / "cap").mkdir()
    pq.write_table(
        pa.Table.from_pylist(bursty_rows(), schema=CAPTURE_SCHEMA), base / "cap" / "c.parquet"
    )
    log = LossLog(base / "cap", "capture-i")
    log.write("start", instance="i", drop_query=True)
    log.write("drops", time_ns=T0 + 30 * 10**9, dropped=1234, total=1234)
    log.write("end", messages=1, dropped=1234)
    log.close()
    out = base / "out"
    result = A.run(spark, [str(base / "cap")], out, A.AnalyzeOptions(burst_min_messages=10))
    write_report(result, out)
    return out, result


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_default_window_finds_the_bursts(bursty: tuple[Path, Any]) -> None:
    _, result = bursty
    assert result.summary["options"]["window_seconds"] == 0.5  # 2 minutes: 240 windows
    total = [b for b in result.tables["bursts"] if b["scope"] == "total"]
    assert len(total) >= 40  # every 6-second burst, of both prefixes
    flash = [b for b in result.tables["bursts"] if b["prefix"] == "flash/x"]
    assert flash and flash[0]["scope"] == "prefix" and flash[0]["ratio"] is None
    assert flash[0]["messages"] == 100


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_report_says_when_a_table_is_cut_and_writes_it_whole(bursty: tuple[Path, Any]) -> None:
    out, result = bursty
    n = len(result.tables["bursts"])
    assert n > MAX_REPORT_ROWS
    report = (out / "report.md").read_text()
    assert f"First {MAX_REPORT_ROWS} of {n:,} bursts" in report
    with open(out / "bursts.csv") as f:
        assert len(list(csv.DictReader(f))) == n
    assert "msgs/s" in report and "UTC" in report


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_losses_are_in_summary_and_reports(bursty: tuple[Path, Any]) -> None:
    out, _ = bursty
    summary = json.loads((out / "summary.json").read_text())
    assert summary["loss"]["known"] and summary["loss"]["dropped"] == 1234
    assert "1,234 messages dropped" in (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    assert "1,234 messages dropped" in page
    assert "<script src=" not in page.replace('<script src="data:', "")  # nothing fetched
    assert "plotly" in page.lower() and "rangeslider" in page


@pytest.mark.timeout(10)
def test_an_unfinished_session_is_said_even_when_the_bus_dropped_nothing() -> None:
    from sbus_relay.pipeline.report import _loss_lines

    lines = _loss_lines({"loss": {"known": True, "dropped": 0, "sessions": 1,
                                  "unfinished_sessions": 1}})  # fmt: skip
    assert "**none**" in lines[0]
    assert "did not finish" in lines[1]


def small_result(out: Path) -> A.AnalysisResult:
    """The bursty capture's result, from its rollup on the driver (no Spark)."""
    from sbus_relay.pipeline import rollup as R
    from sbus_relay.pipeline.inputs import Inputs

    rows = bursty_rows()
    rollup = R.roll_up(pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA), "c.parquet")
    asked = A.AnalyzeOptions(burst_min_messages=10)
    opts = A.span_options(asked, rows[0]["time_ns"], rows[-1]["time_ns"])
    job = A.compute_local(R.sum_stored([rollup]), opts)
    return A.finish(None, job, asked, opts, Inputs(paths=["c.parquet"], checked=True), 1, out)  # type: ignore[arg-type]


def report_files(out: Path) -> dict[str, bytes]:
    """The report's files; the page's one random element id made alike."""
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    files["report.html"] = re.sub(rb"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", b"ID",
                                  files["report.html"])  # fmt: skip
    return files


@pytest.mark.timeout(240)
def test_warm_workers_draw_the_report_a_process_draws(tmp_path: Path) -> None:
    """--follow's renderer draws each part in its own warm process: the same
    files as drawing them in-process; a worker that dies has its part drawn by
    the driver and is replaced; closing it leaves no process."""
    from sbus_relay.pipeline.render import Renderer

    result = small_result(tmp_path / "tables")
    here, there, again = tmp_path / "here", tmp_path / "there", tmp_path / "again"
    write_report(result, here)
    with Renderer(workers=2) as renderer:
        write_report(result, there, drawer=renderer)
        assert report_files(there) == report_files(here)
        assert len(report_files(here)) == 10  # md, html, 2 CSVs, 6 charts
        procs = [w[0] for w in renderer._workers if w is not None]
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
        procs[0].kill()
        procs[0].wait()
        write_report(result, again, drawer=renderer)
        assert report_files(again) == report_files(here)
        fresh = [w[0] for w in renderer._workers if w is not None]
        assert procs[0] not in fresh
    assert all(p.poll() is not None for p in [*procs, *fresh])
