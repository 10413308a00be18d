"""Rollups: what one holds (recomputed in plain Python), that ``record`` publishes
one with each capture file, and that ``analyze`` gives the same tables from
rollups as from raw rows and as DuckDB, on captures of several hosts, with
rollups beside the captures or in its own output."""

from __future__ import annotations

import json
import os
import random
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pc = pytest.importorskip("pyarrow.compute")

from sbus_relay.pipeline import analyze as A  # noqa: E402
from sbus_relay.pipeline import merged as M  # noqa: E402
from sbus_relay.pipeline import rollup as R  # noqa: E402
from sbus_relay.pipeline import sources as S  # noqa: E402
from sbus_relay.pipeline.capture import (  # noqa: E402
    CAPTURE_SCHEMA,
    RotatingCaptureWriter,
    capture_files,
    recover,
)
from sbus_relay.pipeline.inputs import resolve  # noqa: E402
from sbus_relay.pipeline.windows import state_window  # noqa: E402

from .conftest import SPARK_TEST_TIMEOUT  # noqa: E402

pytestmark = pytest.mark.timeout(SPARK_TEST_TIMEOUT)

T0 = 1_700_000_000 * 10**9
KEYS = [
    "sensors/temp/1", "sensors/temp/2", "sensors/hum/1", "app/orders/new", "app/x", "solo",
    "a/b/", "/lead/x", "a//b", "média/é/1", "deep/er/and/deeper",
]  # fmt: skip


def rows_of(seed: int, n: int, instance: str, span_s: int = 900) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append(
            {
                "time_ns": T0 + rng.randrange(0, span_s * 10**9),
                "key": rng.choice(KEYS),
                "size": rng.choice([0, 1, 7, 100, 4096, rng.randrange(0, 5000)]),
                "payload": None,
                "instance": instance,
            }
        )
    out.sort(key=lambda r: r["time_ns"])
    return out


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA), path, compression="zstd")
    return path


def cut(key: str, depth: int) -> str:
    return "/".join(key.split("/")[:depth])


def test_a_rollup_holds_cells_sizes_and_keys_exactly() -> None:
    rows = rows_of(1, 5000, "h1") + rows_of(2, 3000, "h2")
    table = pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA)
    rollup = R.roll_up(table, "capture-x.parquet")
    first, last = min(r["time_ns"] for r in rows), max(r["time_ns"] for r in rows)
    w = state_window(last - first)
    meta = rollup.schema.metadata
    assert meta[R.WINDOW_KEY] == str(w).encode() and meta[R.ROWS_KEY] == b"8000"
    assert meta[R.DEPTH_KEY] == str(R.ROLLUP_DEPTH).encode()
    got: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rollup.to_pylist():
        got[r["_set"]].append(r)

    cells: dict[tuple[str, int, str], list[int]] = {}
    for r in rows:
        c = cells.setdefault(
            (cut(r["key"], 2), r["time_ns"] // w * w, r["instance"]), [0, 0, 2**63, 0]
        )
        c[0] += 1
        c[1] += r["size"]
        c[2] = min(c[2], r["time_ns"])
        c[3] = max(c[3], r["time_ns"])
    assert {
        (c["prefix"], c["window_start_ns"], c["instance"]): [
            c["messages"], c["bytes"], c["first_ns"], c["last_ns"]
        ]
        for c in got[R.CELL_SET]
    } == cells  # fmt: skip
    sizes = Counter((cut(r["key"], 2), r["size"]) for r in rows)
    assert {(s["prefix"], s["size"]): s["messages"] for s in got[R.SIZE_SET]} == sizes
    keys: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        keys[r["key"]][0] += 1
        keys[r["key"]][1] += r["size"]
    assert {k["key"]: [k["messages"], k["bytes"]] for k in got[R.KEY_SET]} == dict(keys)
    (named,) = got[R.FILE_SET]
    assert (named["key"], named["messages"], named["first_ns"], named["last_ns"]) == (
        "capture-x.parquet",
        8000,
        first,
        last,
    )


def test_stored_sets_summed_in_steps_give_the_tables_of_all_of_them() -> None:
    """--follow adds each batch to the sums of the earlier ones (sum_stored): the
    tables derived from those sums equal those derived from every row at once,
    at the rollup's depth and a coarser one, in the span's window."""
    rollups = [
        R.roll_up(pa.Table.from_pylist(rows_of(seed, 2000, f"h{seed % 2}"), schema=CAPTURE_SCHEMA),
                  f"capture-{seed}.parquet")
        for seed in range(5)
    ]  # fmt: skip
    every = pa.concat_tables(rollups)
    summed = None
    for rollup in rollups:
        summed = R.sum_stored([rollup] if summed is None else [summed, rollup])
    assert summed is not None
    assert summed.num_rows < every.num_rows  # summed, not only gathered
    for depth in (1, 2):
        opts = A.span_options(A.AnalyzeOptions(depth=depth, top=5), T0, T0 + 900 * 10**9)
        whole, steps = A.compute_local(every, opts), A.compute_local(summed, opts)
        for name in ("cells", "top_by_messages", "top_by_bytes"):
            assert getattr(steps, name).equals(getattr(whole, name)), (depth, name)
        by_size = [("prefix", "ascending"), ("size", "ascending")]  # derived whatever their order
        assert steps.sizes.sort_by(by_size).equals(whole.sizes.sort_by(by_size)), depth
        assert steps.distinct_keys == whole.distinct_keys == len(KEYS)
    files = summed.filter(pc.equal(summed["_set"], R.FILE_SET))
    assert sorted(files["key"].to_pylist()) == [f"capture-{i}.parquet" for i in range(5)]


def test_record_publishes_a_rollup_with_each_capture_file(tmp_path: Path) -> None:
    with RotatingCaptureWriter(
        tmp_path, instance="i", rotate_bytes=20_000, row_group_rows=100
    ) as w:
        for i in range(3000):
            w.append(T0 + i * 10**6, f"a/b/{i % 7}", b"x" * (i % 50))
    files = capture_files([tmp_path])
    assert len(files) > 1
    for f in files:
        info = R.usable(R.rollup_path(f), pq.read_metadata(f).num_rows)
        assert info is not None, f
    # Nothing else is left: no temporary file, and a rollup is never taken for a capture.
    assert sorted(p.suffix for p in tmp_path.iterdir()) == sorted(
        [".parquet"] * len(files) + [".rollup"] * len(files)
    )
    assert resolve([str(tmp_path)]).paths == [str(f) for f in files]


def test_a_killed_recorder_s_journal_is_recovered_with_its_rollup(tmp_path: Path) -> None:
    w = RotatingCaptureWriter(tmp_path, instance="i")
    for i in range(500):
        w.append(T0 + i, "k/1", b"yy")
    w.flush()  # what a kill -9 leaves: a journal, no capture file, no rollup
    journal = Path(w.stats.current_file)
    assert w._fd is not None
    os.close(w._fd)  # the dead process's lock goes with it
    assert recover([tmp_path]).rows == 500
    (capture,) = capture_files([tmp_path])
    assert R.usable(R.rollup_path(capture), 500) is not None
    assert not journal.exists()


def test_a_stale_or_foreign_rollup_is_not_used(tmp_path: Path) -> None:
    capture = write(tmp_path / "c.parquet", rows_of(3, 100, "h"))
    R.roll_up_file(capture)
    assert R.usable(R.rollup_path(capture), 100) is not None
    write(capture, rows_of(4, 120, "h"))  # rewritten since: 120 rows, the rollup says 100
    assert R.usable(R.rollup_path(capture), 120) is None
    plan = S.plan({str(capture): 120}, 2, 60 * 10**9)
    assert plan.made == 1 and R.usable(R.rollup_path(capture), 120) is not None
    R.rollup_path(capture).write_bytes(b"not parquet")
    assert R.usable(R.rollup_path(capture), 120) is None


def test_sources_read_raw_rows_only_where_they_must(tmp_path: Path) -> None:
    capture = write(tmp_path / "c.parquet", rows_of(5, 200, "h", span_s=900))
    files = {str(capture): 200}
    assert S.plan(files, 2, 10**9).made == 1  # none yet: made beside the capture
    info = R.usable(R.rollup_path(capture), 200)
    assert info is not None
    assert S.plan(files, 1, info.window_ns * 6).rollups == [info.path]
    assert S.plan(files, 3, info.window_ns).raw == [str(capture)]  # deeper than the rollup
    odd = info.window_ns * 3 // 2  # not a multiple of the rollup's window
    assert S.plan(files, 2, odd).raw == [str(capture)]
    assert S.plan(files, 2, info.window_ns, raw=True).raw == [str(capture)]


def tables(out: Path) -> dict[str, bytes]:
    return {n: (out / n / "part-00000.parquet").read_bytes() for n in A.TABLES}


@pytest.mark.spark
def test_rollups_raw_rows_and_duckdb_give_the_same_tables(spark: Any, tmp_path: Path) -> None:
    """Two hosts' capture directories analysed together: from rollups (made by
    this run, beside the captures), from raw rows, and by DuckDB; and a depth
    and a window that the rollups serve by cutting and summing."""
    from sbus_relay.bench.peer import analyse, same_tables

    host1, host2 = tmp_path / "host1", tmp_path / "host2"
    write(host1 / "capture-h1-1.parquet", rows_of(11, 4000, "host1"))
    write(host1 / "capture-h1-2.parquet", rows_of(12, 3000, "host1", span_s=1800))
    write(host2 / "capture-h2-1.parquet", rows_of(13, 5000, "host2"))
    dirs = [str(host1), str(host2)]
    for opts in (A.AnalyzeOptions(), A.AnalyzeOptions(depth=1, window_seconds=60.0)):
        inputs = resolve(dirs)
        rolled = tmp_path / f"rolled-{opts.depth}"
        base = A.span_options(opts, inputs.first_ns, inputs.last_ns)
        plan = S.plan(inputs.file_rows, base.depth, base.window_ns)
        assert len(plan.rollups) == 3 and not plan.raw
        A.run(spark, inputs, rolled, opts, plan)
        raw = tmp_path / f"raw-{opts.depth}"
        A.run(spark, inputs, raw, opts, S.Sources(raw=list(inputs.paths)))
        assert tables(rolled) == tables(raw)
        assert (rolled / "summary.json").read_text() == (raw / "summary.json").read_text()
    # Every capture now has its rollup beside it; DuckDB over the same files.
    assert all(R.rollup_path(p).exists() for p in resolve(dirs).paths)
    both = tmp_path / "both"
    for d in dirs:
        for f in Path(d).glob("*.parquet"):
            (both / f.name).parent.mkdir(exist_ok=True)
            (both / f.name).symlink_to(f)
    analyse(str(both), str(tmp_path / "duck"))
    assert same_tables(str(tmp_path / "duck"), str(tmp_path / "rolled-2")) == []
    summary = json.loads((tmp_path / "rolled-2" / "summary.json").read_text())
    assert summary["instances"] == 2 and summary["messages"] == 12_000


@pytest.mark.spark
def test_rollups_go_into_the_output_where_the_captures_are_read_only(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture directory this user may not write (the tests run as root, who
    may write anywhere: the check is patched): the rollups go under the output,
    the next run reads them from there, and the tables stay those of raw rows."""
    cap = tmp_path / "cap"
    write(cap / "capture-a.parquet", rows_of(21, 2000, "a"))
    write(cap / "capture-b.parquet", rows_of(22, 2000, "b"))
    monkeypatch.setattr(S, "_writable", lambda directory: False)
    inputs = resolve([str(cap)])
    opts = A.AnalyzeOptions()
    base = A.span_options(opts, inputs.first_ns, inputs.last_ns)
    out1 = tmp_path / "out1"
    out1.mkdir()
    first = S.plan(inputs.file_rows, base.depth, base.window_ns, out=out1)
    assert first.made == 2 and first.in_output == 2 and "output's rollups/" in first.lines()[0]
    assert not list(cap.glob("*.rollup"))
    A.run(spark, inputs, out1, opts, first)
    out2 = tmp_path / "out2"
    out2.mkdir()
    again = S.plan(inputs.file_rows, base.depth, base.window_ns, out=out2, previous=out1)
    assert again.made == 0 and len(again.rollups) == 2 and again.lines() == []
    assert sorted(p.name for p in (out2 / S.ROLLUPS_DIR).iterdir()) == sorted(
        p.name for p in (out1 / S.ROLLUPS_DIR).iterdir()
    )
    raw = tmp_path / "raw"
    A.run(spark, inputs, raw, opts, S.Sources(raw=list(inputs.paths)))
    assert tables(out1) == tables(raw)


def merged_sums(path: Path, opts: A.AnalyzeOptions) -> A.Computed:
    return A.compute_local(pq.read_table(path), opts)


def same_computed(a: A.Computed, b: A.Computed) -> None:
    for name in ("cells", "top_by_messages", "top_by_bytes"):
        assert getattr(a, name).equals(getattr(b, name)), name
    by_size = [("prefix", "ascending"), ("size", "ascending")]
    assert a.sizes.sort_by(by_size).equals(b.sizes.sort_by(by_size))
    assert a.distinct_keys == b.distinct_keys


def test_a_directory_s_rollups_are_merged_once_extended_and_rebuilt(tmp_path: Path) -> None:
    """The captures of a directory the user names are read through its merged
    rollup: made by the first run (the sums of every file's rollup), used as it
    is by the next, extended by a new file, rebuilt when a file went or was
    rewritten; each time the same sums as the files' own rollups."""
    cap = tmp_path / "cap"
    for i in range(3):
        write(cap / f"capture-{i}.parquet", rows_of(30 + i, 1500, f"h{i % 2}"))

    def plan() -> S.Sources:
        inputs = resolve([str(cap)])
        base = A.span_options(A.AnalyzeOptions(), inputs.first_ns, inputs.last_ns)
        sources = S.plan(inputs.file_rows, base.depth, base.window_ns,
                         directories=inputs.directories)  # fmt: skip
        merged = cap / M.MERGED_NAME
        assert sources.rollups == [str(merged)] and not sources.raw
        own = [R.rollup_path(Path(p)) for p in inputs.paths]
        opts = replace(base, top=5)
        same_computed(merged_sums(merged, opts), A.compute_local(
            pa.concat_tables([pq.read_table(p) for p in own]), opts))  # fmt: skip
        found = M.read(merged, cap)
        assert found is not None and found.members == inputs.file_rows
        return sources

    first = plan()
    assert first.made == 3 and first.merged == 3
    assert "merged the rollups of 3 capture files (4,500 rows)" in first.lines()[1]
    stamp = (cap / M.MERGED_NAME).stat().st_mtime_ns
    again = plan()
    assert again.lines() == [] and (cap / M.MERGED_NAME).stat().st_mtime_ns == stamp
    write(cap / "capture-3.parquet", rows_of(40, 700, "h3"))
    added = plan()
    assert added.merged == 1 and "of 1 capture file (700 rows)" in added.lines()[-1]
    (cap / "capture-0.parquet").unlink()
    assert plan().merged == 3  # a file went: made again from the rollups of the rest
    write(cap / "capture-1.parquet", rows_of(41, 800, "h1"))  # rewritten: other rows
    assert plan().made == 1


def test_a_merged_rollup_serves_only_runs_with_all_its_files(tmp_path: Path) -> None:
    """A run of some of a directory's files reads their own rollups: the
    directory's merged rollup holds the others too, and is left as it is."""
    cap = tmp_path / "cap"
    paths = [write(cap / f"capture-{i}.parquet", rows_of(50 + i, 500, "h")) for i in range(3)]
    inputs = resolve([str(cap)])
    S.plan(inputs.file_rows, 2, 10**9, directories=inputs.directories)
    stamp = (cap / M.MERGED_NAME).stat().st_mtime_ns
    some = resolve([str(p) for p in paths[:2]])
    sources = S.plan(some.file_rows, 2, 10**9, directories=some.directories)
    assert sorted(sources.rollups) == sorted(str(R.rollup_path(p)) for p in paths[:2])
    assert (cap / M.MERGED_NAME).stat().st_mtime_ns == stamp
    assert sources.grain is None  # two rollups: each set summed by the job


def test_a_fleet_s_merged_rollup_is_made_from_its_hosts_merged_rollups(tmp_path: Path) -> None:
    """Hosts' directories analysed one by one, then together: the fleet's
    merged rollup is the sum of the hosts' (not of every file again), and
    names every file relative to the fleet's directory."""
    fleet = tmp_path / "fleet"
    for h in range(3):
        for i in range(2):
            write(
                fleet / f"host{h}" / f"capture-{i}.parquet", rows_of(60 + 2 * h + i, 400, f"h{h}")
            )
    for h in range(3):
        one = resolve([str(fleet / f"host{h}")])
        S.plan(one.file_rows, 2, 10**9, directories=one.directories)
        assert (fleet / f"host{h}" / M.MERGED_NAME).is_file()
    inputs = resolve([str(fleet)])
    base = A.span_options(A.AnalyzeOptions(), inputs.first_ns, inputs.last_ns)
    sources = S.plan(inputs.file_rows, base.depth, base.window_ns, directories=[str(fleet)])
    assert sources.rollups == [str(fleet / M.MERGED_NAME)] and sources.made == 0
    assert sources.grain is not None
    merged = pq.read_table(fleet / M.MERGED_NAME)
    files = merged.filter(pc.equal(merged["_set"], R.FILE_SET))["key"].to_pylist()
    assert sorted(files) == [f"host{h}/capture-{i}.parquet" for h in range(3) for i in range(2)]
    opts = replace(base, top=5)
    every = pa.concat_tables([pq.read_table(R.rollup_path(Path(p))) for p in inputs.paths])
    same_computed(A.compute_local(merged, opts), A.compute_local(every, opts))


def test_a_read_only_directory_s_merged_rollup_goes_into_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = tmp_path / "cap"
    for i in range(2):
        write(cap / f"capture-{i}.parquet", rows_of(70 + i, 300, "h"))
    monkeypatch.setattr(S, "_writable", lambda directory: False)
    inputs = resolve([str(cap)])
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    out1.mkdir()
    out2.mkdir()
    first = S.plan(inputs.file_rows, 2, 10**9, out=out1, directories=inputs.directories)
    kept = out1 / S.ROLLUPS_DIR / M.kept_name(cap)
    assert first.rollups == [str(kept)] and not list(cap.glob("*.rollup*"))
    again = S.plan(inputs.file_rows, 2, 10**9, out=out2, previous=out1,
                   directories=inputs.directories)  # fmt: skip
    assert again.lines() == [] and again.rollups == [str(out2 / S.ROLLUPS_DIR / kept.name)]


@pytest.mark.spark
def test_a_fleet_through_its_merged_rollup_gives_the_tables_of_raw_rows_and_duckdb(
    spark: Any, tmp_path: Path
) -> None:
    """Several hosts' directories under one, analysed through the merged
    rollup: every table (the per-host ones among them) and the summary those
    of raw rows, and DuckDB's."""
    from sbus_relay.bench.peer import analyse, same_tables

    fleet = tmp_path / "fleet"
    for h in range(4):
        write(fleet / f"host{h}" / "capture-a.parquet", rows_of(80 + h, 900, f"host{h}"))
        write(fleet / f"host{h}" / "capture-b.parquet", rows_of(90 + h, 600, f"host{h}", 1800))
    inputs = resolve([str(fleet)])
    merged = tmp_path / "merged"
    A.run(spark, inputs, merged, A.AnalyzeOptions())
    assert (fleet / M.MERGED_NAME).is_file()
    raw = tmp_path / "raw"
    A.run(spark, inputs, raw, A.AnalyzeOptions(), S.Sources(raw=list(inputs.paths)))
    assert tables(merged) == tables(raw)
    assert (merged / "summary.json").read_text() == (raw / "summary.json").read_text()
    analyse(str(fleet), str(tmp_path / "duck"))
    assert same_tables(str(tmp_path / "duck"), str(merged)) == []
    assert json.loads((merged / "summary.json").read_text())["instances"] == 4
