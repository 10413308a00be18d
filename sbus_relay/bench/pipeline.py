"""The analysis benchmark: DuckDB, Spark local, Spark Connect, a cluster, a fleet, --follow.

What it owns: the analysis benchmark's runs, timings and printed figures.
What it may touch: the captures it generates, Spark, DuckDB, the processes it
starts.

    python -m sbus_relay.bench.pipeline --rows 10000000 100000000 --runs 3
    python -m sbus_relay.bench.pipeline --rows 1000000000 --runs 3   # duckdb, connect, cluster
    python -m sbus_relay.bench.pipeline --fleet 20 --rows 100000000 --runs 3
    python -m sbus_relay.bench.pipeline --recorder 1000000    # the recorder (``recording``)
    python -m sbus_relay.bench.pipeline --follow-only --runs 3   # --follow alone
    python -m sbus_relay.bench.pipeline --raw-only --runs 3      # DuckDB and --raw alone

For each size, a synthetic capture (``synth``: files of a million rows, each
spanning the same day), generated once into ``--dir`` (DEFAULT_DIR, never
/tmp: a billion rows take 11 GB) and kept for the next invocation, with each
file's rollup written as ``record`` writes it when it closes the file (timed,
and part of no run).  Then ``--runs`` rounds, each running the engines in turn
(interleaved, so that the load of a shared machine falls on all alike):

- ``duckdb``: the peer (``peer``) on the raw capture files: every table and
  summary figure analyze writes, checked equal to analyze's output in the
  first round;
- ``spark local, cold``: ``sbus-relay analyze --no-report``, as a user runs it:
  a JVM of its own (``local[*]``), with the class archive (built first if
  missing), reading the rollups;
- ``spark connect, warm``: the same with ``--remote``, on one Connect server
  (``connect``) started before the rounds and given WARM_RUNS untimed runs
  first (the first merges the directory's rollups, as any first run does; the
  others warm the server's JIT); ``..., with
  the report``: the same drawing the report too;
- ``spark connect, warm, raw``: the same with ``--raw``: every raw row;
- ``spark cluster``: the same as local with ``--master``, a standalone master
  and worker from the installed pyspark on the same cores (each run starts
  its own executor);
- ``follow``: a new capture file of FOLLOW_ROWS rows published into a directory
  that ``analyze --follow --remote`` watches (seeded with this size's capture),
  as ``record`` publishes one (its rollup, then the file), timed from the
  rollup's rename to the report's summary.json counting the file.

Sizes above LARGE_ROWS run LARGE_ENGINES unless ``--engines`` says otherwise.
``--fleet N`` makes N hosts' capture directories (each file carrying its
host's instance) of ``--rows`` rows in all, and times DuckDB and Connect warm
over all of them against Connect warm over one directory of as many rows.

For each run: end to end (command start to output written), the analysis
alone (from analyze's own line; DuckDB: from connecting to the files written),
peak resident memory (``rss``) and the load average just before and after it
(``timedruns``).  Medians; a ratio or a target is stated only from runs at a
load average of at most 2 (else one line says why not).  Then where the time
of the last warm Connect run went: analyze's phases and the job's stages from
the server's event log (``sparkstages``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from sbus_relay.bench.timedruns import (
    Run,
    breakdown,
    load_average,
    median,
    quiet,
    table,
    timed,
    verdict,
)
from sbus_relay.ops import children

#: Executor cores and memory of the benchmark's cluster worker: the machine's cores.
CLUSTER_CORES = os.cpu_count() or 2
CLUSTER_MEMORY = "4g"
#: The Connect server's heap: analyze's largest (session.MAX_HEAP_MIB), the default.
SERVER_MEMORY = "4g"
#: Where the synthetic captures are kept by default (``--dir``): the cache
#: directory, not /tmp (a billion rows are 11 GB; a shared /tmp is no place).
DEFAULT_DATA = "bench-data"
#: Targets.  A warm report from rollups (Connect, --no-report) within
#: TARGET_WARM_S at TARGET_WARM_ROWS rows; ahead of DuckDB on the raw captures
#: from AHEAD_FROM_ROWS rows on; within FLAT_FACTOR of the smallest size's at
#: every size (rollups grow with windows, prefixes, sizes and keys, not rows),
#: and a fleet's report within FLAT_FACTOR of one directory's of as many rows.
#: From raw rows within TARGET_RAW_VS_DUCKDB times DuckDB up to
#: TARGET_RAW_MAX_ROWS rows; a new FOLLOW_ROWS-row file in the followed report
#: within FOLLOW_TARGET_S.
TARGET_WARM_S = 2.0
TARGET_WARM_ROWS = 10_000_000
AHEAD_FROM_ROWS = 30_000_000
FLAT_FACTOR = 1.5
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
#: The engines, by the names ``--engines`` takes.
DUCKDB = "duckdb"
LOCAL = "spark local, cold"
CONNECT = "spark connect, warm"
CONNECT_REPORT = "spark connect, warm, with the report"
CONNECT_RAW = "spark connect, warm, raw"
CLUSTER = "spark cluster"
FOLLOW = "follow"
ENGINES = {
    "duckdb": DUCKDB, "local": LOCAL, "connect": CONNECT, "report": CONNECT_REPORT,
    "raw": CONNECT_RAW, "cluster": CLUSTER, "follow": FOLLOW,
}  # fmt: skip
#: Sizes above LARGE_ROWS run LARGE_ENGINES by default: a cold start, raw
#: rows and --follow's seeding there take tens of minutes each.
LARGE_ROWS = 100_000_000
LARGE_ENGINES = ("duckdb", "connect", "cluster")
#: The longest wait, before each run, for the load average to fall below 1
#: (``timedruns.settle``; ``--settle``).
SETTLE_S = 60.0
#: Untimed runs over each size before its rounds: the first merges its rollups,
#: the others warm the server's JIT (a fresh server's first runs compile).
WARM_RUNS = 3
#: One directory of a fleet: ``host<NN>``, its instance the same.
HOST_NAME = "host{:02d}"


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
        load_before = load_average()
        start_ms = time.time_ns() // 10**6
        t0 = time.monotonic()
        os.rename(rolled, self.dir / f"new-{seed}.rollup")
        os.rename(made[0], self.dir / f"new-{seed}.parquet")
        self.files += 1
        ok = self._wait(self.files)
        run = Run(FOLLOW, time.monotonic() - t0, None, None, 0.0, 0.0, 0.0, ok, start_ms,
                  time.time_ns() // 10**6)  # fmt: skip
        run.load_before, run.load_after = load_before, load_average()
        return run

    def stop(self) -> None:
        children.stop(self.proc, FOLLOW_STOP_S, sig=signal.SIGINT)  # as Ctrl-C stops it


def prepare(directory: Path, rows: int, hosts: int = 0) -> list[Path]:
    """The synthetic captures of ``rows`` rows in ``directory`` (made once: kept
    for the next invocation), each file with its rollup as ``record`` writes
    it.  ``hosts``: that many hosts' directories under it (HOST_NAME), the rows
    shared out, each file carrying its host's instance."""
    from sbus_relay.bench.synth import generate
    from sbus_relay.pipeline.capture import capture_files

    if not capture_files([str(directory)]):
        t0 = time.monotonic()
        if hosts:
            for h in range(hosts):
                share = rows // hosts + (1 if h < rows % hosts else 0)
                name = HOST_NAME.format(h)
                generate(directory / name, share, instance_names=[name], seed=100 + h)
        else:
            generate(directory, rows)
        print(f"generated {rows:,} rows in {directory} in {time.monotonic() - t0:.0f} s",
              flush=True)  # fmt: skip
    files = capture_files([str(directory)])
    _roll_up(files)
    return files


def engines_for(rows: int, asked: list[str] | None, skip: tuple[str, ...] = ()) -> list[str]:
    """The engines run at ``rows`` rows: those asked for, else all of them up to
    LARGE_ROWS and LARGE_ENGINES above; none of ``skip``."""
    names = asked if asked is not None else LARGE_ENGINES if rows > LARGE_ROWS else list(ENGINES)
    return [ENGINES[e] for e in names if e not in skip]


class Bench:
    """What every size's rounds share: the Connect server (its event log), the
    cluster, the command lines, the working directory."""

    def __init__(self, work: Path, url: str, server: int, events: str,
                 cluster_url: str | None, worker: int | None) -> None:  # fmt: skip
        self.work, self.url, self.server, self.events = work, url, server, events
        self.cluster_url, self.worker = cluster_url, worker
        #: Seconds each run may wait for the load average to settle (``timedruns.settle``).
        self.settle_s = 0.0
        bin_dir = os.path.dirname(sys.executable)
        self.analyze = [os.path.join(bin_dir, "sbus-relay"), "analyze"]

    def command(self, engine: str, captures: Path, out: Path, size: int) -> list[str]:
        """The command line of ``engine`` over ``captures`` into ``out``."""
        from sbus_relay.pipeline.analyze import heap_mib

        if engine == DUCKDB:
            return [sys.executable, "-P", "-m", "sbus_relay.bench.peer", str(captures), str(out)]
        cmd = [*self.analyze, str(captures), "--out", str(out)]
        if engine != CONNECT_REPORT:
            cmd.append("--no-report")
        if engine in (CONNECT, CONNECT_REPORT, CONNECT_RAW):
            cmd += ["--remote", self.url]
        if engine == CONNECT_RAW:
            cmd.append("--raw")
        if engine == CLUSTER:
            assert self.cluster_url is not None
            cmd += ["--master", self.cluster_url]
            cmd += ["--conf", f"spark.executor.memory={heap_mib(size)}m"]
        return cmd

    def run(self, engine: str, captures: Path, out: Path, size: int) -> Run:
        log = out.with_name(out.name + ".log")
        worker = self.worker if engine == CLUSTER else None
        server = self.server if "connect" in engine else None
        cmd = self.command(engine, captures, out, size)
        return timed(engine, cmd, log, worker, server, self.settle_s)

    def warm_up(self, captures: Path, label: str) -> None:
        """The server's first WARM_RUNS runs over ``captures`` (not counted): the
        first one's lines say what it rolled up and merged, as any first run
        does; the others let the server's JIT compile what the job runs, as a
        server that has served a few reports has."""
        for i in range(WARM_RUNS):
            out = self.work / f"first-{label}-{i}"
            first = self.run(CONNECT, captures, out, 0)
            said = out.with_name(out.name + ".log").read_text(errors="replace").splitlines()
            for line in said:
                if "merged the rollups" in line or "rolled up" in line:
                    print(line.removeprefix("sbus-relay analyze: "), flush=True)
            print(f"{label}: the server's run {i + 1} over it (not counted): "
                  f"{first.seconds:.1f} s", flush=True)  # fmt: skip


def rounds(
    bench: Bench, label: str, captures: Path, files: list[Path], engines: list[str], runs: int,
    size: int,
) -> tuple[dict[str, list[Run]], list[str], bool]:  # fmt: skip
    """``runs`` rounds of ``engines`` over ``captures``, interleaved; the runs of
    each, the tables DuckDB's output differs in from analyze's, and whether
    every Spark engine's tables and summary are byte for byte Connect's."""
    from sbus_relay.bench.peer import same_tables
    from sbus_relay.pipeline.analyze import TABLES

    work = bench.work / label
    work.mkdir(parents=True, exist_ok=True)
    bench.warm_up(captures, label)
    follow = FollowProbe(work / "follow", files, bench.url) if FOLLOW in engines else None
    results: dict[str, list[Run]] = {e: [] for e in engines}
    differ: list[str] = []
    same = True
    try:
        for i in range(runs):
            for engine in engines:
                if engine == FOLLOW:
                    assert follow is not None
                    results[FOLLOW].append(follow.measure(seed=1000 + i))
                    continue
                out = work / f"{engine.replace(',', '').replace(' ', '-')}-{i}"
                results[engine].append(bench.run(engine, captures, out, size))
            if i == 0 and CONNECT in engines:
                outputs = {e: work / f"{e.replace(',', '').replace(' ', '-')}-0" for e in engines}
                if DUCKDB in engines:
                    differ = same_tables(str(outputs[DUCKDB]), str(outputs[CONNECT]))
                names = [*(f"{n}/part-00000.parquet" for n in TABLES), "summary.json"]
                for engine in engines:
                    if engine in (DUCKDB, FOLLOW, CONNECT):
                        continue
                    same &= all(
                        (outputs[CONNECT] / n).read_bytes() == (outputs[engine] / n).read_bytes()
                        for n in names
                    )
            for engine, rs in results.items():
                if rs:
                    r = rs[-1]
                    print(
                        f"{label}, round {i + 1}, {engine}: {r.seconds:.2f} s (load average "
                        f"{r.load_before:.1f} to {r.load_after:.1f})"
                        f"{'' if r.ok else ' (FAILED)'}",
                        file=sys.stderr,
                        flush=True,
                    )
            for path in work.iterdir():  # the outputs of later rounds are not compared
                if i > 0 and path.is_dir() and path.name.endswith(f"-{i}"):
                    shutil.rmtree(path, ignore_errors=True)
    finally:
        if follow is not None:
            follow.stop()
    return results, differ, same


def size_report(
    bench: Bench, rows: int, files: list[Path], results: dict[str, list[Run]],
    differ: list[str], same: bool, runs: int,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """The table of one size's rounds, its targets, and where the last warm run's time went."""
    from sbus_relay.pipeline.analyze import heap_mib

    size = sum(f.stat().st_size for f in files)
    rollups = sum(p.stat().st_size for f in files for p in [f.with_suffix(".rollup")]
                  if p.exists())  # fmt: skip
    print(f"\n### {rows:,} rows: {size / 2**20:,.0f} MiB of Parquet in {len(files)} files "
          f"(rollups {rollups / 2**20:,.0f} MiB), {os.cpu_count()} CPUs, "
          + (f"{runs} interleaved rounds (medians)\n" if runs != 1 else "one round\n"))  # fmt: skip
    if DUCKDB in results and CONNECT in results:
        print(
            "DuckDB computes every table and summary figure analyze writes: "
            + ("identical to analyze's output" if not differ else f"DIFFERS in {', '.join(differ)}")
            + "; every Spark engine's tables and summary "
            + ("byte-identical to Connect's" if same else "DIFFER from Connect's")
            + "\n"
        )
    med = table(results)
    print()
    warm = results.get(CONNECT, [])
    duck = results.get(DUCKDB, [])
    if warm and rows == TARGET_WARM_ROWS:
        print(verdict(f"target: a warm report from the rollups (Connect, --no-report) within "
                      f"{TARGET_WARM_S:g} s: {med[CONNECT]['seconds']:.2f} s", warm,
                      med[CONNECT]["seconds"] <= TARGET_WARM_S))  # fmt: skip
    if CONNECT_REPORT in med:
        print(f"with the report: {med[CONNECT_REPORT]['seconds']:.2f} s")
    if warm and duck:
        ratio = med[CONNECT]["seconds"] / med[DUCKDB]["seconds"]
        if quiet(warm + duck):
            print(f"Connect warm from the rollups {med[CONNECT]['seconds']:.2f} s = {ratio:.2f}x "
                  f"DuckDB's {med[DUCKDB]['seconds']:.2f} s on the raw captures")  # fmt: skip
        if rows >= AHEAD_FROM_ROWS:
            print(verdict("target: ahead of DuckDB on the raw captures", warm + duck, ratio < 1))
        elif not quiet(warm + duck):
            print(verdict("Connect warm against DuckDB", warm + duck, ratio < 1))
    raw = results.get(CONNECT_RAW, [])
    if raw and duck and rows <= TARGET_RAW_MAX_ROWS:
        ratio = med[CONNECT_RAW]["seconds"] / med[DUCKDB]["seconds"]
        print(verdict(f"target: Connect warm from raw rows within {TARGET_RAW_VS_DUCKDB:g}x "
                      f"DuckDB" + (f" ({ratio:.1f}x)" if quiet(raw + duck) else ""), raw + duck,
                      ratio <= TARGET_RAW_VS_DUCKDB))  # fmt: skip
    follow = results.get(FOLLOW, [])
    if follow:
        lat = med[FOLLOW]["seconds"]
        print(verdict(f"target: a new {FOLLOW_ROWS:,}-row capture file in the followed report "
                      f"within {FOLLOW_TARGET_S:g} s: {lat:.1f} s", follow,
                      lat <= FOLLOW_TARGET_S))  # fmt: skip
    said = [f"captures {size / 2**20:,.0f} MiB on disk"]
    if LOCAL in med:
        said.append(f"local driver JVM peak {med[LOCAL]['driver_jvm']:,.0f} MiB "
                    f"(heap {heap_mib(size)} MiB)")  # fmt: skip
    if CONNECT in med:
        said.append(f"Connect server JVM peak {med[CONNECT]['driver_jvm']:,.0f} MiB "
                    f"(heap {SERVER_MEMORY})")  # fmt: skip
    print("memory: " + "; ".join(said))
    if warm:
        breakdown(warm[-1], bench.events, f"the last warm Connect run ({rows:,} rows)")
    if raw:
        breakdown(raw[-1], bench.events, f"the last Connect run from raw rows ({rows:,} rows)")
    return med


def _class_archive_line() -> None:
    print(f"Spark class archive: {_class_archive()}", flush=True)


@contextlib.contextmanager
def bench_setup(base: Path, with_cluster: bool, settle_s: float = 0.0) -> Iterator[Bench]:
    """A Connect server (event log on) and, ``with_cluster``, a standalone
    cluster, for every size; their files under ``base``, removed after."""
    from sbus_relay.bench.cluster import standalone_cluster
    from sbus_relay.bench.sparkstages import event_log_conf
    from sbus_relay.pipeline.connect import ServerOptions, connect_server, free_port
    from sbus_relay.pipeline.session import SparkSettings

    with contextlib.ExitStack() as stack:
        work = base / f"work-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
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
        bench = Bench(work, opts.url, server.pid, str(events), cluster.url if cluster else None,
                      cluster.worker.pid if cluster else None)  # fmt: skip
        bench.settle_s = settle_s
        yield bench


def analysis_benchmark(
    sizes: list[int], base: Path, runs: int, asked: list[str] | None, skip: tuple[str, ...],
    command: str, settle_s: float = 0.0,
) -> int:  # fmt: skip
    """Every size in turn, one Connect server (and one cluster) for all of them;
    then whether the warm report stays within FLAT_FACTOR of the smallest size's."""
    _class_archive_line()
    plans = {rows: engines_for(rows, asked, skip) for rows in sizes}
    ok = True
    warm: dict[int, list[Run]] = {}
    with bench_setup(base, any(CLUSTER in e for e in plans.values()), settle_s) as bench:
        print(f"command: {command}; data in {base}", flush=True)
        for rows in sizes:
            directory = base / f"synth{rows}"
            files = prepare(directory, rows)
            results, differ, same = rounds(
                bench, f"synth{rows}", directory, files, plans[rows], runs, rows
            )
            size_report(bench, rows, files, results, differ, same, runs)
            ok &= all(r.ok for rs in results.values() for r in rs) and not differ and same
            if results.get(CONNECT):
                warm[rows] = results[CONNECT]
    if len(warm) > 1:
        smallest = min(warm)
        base_s = median(r.seconds for r in warm[smallest])
        print()
        for rows, rs in sorted(warm.items()):
            if rows == smallest:
                continue
            factor = median(r.seconds for r in rs) / base_s
            print(verdict(f"target: the warm report at {rows:,} rows within {FLAT_FACTOR:g}x "
                          f"that at {smallest:,}" + (f" ({factor:.2f}x)" if quiet(
                              rs + warm[smallest]) else ""), rs + warm[smallest],
                          factor <= FLAT_FACTOR))  # fmt: skip
    return 0 if ok else 1


def fleet_benchmark(hosts: int, rows: int, base: Path, runs: int, asked: list[str],
                    command: str, settle_s: float = 0.0) -> int:  # fmt: skip
    """A fleet's report: ``hosts`` hosts' directories of ``rows`` rows in all, by
    DuckDB and by Connect warm, against Connect warm over one directory of as
    many rows; every table (the per-host ones among them) equal to DuckDB's."""
    _class_archive_line()
    engines = [ENGINES[e] for e in asked]
    with bench_setup(base, CLUSTER in engines, settle_s) as bench:
        print(f"command: {command}; data in {base}", flush=True)
        fleet = base / f"fleet{hosts}x{rows}"
        files = prepare(fleet, rows, hosts)
        one = base / f"synth{rows}"
        one_files = prepare(one, rows)
        label = f"fleet{hosts}x{rows}"
        results, differ, same = rounds(bench, label, fleet, files, engines, runs, rows)
        single, _, _ = rounds(bench, f"one{rows}", one, one_files, [CONNECT], runs, rows)
        print(f"\n## A fleet: {hosts} hosts' capture directories, {rows:,} rows in all")
        size_report(bench, rows, files, results, differ, same, runs)
        ok = all(r.ok for rs in results.values() for r in rs) and not differ and same
        if CONNECT in results and single[CONNECT]:
            fleet_s = median(r.seconds for r in results[CONNECT])
            one_s = median(r.seconds for r in single[CONNECT])
            both = results[CONNECT] + single[CONNECT]
            said = f" ({fleet_s:.2f} s against {one_s:.2f} s)" if quiet(both) else ""
            print(
                verdict(
                    f"target: the fleet's report within {FLAT_FACTOR:g}x one directory's "
                    f"of {rows:,} rows{said}",
                    both,
                    fleet_s <= FLAT_FACTOR * one_s,
                )
            )
    return 0 if ok else 1


def follow_benchmark(sizes: list[int], base: Path, runs: int, settle_s: float = 0.0) -> int:
    """The --follow probe alone, on a Connect server of its own: ``runs`` new
    files into each size's followed capture; print each time and the median."""
    ok = True
    with bench_setup(base, False, settle_s) as bench:
        for rows in sizes:
            files = prepare(base / f"synth{rows}", rows)
            probe = FollowProbe(bench.work / f"follow{rows}", files, bench.url)
            try:
                found = [probe.measure(seed=2000 + i) for i in range(runs)]
            finally:
                probe.stop()
            ok &= all(r.ok for r in found)
            each = ", ".join(f"{r.seconds:.1f} (load {r.load_before:.1f})" for r in found)
            lat = median(r.seconds for r in found)
            print(
                verdict(
                    f"{rows:,} rows: a new {FOLLOW_ROWS:,}-row capture file in the "
                    f"followed report in {lat:.1f} s ({each}), target "
                    f"{FOLLOW_TARGET_S:g} s",
                    found,
                    lat <= FOLLOW_TARGET_S,
                ),
                flush=True,
            )
    return 0 if ok else 1


def raw_benchmark(sizes: list[int], base: Path, runs: int, settle_s: float = 0.0) -> int:
    """DuckDB and Connect warm from raw rows alone, on a Connect server of its
    own given one untimed raw run first: ``runs`` interleaved pairs per size,
    each run with the load average around it; the medians and their ratio."""
    ok = True
    with bench_setup(base, False, settle_s) as bench:
        for rows in sizes:
            directory = base / f"synth{rows}"
            prepare(directory, rows)
            first = bench.run(CONNECT_RAW, directory, bench.work / f"first{rows}", rows)
            print(f"{rows:,} rows: the server's first raw run (not counted): "
                  f"{first.seconds:.1f} s", flush=True)  # fmt: skip
            results: dict[str, list[Run]] = {DUCKDB: [], CONNECT_RAW: []}
            for i in range(runs):
                for engine in (DUCKDB, CONNECT_RAW):
                    out = bench.work / f"{engine.split(',')[-1].strip()}{rows}-{i}"
                    run = bench.run(engine, directory, out, rows)
                    results[engine].append(run)
                    ok &= run.ok
                    print(f"{rows:,} rows, pair {i + 1}, {engine}: {run.seconds:.1f} s "
                          f"(load average {run.load_before:.1f} to {run.load_after:.1f})",
                          flush=True)  # fmt: skip
            duck = median(r.seconds for r in results[DUCKDB])
            raw = median(r.seconds for r in results[CONNECT_RAW])
            both = results[DUCKDB] + results[CONNECT_RAW]
            print(f"{rows:,} rows: duckdb {duck:.1f} s, {CONNECT_RAW} {raw:.1f} s"
                  + (f": {raw / duck:.1f}x" if quiet(both) else ""), flush=True)  # fmt: skip
            if rows <= TARGET_RAW_MAX_ROWS:
                print(verdict(f"target: within {TARGET_RAW_VS_DUCKDB:g}x DuckDB", both,
                              raw <= TARGET_RAW_VS_DUCKDB * duck), flush=True)  # fmt: skip
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Benchmark the analysis (default) or the recorder; print the figures."""
    from sbus_relay.ops.cachedir import cache_dir

    parser = argparse.ArgumentParser(prog="python -m sbus_relay.bench.pipeline")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000],
                        help="capture sizes in rows (default 10000000); with --fleet, "
                        "the rows of all hosts")  # fmt: skip
    parser.add_argument("--dir", default=str(cache_dir() / DEFAULT_DATA),
                        help="where the synthetic captures are kept (synth<ROWS>/, "
                        "fleet<N>x<ROWS>/; default %(default)s)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--settle", type=float, default=SETTLE_S, metavar="SEC",
                        help="before each run, wait up to SEC seconds for the load average to "
                        "fall below 1 (default %(default)s; 0: never wait)")  # fmt: skip
    parser.add_argument("--engines", type=lambda v: v.split(","), default=None,
                        help=f"engines to run, of {','.join(ENGINES)} (default: all up to "
                        f"{LARGE_ROWS:,} rows, {','.join(LARGE_ENGINES)} above)")  # fmt: skip
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster runs")
    parser.add_argument(
        "--fleet",
        type=int,
        metavar="HOSTS",
        help="a fleet's report: HOSTS hosts' directories of --rows rows in all",
    )
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
    if args.engines is not None and not set(args.engines) <= set(ENGINES):
        parser.error(f"--engines takes {', '.join(ENGINES)}")
    asked = args.engines
    skip = ("cluster",) if args.no_cluster else ()
    base = Path(args.dir)
    command = "python -m sbus_relay.bench.pipeline " + " ".join(argv or sys.argv[1:])
    if args.recorder:
        from sbus_relay.bench.recording import recorder_benchmark

        return recorder_benchmark(args.recorder)
    if args.raw_only:
        return raw_benchmark(args.rows, base, max(1, args.runs), args.settle)
    if args.follow_only:
        return follow_benchmark(args.rows, base, max(1, args.runs), args.settle)
    if args.fleet:
        engines = asked if asked is not None else ["duckdb", "connect"]
        engines = [e for e in engines if e not in skip]
        return fleet_benchmark(
            args.fleet, args.rows[0], base, max(1, args.runs), engines, command, args.settle
        )
    return analysis_benchmark(args.rows, base, max(1, args.runs), asked, skip, command, args.settle)


if __name__ == "__main__":
    sys.exit(main())
