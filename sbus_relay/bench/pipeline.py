"""The analysis benchmark: DuckDB, Spark local, Spark Connect, a cluster and --follow.

What it owns: the analysis benchmark's runs, timings and printed figures.
What it may touch: the captures it generates, Spark, DuckDB, the processes it
starts.

    python -m sbus_relay.bench.pipeline --rows 10000000 100000000 --runs 3
    python -m sbus_relay.bench.pipeline --recorder 1000000    # the recorder (``recording``)
    python -m sbus_relay.bench.pipeline --follow-only --runs 3   # --follow alone
    python -m sbus_relay.bench.pipeline --raw-only --runs 3      # DuckDB and --raw alone

For each size, a synthetic capture (``synth``, generated into ``--dir`` unless
there), then ``--runs`` rounds, each running in turn (interleaved, so that the
load of a shared machine falls on all alike):

- ``duckdb``: the peer (``peer``): every table and summary figure analyze
  writes, checked equal to analyze's output in the first round;
- ``spark local, cold``: ``sbus-relay analyze --no-report``, as a user runs it:
  a JVM of its own (``local[*]``), with the class archive (built first if
  missing), reading the rollups;
- ``spark connect, warm``: the same with ``--remote``, on one Connect server
  (``connect``) started before the rounds and given one untimed run first;
- ``spark connect, warm, raw``: the same with ``--raw``: every raw row;
- ``spark cluster``: the same as local with ``--master``, on a standalone
  master and worker from the installed pyspark on the same cores (each run
  starts its own executor);
- ``follow``: a new capture file of FOLLOW_ROWS rows published into a directory
  that ``analyze --follow --remote`` watches (seeded with this size's capture),
  as ``record`` publishes one (its rollup, then the file), timed from the
  rollup's rename to the report's summary.json counting the file.

The synthetic captures get their rollups first, as ``record`` writes them when
it closes each file (timed, and not part of any run).

For each run: end to end (command start to output written) and the analysis
alone (Spark: the job with the session up, from analyze's own line; DuckDB:
from connecting to the files written).  Memory is the peak resident set,
sampled every 0.2 s (``rss``): the driver JVM (the Connect server's JVM for
Connect runs), the cluster's executor, the rest (Python, DuckDB).  Medians,
then whether each target is met; where one is not, the stages of its last run
from the server's event log (``sparkstages``), and the time outside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sbus_relay.bench import sparkstages
from sbus_relay.bench.rss import Sampler
from sbus_relay.ops import children

#: Executor cores and memory of the benchmark's cluster worker: the machine's cores.
CLUSTER_CORES = os.cpu_count() or 2
CLUSTER_MEMORY = "4g"
#: The Connect server's heap: analyze's largest (session.MAX_HEAP_MIB), the default.
SERVER_MEMORY = "4g"
#: Targets: Connect warm from the rollups within TARGET_ROLLUPS_VS_DUCKDB times
#: DuckDB on the raw captures (end to end, any size), from raw rows within
#: TARGET_RAW_VS_DUCKDB times up to TARGET_RAW_MAX_ROWS rows (no target above);
#: a new FOLLOW_ROWS-row capture file in the followed report within FOLLOW_TARGET_S.
TARGET_ROLLUPS_VS_DUCKDB = 2.0
TARGET_RAW_VS_DUCKDB = 5.0
TARGET_RAW_MAX_ROWS = 10_000_000
FOLLOW_ROWS = 1_000_000
FOLLOW_TARGET_S = 5.0
#: Seconds a followed report may take to show a file before the round gives up.
FOLLOW_TIMEOUT_S = 600.0
#: Seconds between looks at the followed report.
FOLLOW_POLL_S = 0.05
#: Seconds the followed analyze gets to stop after Ctrl-C before it is killed.
FOLLOW_STOP_S = 60.0
#: The timing analyze prints (runner.Outcome.line) and the peer's.
SPARK_TIMING = re.compile(r"\((?:Spark start|connected) ([0-9.]+) s, analysis ([0-9.]+) s")
PEER_TIMING = re.compile(r"^analysis ([0-9.]+) s$", re.M)
CONNECT = "spark connect, warm"
CONNECT_RAW = "spark connect, warm, raw"
ENGINES = ("duckdb", "spark local, cold", CONNECT, CONNECT_RAW, "spark cluster")


@dataclass
class Run:
    """One engine's figures in one round."""

    engine: str
    #: Command start to output written.
    seconds: float
    #: The analysis alone (see the module docstring); None if not printed.
    analysis: float | None
    #: Spark's start (or the connection to the server), from analyze's line.
    start: float | None
    #: Peak RSS (MiB): driver (or server) JVM, executor JVM, everything else.
    driver_jvm: float
    executor_jvm: float
    other: float
    ok: bool
    #: Wall clock (ms since the epoch) of the run: its stages in an event log.
    start_ms: int = 0
    end_ms: int = 0


def _timed(
    engine: str, cmd: list[str], log: Path, worker: int | None = None, server: int | None = None
) -> Run:
    """Run ``cmd`` to its end (its stderr into ``log``); its figures."""
    start_ms = time.time_ns() // 10**6
    t0 = time.monotonic()
    proc = children.spawn(
        cmd, log=log, append=False, stdout="pipe", text=True,
        env={k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"},
    )  # fmt: skip
    with Sampler(proc.pid, worker, server) as sampler:
        out, _ = proc.communicate()
    seconds = time.monotonic() - t0
    if proc.returncode:
        err = log.read_text(errors="replace")
        sys.stderr.write(f"{engine} FAILED: {err[-3000:]}\n")
    found = SPARK_TIMING.search(out) or PEER_TIMING.search(out)
    analysis = float(found.groups()[-1]) if found else None
    start = float(found.group(1)) if found and len(found.groups()) > 1 else None
    return Run(
        engine, seconds, analysis, start, sampler.driver_jvm, sampler.executor_jvm, sampler.other,
        proc.returncode == 0, start_ms, time.time_ns() // 10**6,
    )  # fmt: skip


def _roll_up(files: list[Path]) -> None:
    """Write the rollups the synthetic captures lack, as ``record`` does when it
    closes each file; say how long that took (it is no part of a run)."""
    import pyarrow.parquet as pq

    from sbus_relay.pipeline.rollup import roll_up_file, rollup_path, usable

    t0 = time.monotonic()
    rows = 0
    for f in files:
        n = pq.read_metadata(f).num_rows
        if usable(rollup_path(f), n) is None:
            roll_up_file(f)
            rows += n
    if rows:
        print(f"rolled up {rows:,} rows in {time.monotonic() - t0:.1f} s (as record does when "
              "it closes each file; not part of the runs)", flush=True)  # fmt: skip


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _class_archive() -> str:
    """Build analyze's class archive if there is none; say which one the runs use."""
    from sbus_relay.pipeline import classarchive

    path = classarchive.archive_path()
    if path is None:
        return f"none ({classarchive.ENV_SWITCH}=0 or no java)"
    if not classarchive.usable(path):
        subprocess.run(
            [sys.executable, "-m", "sbus_relay.pipeline.classarchive"], check=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    return str(path) if classarchive.usable(path) else "none (it could not be built)"


def _files_in(out: Path) -> int:
    try:
        return int(json.loads((out / "summary.json").read_text())["inputs"]["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


class FollowProbe:
    """``analyze --follow --remote`` on a directory seeded with a size's capture
    (hard links); each ``measure`` renames in a new file and times its report."""

    def __init__(self, work: Path, seed_files: list[Path], url: str) -> None:
        from sbus_relay.bench.synth import generate

        self.dir = work / "followed"
        self.out = work / "followed-report"
        self.spare = work / "spare"
        self.dir.mkdir(parents=True)
        from sbus_relay.pipeline.rollup import rollup_path

        self.rollup_path = rollup_path
        for i, f in enumerate(seed_files):
            os.link(rollup_path(f), self.dir / f"seed-{i:05d}.rollup")
            os.link(f, self.dir / f"seed-{i:05d}.parquet")
        self.files = len(seed_files)
        self.generate = generate
        self.proc = children.spawn(
            [os.path.join(os.path.dirname(sys.executable), "sbus-relay"), "analyze",
             str(self.dir), "--out", str(self.out), "--follow", "--remote", url],
            log=work / "follow.log", append=False, stdout="log",
        )  # fmt: skip
        t0 = time.monotonic()
        self._wait(self.files)
        print(f"follow: the first batch ({self.files} files) took "
              f"{time.monotonic() - t0:.1f} s", file=sys.stderr)  # fmt: skip

    def _wait(self, files: int) -> bool:
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        while _files_in(self.out) != files:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(FOLLOW_POLL_S)
        return True

    def measure(self, seed: int) -> Run:
        """A new FOLLOW_ROWS-row file renamed in; seconds until the report shows it."""
        from sbus_relay.pipeline.rollup import roll_up_file

        made = self.generate(self.spare / str(seed), FOLLOW_ROWS, seconds=3600.0, seed=seed)
        rolled = roll_up_file(made[0])  # what record does as it closes a file
        start_ms = time.time_ns() // 10**6
        t0 = time.monotonic()
        os.rename(rolled, self.dir / f"new-{seed}.rollup")
        os.rename(made[0], self.dir / f"new-{seed}.parquet")
        self.files += 1
        ok = self._wait(self.files)
        return Run("follow", time.monotonic() - t0, None, None, 0.0, 0.0, 0.0, ok, start_ms,
                   time.time_ns() // 10**6)  # fmt: skip

    def stop(self) -> None:
        children.stop(self.proc, FOLLOW_STOP_S, sig=signal.SIGINT)  # as Ctrl-C stops it


def _table(results: dict[str, list[Run]]) -> dict[str, dict[str, float]]:
    """Print the medians per engine; return them."""
    print("| engine | end to end (each run) | Spark start | analysis, session up | "
          "peak RSS, driver JVM | peak RSS, executor JVM | peak RSS, other |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    med: dict[str, dict[str, float]] = {}
    for engine, rs in results.items():
        if not rs:
            continue
        m = {
            "seconds": _median([r.seconds for r in rs]),
            "analysis": _median([r.analysis for r in rs if r.analysis is not None]),
            "start": _median([r.start for r in rs if r.start is not None]),
            "driver_jvm": max(r.driver_jvm for r in rs),
            "executor_jvm": max(r.executor_jvm for r in rs),
            "other": max(r.other for r in rs),
        }
        med[engine] = m
        each = ", ".join(f"{r.seconds:.1f}" for r in rs)
        jvm = f"{m['driver_jvm']:,.0f} MiB" if engine.startswith("spark") else "-"
        if engine.startswith(CONNECT):
            jvm += " (the server)"
        ex = f"{m['executor_jvm']:,.0f} MiB" if engine == "spark cluster" else "-"
        analysis = "-" if math.isnan(m["analysis"]) else f"{m['analysis']:.1f} s"
        start = "-" if math.isnan(m["start"]) else f"{m['start']:.1f} s"
        other = "-" if engine == "follow" else f"{m['other']:,.0f} MiB"
        failed = "" if all(r.ok for r in rs) else " (FAILED)"
        print(f"| {engine}{failed} | {m['seconds']:.1f} s ({each}) | {start} | {analysis} | "
              f"{jvm} | {ex} | {other} |")  # fmt: skip
    return med


def _stages(events: str, run: Run, title: str) -> None:
    found = sparkstages.stages(events, run.start_ms, run.end_ms)
    print(f"\nWhere the time of {title} went ({run.seconds:.1f} s), from Spark's event log:")
    for line in sparkstages.table(found, run.seconds):
        print(line)


def size_benchmark(
    rows: int, directory: Path, runs: int, url: str, server: int, events: str,
    cluster_url: str | None, worker: int | None, work: Path,
) -> bool:  # fmt: skip
    """Every engine on one size, interleaved; print the figures; True when all ran."""
    from sbus_relay.bench.peer import same_tables
    from sbus_relay.bench.synth import generate
    from sbus_relay.pipeline.analyze import TABLES, heap_mib
    from sbus_relay.pipeline.capture import capture_files

    if not capture_files([str(directory)]):
        t0 = time.monotonic()
        generate(directory, rows)
        print(f"generated {rows:,} rows in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    files = capture_files([str(directory)])
    size = sum(f.stat().st_size for f in files)
    _roll_up(files)
    bin_dir = os.path.dirname(sys.executable)
    analyze = [os.path.join(bin_dir, "sbus-relay"), "analyze", str(directory), "--no-report"]
    peer = [sys.executable, "-P", "-m", "sbus_relay.bench.peer", str(directory)]
    executor = ["--conf", f"spark.executor.memory={heap_mib(size)}m"]
    work.mkdir(parents=True, exist_ok=True)
    first = _timed("connect first", [*analyze, "--out", str(work / "first"), "--remote", url],
                   work / "first.log", server=server)  # fmt: skip
    print(f"Spark Connect, the server's first job on this size (not counted): "
          f"{first.seconds:.1f} s", flush=True)  # fmt: skip
    follow = FollowProbe(work / f"follow{rows}", files, url)
    results: dict[str, list[Run]] = {e: [] for e in (*ENGINES, "follow")}
    differ: list[str] = []
    same_as_local = True
    try:
        for i in range(runs):
            rounds: list[tuple[str, list[str], int | None, int | None]] = [
                ("duckdb", [*peer, str(work / f"duckdb{i}")], None, None),
                ("spark local, cold", [*analyze, "--out", str(work / f"local{i}")], None, None),
                (CONNECT,
                 [*analyze, "--out", str(work / f"connect{i}"), "--remote", url], None, server),
                (CONNECT_RAW,
                 [*analyze, "--out", str(work / f"raw{i}"), "--remote", url, "--raw"], None,
                 server),
            ]  # fmt: skip
            if cluster_url is not None:
                cmd = [*analyze, "--out", str(work / f"cluster{i}"), "--master", cluster_url]
                rounds.append(("spark cluster", [*cmd, *executor], worker, None))
            for engine, cmd, w, s in rounds:
                log = work / f"{engine.split(',')[0].replace(' ', '-')}{i}.log"
                results[engine].append(_timed(engine, cmd, log, worker=w, server=s))
            results["follow"].append(follow.measure(seed=1000 + i))
            if i == 0:
                differ = same_tables(str(work / "duckdb0"), str(work / "local0"))
                same_as_local = all(
                    (work / "local0" / t).read_bytes() == (work / other / t).read_bytes()
                    for t in [*(f"{n}/part-00000.parquet" for n in TABLES), "summary.json"]
                    for other in ("connect0", "raw0")
                )
            for engine, rs in results.items():
                if rs:
                    r = rs[-1]
                    print(f"{rows:,} rows, run {i + 1}, {engine}: {r.seconds:.1f} s"
                          f"{'' if r.ok else ' (FAILED)'}", file=sys.stderr)  # fmt: skip
            for engine in ("local", "connect", "raw", "cluster", "duckdb"):
                if i > 0:
                    shutil.rmtree(work / f"{engine}{i}", ignore_errors=True)
    finally:
        follow.stop()
    import pyarrow.parquet as pq

    n_rows = sum(pq.read_metadata(f).num_rows for f in files)
    print(f"\n### {n_rows:,} rows, {size / 2**20:,.0f} MiB of Parquet in {len(files)} files, "
          f"{os.cpu_count()} CPUs, "
          + (f"{runs} interleaved runs (medians)\n" if runs != 1 else "one run\n"))  # fmt: skip
    print("DuckDB computes every table and summary figure analyze writes: "
          + ("identical to analyze's output" if not differ else f"DIFFERS in {', '.join(differ)}")
          + "; Connect's tables and summary, from rollups and from raw rows, "
          + ("byte-identical to local's" if same_as_local else "DIFFER from local's")
          + "\n")  # fmt: skip
    med = _table(results)
    duck = med["duckdb"]["seconds"]
    connect = med[CONNECT]["seconds"]
    bound = TARGET_ROLLUPS_VS_DUCKDB * duck
    connect_met = connect <= bound
    print(
        f"\ntarget: Spark Connect warm from the rollups within {TARGET_ROLLUPS_VS_DUCKDB:g}x "
        f"DuckDB's {duck:.1f} s on the raw captures (<= {bound:.1f} s): {connect:.1f} s = "
        f"{connect / duck:.1f}x, {_met(connect_met)}"
    )
    raw = med[CONNECT_RAW]["seconds"]
    raw_met = True
    if rows <= TARGET_RAW_MAX_ROWS:
        raw_met = raw <= TARGET_RAW_VS_DUCKDB * duck
        print(
            f"target: Spark Connect warm from raw rows within {TARGET_RAW_VS_DUCKDB:g}x DuckDB's "
            f"(<= {TARGET_RAW_VS_DUCKDB * duck:.1f} s): {raw:.1f} s = {raw / duck:.1f}x, "
            f"{_met(raw_met)}"
        )
    else:
        print(f"Spark Connect warm from raw rows (no target at this size): {raw:.1f} s = "
              f"{raw / duck:.1f}x DuckDB")  # fmt: skip
    lat = med["follow"]["seconds"]
    follow_met = lat <= FOLLOW_TARGET_S
    print(
        f"target: a new {FOLLOW_ROWS:,}-row capture file in the followed report within "
        f"{FOLLOW_TARGET_S:g} s: {lat:.1f} s, {_met(follow_met)}"
    )
    local = med["spark local, cold"]
    print(
        f"memory: captures {size / 2**20:,.0f} MiB on disk; local driver JVM peak "
        f"{local['driver_jvm']:,.0f} MiB (heap {heap_mib(size)} MiB), Connect server JVM peak "
        f"{med[CONNECT]['driver_jvm']:,.0f} MiB (heap {SERVER_MEMORY})"
    )
    # Always: where the time of each kind of job goes (docs/pipeline.md shows both).
    _stages(events, results[CONNECT][-1], "the last Connect run from the rollups")
    _stages(events, results[CONNECT_RAW][-1], "the last Connect run from raw rows")
    if not follow_met:
        _stages(events, results["follow"][-1], "the last followed file (batch and report)")
    return all(r.ok for rs in results.values() for r in rs) and not differ


def analysis_benchmark(sizes: list[int], base: Path, runs: int, with_cluster: bool) -> int:
    """Every size in turn, one Connect server (and one cluster) for all of them."""
    from sbus_relay.bench.cluster import standalone_cluster
    from sbus_relay.bench.sparkstages import event_log_conf
    from sbus_relay.pipeline.connect import ServerOptions, connect_server, free_port
    from sbus_relay.pipeline.session import SparkSettings

    print(f"Spark class archive: {_class_archive()}", flush=True)
    ok = True
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="sbus-bench-"))
        stack.callback(shutil.rmtree, work, True)
        events = work / "events"
        events.mkdir()
        settings = SparkSettings(memory=SERVER_MEMORY, conf=event_log_conf(str(events)))
        opts = ServerOptions(port=free_port(), settings=settings)
        server = stack.enter_context(connect_server(opts, str(work / "server.log")))
        cluster = (
            stack.enter_context(standalone_cluster(cores=CLUSTER_CORES, memory=CLUSTER_MEMORY))
            if with_cluster
            else None
        )
        print(f"command: python -m sbus_relay.bench.pipeline --rows "
              f"{' '.join(map(str, sizes))} --runs {runs}", flush=True)  # fmt: skip
        for rows in sizes:
            ok &= size_benchmark(
                rows, base / f"synth{rows}", runs, opts.url, server.pid, str(events),
                cluster.url if cluster else None, cluster.worker.pid if cluster else None,
                work / f"size{rows}",
            )  # fmt: skip
    return 0 if ok else 1


def follow_benchmark(sizes: list[int], base: Path, runs: int) -> int:
    """The --follow probe alone, on a Connect server of its own: ``runs`` new
    files into each size's followed capture; print each time and the median."""
    from sbus_relay.bench.synth import generate
    from sbus_relay.pipeline.capture import capture_files
    from sbus_relay.pipeline.connect import ServerOptions, connect_server, free_port
    from sbus_relay.pipeline.session import SparkSettings

    ok = True
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="sbus-bench-"))
        stack.callback(shutil.rmtree, work, True)
        opts = ServerOptions(port=free_port(), settings=SparkSettings(memory=SERVER_MEMORY))
        stack.enter_context(connect_server(opts, str(work / "server.log")))
        for rows in sizes:
            directory = base / f"synth{rows}"
            if not capture_files([str(directory)]):
                generate(directory, rows)
            files = capture_files([str(directory)])
            _roll_up(files)
            probe = FollowProbe(work / f"follow{rows}", files, opts.url)
            try:
                found = [probe.measure(seed=2000 + i) for i in range(runs)]
            finally:
                probe.stop()
            ok &= all(r.ok for r in found)
            each = ", ".join(f"{r.seconds:.1f}" for r in found)
            lat = _median([r.seconds for r in found])
            print(f"{rows:,} rows: a new {FOLLOW_ROWS:,}-row capture file in the followed report "
                  f"in {lat:.1f} s ({each}), target {FOLLOW_TARGET_S:g} s: "
                  f"{_met(lat <= FOLLOW_TARGET_S)}", flush=True)  # fmt: skip
    return 0 if ok else 1


def raw_benchmark(sizes: list[int], base: Path, runs: int) -> int:
    """DuckDB and Connect warm from raw rows alone, on a Connect server of its
    own given one untimed raw run first: ``runs`` interleaved pairs per size,
    each run with the load average before it; the medians and their ratio."""
    from sbus_relay.bench.synth import generate
    from sbus_relay.pipeline.capture import capture_files
    from sbus_relay.pipeline.connect import ServerOptions, connect_server, free_port
    from sbus_relay.pipeline.session import SparkSettings

    ok = True
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="sbus-bench-"))
        stack.callback(shutil.rmtree, work, True)
        opts = ServerOptions(port=free_port(), settings=SparkSettings(memory=SERVER_MEMORY))
        server = stack.enter_context(connect_server(opts, str(work / "server.log")))
        bin_dir = os.path.dirname(sys.executable)
        for rows in sizes:
            directory = base / f"synth{rows}"
            if not capture_files([str(directory)]):
                generate(directory, rows)
            analyze = [os.path.join(bin_dir, "sbus-relay"), "analyze", str(directory),
                       "--no-report", "--remote", opts.url, "--raw", "--out"]  # fmt: skip
            peer = [sys.executable, "-P", "-m", "sbus_relay.bench.peer", str(directory)]
            first = _timed("first", [*analyze, str(work / "first")], work / "first.log")
            print(f"{rows:,} rows: the server's first raw run (not counted): "
                  f"{first.seconds:.1f} s", flush=True)  # fmt: skip
            results: dict[str, list[Run]] = {"duckdb": [], CONNECT_RAW: []}
            for i in range(runs):
                for engine, cmd in (("duckdb", [*peer, str(work / f"duckdb{i}")]),
                                    (CONNECT_RAW, [*analyze, str(work / f"raw{i}")])):  # fmt: skip
                    load = os.getloadavg()[0]
                    run = _timed(engine, cmd, work / f"{i}.log", server=server.pid)
                    results[engine].append(run)
                    ok &= run.ok
                    print(f"{rows:,} rows, pair {i + 1}, {engine}: {run.seconds:.1f} s "
                          f"(load average {load:.1f} before)", flush=True)  # fmt: skip
            duck = _median([r.seconds for r in results["duckdb"]])
            raw = _median([r.seconds for r in results[CONNECT_RAW]])
            each = {e: ", ".join(f"{r.seconds:.1f}" for r in rs) for e, rs in results.items()}
            print(f"{rows:,} rows: duckdb {duck:.1f} s ({each['duckdb']}), {CONNECT_RAW} "
                  f"{raw:.1f} s ({each[CONNECT_RAW]}): {raw / duck:.1f}x", flush=True)  # fmt: skip
            if rows <= TARGET_RAW_MAX_ROWS:
                print(f"target: within {TARGET_RAW_VS_DUCKDB:g}x DuckDB: "
                      f"{_met(raw <= TARGET_RAW_VS_DUCKDB * duck)}", flush=True)  # fmt: skip
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Benchmark the analysis (default) or the recorder; print the figures."""
    parser = argparse.ArgumentParser(prog="python -m sbus_relay.bench.pipeline")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000],
                        help="capture sizes in rows (default 10000000)")  # fmt: skip
    parser.add_argument("--dir", default="/tmp/sbus-bench-synth",
                        help="where the synthetic captures are kept (synth<ROWS>/)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster runs")
    parser.add_argument(
        "--recorder", type=int, metavar="N", help="benchmark record with N flood messages instead"
    )
    parser.add_argument(
        "--follow-only", action="store_true", help="only the --follow probe, on a server of its own"
    )
    parser.add_argument(
        "--raw-only", action="store_true",
        help="only DuckDB and Connect warm from raw rows, interleaved, on a server of its own",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.recorder:
        from sbus_relay.bench.recording import recorder_benchmark

        return recorder_benchmark(args.recorder)
    if args.raw_only:
        return raw_benchmark(args.rows, Path(args.dir), max(1, args.runs))
    if args.follow_only:
        return follow_benchmark(args.rows, Path(args.dir), max(1, args.runs))
    return analysis_benchmark(args.rows, Path(args.dir), max(1, args.runs), not args.no_cluster)


if __name__ == "__main__":
    sys.exit(main())
