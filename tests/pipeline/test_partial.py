"""Partial sums of raw rows in Spark's Python workers: they add up to the sets of
the whole capture, whatever the tasks and row groups; the function runs where
sbus_relay is not installed; a worker that cannot read a file says so; and
where the workers cannot run at all, analyze sums the raw rows with Spark SQL,
says so, and writes the same tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyspark")

from sbus_relay.pipeline import analyze as A  # noqa: E402
from sbus_relay.pipeline import partial as P  # noqa: E402
from sbus_relay.pipeline import rollup as R  # noqa: E402
from sbus_relay.pipeline import sources as S  # noqa: E402
from sbus_relay.pipeline.capture import CAPTURE_SCHEMA  # noqa: E402
from sbus_relay.pipeline.inputs import resolve  # noqa: E402

from .conftest import SPARK_TEST_TIMEOUT  # noqa: E402
from .test_rollup import rows_of, tables  # noqa: E402

pytestmark = pytest.mark.timeout(SPARK_TEST_TIMEOUT)

WINDOW_NS = 60 * 10**9


def capture(path: Path, rows: list[dict[str, Any]], group_rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, CAPTURE_SCHEMA), path, row_group_size=group_rows)
    return path


def summed(parts: list[Any]) -> Any:
    """Partial rows summed and sorted: comparable whatever produced them."""
    return R.sum_stored(parts).sort_by([(c, "ascending") for c in ("_set", *R.GROUPING_COLUMNS)])


def run_plan(plan: list[list[P.Unit]], depth: int = 2) -> Any:
    """Every task of ``plan`` run as Spark runs it (its number in a batch)."""
    parts = []
    for task in range(len(plan)):
        batch = pa.record_batch({"id": pa.array([task], pa.int64())})
        done = P.file_sums(WINDOW_NS, depth, plan, iter([batch]))
        parts += [pa.Table.from_batches([b]) for b in done]
    return summed(parts)


def test_partial_sums_of_row_groups_add_up_to_the_sets_of_the_whole_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = capture(tmp_path / "a.parquet", rows_of(1, 3000, "h1"), group_rows=400)
    b = capture(tmp_path / "b.parquet", rows_of(2, 1000, "h2"), group_rows=1000)
    whole = pa.concat_tables([pq.read_table(f, columns=P.SCANNED) for f in (a, b)])
    groups = P.row_groups([str(a), str(b)])
    assert len(groups) == 9 and sum(g[2] for g in groups) == 4000
    for depth in (1, 2, 3):
        expected = summed([R.sets(whole, WINDOW_NS, depth)])
        for tasks in (1, 3, 20):
            assert run_plan(P.plan(groups, tasks), depth).equals(expected), (depth, tasks)
    # a task that keeps more partial rows than its bound sums them on the way,
    # and a row group bigger than a read is read in parts
    monkeypatch.setattr(P, "MERGE_ROWS", 10)
    monkeypatch.setattr(P, "READ_ROWS", 150)
    assert run_plan(P.plan(groups, 2)).equals(summed([R.sets(whole, WINDOW_NS, 2)]))


def test_row_groups_are_spread_over_the_tasks_by_rows() -> None:
    groups = [("a", 0, 100), ("a", 1, 100), ("b", 0, 50), ("c", 0, 50), ("c", 1, 10)]
    plan = P.plan(groups, 2)
    assert sorted(u for task in plan for u in task) == sorted((p, g) for p, g, _ in groups)
    rows = {(p, g): n for p, g, n in groups}
    assert sorted(sum(rows[u] for u in task) for task in plan) == [150, 160]
    assert len(P.plan(groups, 50)) == 5  # never an empty task
    assert P.plan(groups, 0) == [[u for u in sorted(rows, key=lambda u: (-rows[u], u))]]


def test_the_shipped_function_runs_where_sbus_relay_is_not_installed(tmp_path: Path) -> None:
    """What Spark ships to a worker (pickled by pyspark's cloudpickle) needs
    pyarrow, not sbus_relay: unpickled and run by a Python that cannot import it."""
    from pyspark import cloudpickle

    f = capture(tmp_path / "c.parquet", rows_of(3, 500, "h1"), group_rows=100)
    plan = P.plan(P.row_groups([str(f)]), 1)
    (tmp_path / "f.pickle").write_bytes(cloudpickle.dumps(P.summer(WINDOW_NS, 2, plan)))
    script = (
        "import sys, pickle; sys.modules['sbus_relay'] = None\n"
        "try:\n    import sbus_relay\nexcept ImportError:\n    pass\n"
        "else:\n    sys.exit('sbus_relay is importable')\n"
        "import pyarrow as pa, pyarrow.parquet as pq\n"
        "f = pickle.load(open(sys.argv[1], 'rb'))\n"
        "out = pa.Table.from_batches(list(f(iter([pa.record_batch({'id': [0]})]))))\n"
        "pq.write_table(out, sys.argv[2])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "f.pickle"), str(tmp_path / "out.parquet")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = summed([pq.read_table(tmp_path / "out.parquet")])
    assert got.equals(summed([R.sets(pq.read_table(f, columns=P.SCANNED), WINDOW_NS, 2)]))


def test_a_file_a_worker_cannot_read_is_named() -> None:
    plan = [[("/nonexistent/capture-1.parquet", 0)]]
    batch = pa.record_batch({"id": pa.array([0], pa.int64())})
    with pytest.raises(RuntimeError) as raised:
        list(P.file_sums(WINDOW_NS, 2, plan, iter([batch])))
    assert str(raised.value).startswith(P.READ_FAILURE + " /nonexistent/capture-1.parquet: ")


def test_which_spark_failures_mean_workers_that_cannot_run() -> None:
    assert P.worker_failure('java.io.IOException: Cannot run program "/no/python3": error=2')
    assert P.worker_failure("[PYTHON_VERSION_MISMATCH] Python in worker has different version")
    assert not P.worker_failure("[FAILED_READ_FILE.NO_HINT] Encountered error while reading")


@pytest.mark.spark
def test_workers_without_python_fall_back_to_spark_sql_with_a_note(
    spark: Any, tmp_path: Path
) -> None:
    """Executors without the driver's Python (here: its workers told to run one
    that does not exist): analyze --raw says so in one note and writes the
    tables Spark's Python workers give here."""
    capture(tmp_path / "cap" / "capture-1.parquet", rows_of(4, 2000, "h1"), group_rows=500)
    inputs = resolve([str(tmp_path / "cap")])
    here = tmp_path / "here"
    A.run(spark, inputs, here, A.AnalyzeOptions(), S.Sources(raw=list(inputs.paths)))
    out = tmp_path / "there"
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "sbus-relay"), "analyze",
         str(tmp_path / "cap"), "--out", str(out), "--raw", "--no-report",
         "--master", "local[2]"],
        env={**os.environ, "PYSPARK_PYTHON": "/nonexistent/python3"},
        capture_output=True, text=True, timeout=SPARK_TEST_TIMEOUT - 30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = [x for x in done.stderr.splitlines() if "Python workers could not run" in x]
    assert len(notes) == 1 and "Traceback" not in done.stderr, done.stderr
    assert tables(out) == tables(here)
    assert (out / "summary.json").read_text() == (here / "summary.json").read_text()
