"""The analysis benchmark: Spark local, a standalone cluster and DuckDB, side by side.

    python -m sbus_relay.bench.pipeline --rows 10000000 --dir /tmp/synth10m --runs 3

Generates a synthetic capture (``synth``) unless ``--dir`` already holds one, then
times, on the same files, ``--runs`` rounds of (interleaved, so that the load of a
shared machine falls on all three alike):

- ``duckdb``: the peer (``peer``), computing every table and summary figure that
  analyze writes, checked equal to analyze's output;
- ``spark local``: ``sbus-relay analyze --no-report`` with its defaults (``local[*]``),
  and its JVM class archive (``classarchive``), built first if missing;
- ``spark cluster``: the same against a standalone master and worker started
  from the installed pyspark (``cluster.standalone_cluster``) on the same cores;
  the daemons start once, each run starts its own executor.

For each run: end to end (command start to output written) and the analysis
alone (Spark: the job with the session up, from analyze's own timing line;
DuckDB: from connecting to the files written).  Memory is the peak resident
set, sampled from /proc every SAMPLE_SECONDS: the driver JVM, the executor JVM
(cluster), the Python driver, DuckDB's process.  The medians, and whether each
target is met, go to stdout.

With ``--recorder`` it measures ``sbus-relay record`` instead, against a fresh
bus (``sbusd``) on a private socket: one, then two publishers (FLOOD_PUBLISHERS)
send distinct keys with 64-byte payloads as fast as they can; the rate the bus
routed them at, what the recorder recorded and what it reports lost are
printed.  Then a steady stream (KILL_RATE msgs/s for KILL_SECONDS) with a
``kill -9`` of the recorder at the end: how many messages the recovered capture
misses.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: Seconds between memory samples.
SAMPLE_SECONDS = 0.2
#: Executor cores and memory of the benchmark's cluster worker: the machine's cores.
CLUSTER_CORES = os.cpu_count() or 2
CLUSTER_MEMORY = "4g"
#: The executor gets the heap the local driver gets (analyze.heap_mib; and
#: cli.analyze.CLUSTER_CONF gives it the same collector): the comparison is of
#: the modes, not of the JVM settings.
#: The targets: Spark within TARGET_VS_DUCKDB times DuckDB on 10M rows; the
#: cluster within TARGET_CLUSTER_VS_LOCAL times local on the same cores.
TARGET_VS_DUCKDB = 3.0
TARGET_CLUSTER_VS_LOCAL = 1.3


#: Concurrent flood publishers of the runs: one (the bus's 1-to-1 rate), then two
#: (more than one subscriber's share of the bus on two cores).
FLOOD_PUBLISHERS = (1, 2)
#: Payload size of the flood (bytes).
FLOOD_PAYLOAD = 64
#: Steady rate (msgs/s) and length (s) of the kill -9 run.
KILL_RATE = 4000
KILL_SECONDS = 15


def flood(address: str, count: int, tag: str) -> None:
    """Publish ``count`` messages with distinct keys, as fast as the socket takes them."""
    import socket

    from sbus_relay.protocol.codec import encode_cmsg

    payload = b"p" * FLOOD_PAYLOAD
    packets = [b"MSG flood/%s/%d/%d\0" % (tag.encode(), i % 100, i) + payload for i in range(count)]
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(address)
        send = s.send
        for p in packets:
            send(p)
        s.send(encode_cmsg(b"!/cred/whoami"))  # returns once the bus has routed them all
        s.recv(4096)


def steady(address: str, rate: int, seconds: float) -> int:
    """Publish at ``rate`` msgs/s for ``seconds``; return how many were sent."""
    import socket

    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(address)
        t0 = time.monotonic()
        while (now := time.monotonic() - t0) < seconds:
            while sent < now * rate:
                s.send(b"MSG steady/%d\0%d" % (sent % 10, sent))
                sent += 1
            time.sleep(0.005)
    return sent


def recorder_benchmark(messages: int) -> int:
    """Flood a fresh bus while ``record`` runs; then the kill -9 run.  Prints the figures."""
    import signal

    from sbus_relay.pipeline.capture import capture_files, recover

    bin_dir = os.path.dirname(sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix="sbus-rec-", dir="/tmp"))
    address = str(tmp / "bus")
    bus = subprocess.Popen(
        [os.path.join(bin_dir, "sbusd"), "-f", "-a", address],
        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not os.path.exists(address):
            time.sleep(0.05)
        time.sleep(0.3)
        record = [os.path.join(bin_dir, "sbus-relay"), "record", "-a", address, "-q"]
        for publishers in FLOOD_PUBLISHERS:
            rec = subprocess.Popen(
                [*record, "--out", str(tmp / f"flood{publishers}")],
                stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(3)  # subscribed
            each = messages // publishers
            t0 = time.monotonic()
            pubs = [
                subprocess.Popen([sys.executable, "-P", "-m", "sbus_relay.bench.pipeline",
                                  "--flood", address, str(each), str(i)])
                for i in range(publishers)
            ]  # fmt: skip
            for p in pubs:
                p.wait()
            routed_s = time.monotonic() - t0
            time.sleep(1)
            rec.send_signal(signal.SIGTERM)
            _, err = rec.communicate(timeout=60)
            summary = [x for x in err.splitlines() if x.startswith("recorded")]
            total = each * publishers
            print(f"flood: {total:,} messages from {publishers} publisher(s) routed in "
                  f"{routed_s:.1f} s ({total / routed_s:,.0f} msgs/s); record exit status "
                  f"{rec.returncode}")  # fmt: skip
            print("  " + (summary[0] if summary else err.strip()))

        rec = subprocess.Popen(
            [*record, "--out", str(tmp / "killed")],
            text=True,
            stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(3)
        sent = steady(address, KILL_RATE, KILL_SECONDS)
        rec.kill()
        rec.wait()
        found = recover([tmp / "killed"])
        import pyarrow.parquet as pq

        rows = sum(pq.read_metadata(f).num_rows for f in capture_files([str(tmp / "killed")]))
        missing = sent - rows
        print(f"kill -9: {sent:,} messages at {KILL_RATE:,} msgs/s over {KILL_SECONDS} s, "
              f"then kill -9 of the recorder: {rows:,} recovered ({found.line()}), "
              f"{missing:,} missing = {missing / KILL_RATE:.2f} s of traffic")  # fmt: skip
    finally:
        bus.terminate()
        bus.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


@dataclass
class Run:
    """One engine's figures in one round."""

    engine: str
    #: Command start to output written.
    seconds: float
    #: The analysis alone (see the module docstring); None if not printed.
    analysis: float | None
    #: Peak RSS (MiB): driver JVM, executor JVM, everything else (Python, DuckDB).
    driver_jvm: float
    executor_jvm: float
    other: float
    ok: bool


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rss_mib(pid: int) -> tuple[float, bool]:
    """(resident MiB, is a JVM) of one process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(x.split()[1]) for x in f if x.startswith("VmRSS:")), 0)
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, StopIteration):
        return 0.0, False
    return rss / 1024, os.path.basename(exe) == "java"


def _tree(root: int, kids: dict[int, list[int]]) -> list[int]:
    todo, found = [root], []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(kids.get(pid, []))
    return found


class Sampler:
    """Peak RSS of a command's process tree (its JVMs apart from the rest) and of
    the executors under a cluster worker (the worker's descendants, not itself)."""

    def __init__(self, root: int, worker: int | None = None) -> None:
        self.root = root
        self.worker = worker
        self.driver_jvm = self.executor_jvm = self.other = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            kids = _children()
            jvm = other = executors = 0.0
            for pid in _tree(self.root, kids):
                mib, is_jvm = _rss_mib(pid)
                if is_jvm:
                    jvm += mib
                else:
                    other += mib
            if self.worker is not None:
                for pid in _tree(self.worker, kids)[1:]:
                    mib, is_jvm = _rss_mib(pid)
                    executors += mib if is_jvm else 0.0
            self.driver_jvm = max(self.driver_jvm, jvm)
            self.other = max(self.other, other)
            self.executor_jvm = max(self.executor_jvm, executors)


#: The timing analyze prints (cli.analyze) and the peer's.
SPARK_TIMING = re.compile(r"\(Spark start ([0-9.]+) s, analysis ([0-9.]+) s")
PEER_TIMING = re.compile(r"^analysis ([0-9.]+) s$", re.M)


def _timed(engine: str, cmd: list[str], worker: int | None = None) -> Run:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with Sampler(proc.pid, worker) as sampler:
        out, err = proc.communicate()
    seconds = time.monotonic() - t0
    if proc.returncode:
        sys.stderr.write(err[-3000:])
    found = SPARK_TIMING.search(out) or PEER_TIMING.search(out)
    analysis = float(found.groups()[-1]) if found else None
    return Run(
        engine, seconds, analysis, sampler.driver_jvm, sampler.executor_jvm, sampler.other,
        proc.returncode == 0,
    )  # fmt: skip


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


def analysis_benchmark(rows: int, directory: str, runs: int, with_cluster: bool) -> int:
    """Generate (if needed) and benchmark the analysis; print the figures and targets."""
    from sbus_relay.pipeline.capture import capture_files
    from sbus_relay.pipeline.cluster import standalone_cluster

    from .peer import same_tables
    from .synth import generate

    data = Path(directory)
    if not capture_files([str(data)]):
        generate(data, rows)
    files = capture_files([str(data)])
    size_mib = sum(f.stat().st_size for f in files) / 2**20
    import pyarrow.parquet as pq

    n_rows = sum(pq.read_metadata(f).num_rows for f in files)
    tmp = Path(tempfile.mkdtemp(prefix="sbus-bench-"))
    bin_dir = os.path.dirname(sys.executable)
    analyze = [os.path.join(bin_dir, "sbus-relay"), "analyze", str(data), "--no-report"]
    peer = [sys.executable, "-P", "-m", "sbus_relay.bench.peer", str(data)]
    from sbus_relay.pipeline.analyze import heap_mib

    executor = [
        "--conf",
        f"spark.executor.memory={heap_mib(sum(f.stat().st_size for f in files))}m",
    ]
    # analyze's JVM class archive, as a user has it from the second run on: built
    # now, so that no round has a builder running beside it.
    print(f"Spark class archive: {_class_archive()}", flush=True)
    results: dict[str, list[Run]] = {"duckdb": [], "spark local": [], "spark cluster": []}
    differ: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        cluster = (
            stack.enter_context(standalone_cluster(cores=CLUSTER_CORES, memory=CLUSTER_MEMORY))
            if with_cluster
            else None
        )
        for i in range(runs):
            results["duckdb"].append(_timed("duckdb", [*peer, str(tmp / f"duckdb{i}")]))
            local_out = tmp / f"local{i}"
            results["spark local"].append(
                _timed("spark local", [*analyze, "--out", str(local_out)])
            )
            if i == 0:
                differ = same_tables(str(tmp / "duckdb0"), str(local_out))
            if cluster is not None:
                cmd = [*analyze, "--out", str(tmp / f"cluster{i}"), "--master", cluster.url]
                results["spark cluster"].append(
                    _timed("spark cluster", [*cmd, *executor], worker=cluster.worker.pid)
                )
            for engine, rs in results.items():
                if rs and len(rs) == i + 1:
                    r = rs[-1]
                    print(
                        f"run {i + 1} {engine}: {r.seconds:.1f} s end to end, analysis "
                        f"{'-' if r.analysis is None else f'{r.analysis:.1f} s'}"
                        f"{'' if r.ok else ' (FAILED)'}",
                        file=sys.stderr,
                    )
    print(f"{n_rows:,} rows, {size_mib:,.0f} MiB of Parquet, {os.cpu_count()} CPUs, "
          f"{runs} interleaved runs (medians)")  # fmt: skip
    print(
        "DuckDB computes every table and summary figure analyze writes: "
        + ("identical to analyze's output" if not differ else f"DIFFERS in {', '.join(differ)}")
    )
    print("| engine | end to end | analysis (session up) | peak RSS, driver JVM | "
          "peak RSS, executor JVM | peak RSS, other processes |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    med: dict[str, dict[str, float]] = {}
    for engine, rs in results.items():
        if not rs:
            continue
        m = {
            "seconds": _median([r.seconds for r in rs]),
            "analysis": _median([r.analysis for r in rs if r.analysis is not None]),
            "driver_jvm": max(r.driver_jvm for r in rs),
            "executor_jvm": max(r.executor_jvm for r in rs),
            "other": max(r.other for r in rs),
        }
        med[engine] = m
        runs_s = ", ".join(f"{r.seconds:.1f}" for r in rs)
        jvm = "-" if engine == "duckdb" else f"{m['driver_jvm']:,.0f} MiB"
        ex = f"{m['executor_jvm']:,.0f} MiB" if engine == "spark cluster" else "-"
        status = "" if all(r.ok for r in rs) else " (FAILED)"
        print(f"| {engine}{status} | {m['seconds']:.1f} s ({runs_s}) | {m['analysis']:.1f} s | "
              f"{jvm} | {ex} | {m['other']:,.0f} MiB |")  # fmt: skip
    duck = med["duckdb"]["seconds"]
    local = med["spark local"]
    bound = TARGET_VS_DUCKDB * duck
    print(f"target 1, Spark local within {TARGET_VS_DUCKDB:g}x DuckDB's {duck:.1f} s "
          f"(<= {bound:.1f} s): end to end {local['seconds']:.1f} s = "
          f"{local['seconds'] / duck:.1f}x, {_met(local['seconds'] <= bound)}; analysis with the "
          f"session up {local['analysis']:.1f} s = {local['analysis'] / duck:.1f}x, "
          f"{_met(local['analysis'] <= bound)}")  # fmt: skip
    if "spark cluster" in med:
        c = med["spark cluster"]
        ratio = c["seconds"] / local["seconds"]
        per_run = [
            c_run.seconds / l_run.seconds
            for c_run, l_run in zip(results["spark cluster"], results["spark local"], strict=True)
        ]
        print(f"target 2, cluster within {TARGET_CLUSTER_VS_LOCAL:g}x local on the same cores: "
              f"{c['seconds']:.1f} s / {local['seconds']:.1f} s = {ratio:.2f}x "
              f"(per run {', '.join(f'{x:.2f}' for x in per_run)}), "
              f"{_met(ratio <= TARGET_CLUSTER_VS_LOCAL)}; analysis "
              f"{c['analysis'] / local['analysis']:.2f}x")  # fmt: skip
    jvm_ok = local["driver_jvm"] > 0 and (
        "spark cluster" not in med or med["spark cluster"]["executor_jvm"] > 0
    )
    print(f"target 3, JVM memory reported: driver JVM {local['driver_jvm']:,.0f} MiB local"
          + (f", {med['spark cluster']['driver_jvm']:,.0f} MiB driver + "
             f"{med['spark cluster']['executor_jvm']:,.0f} MiB executor on the cluster"
             if "spark cluster" in med else "")
          + f"; {_met(jvm_ok)}")  # fmt: skip
    ok = all(r.ok for rs in results.values() for r in rs) and not differ
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Benchmark the analysis (default) or the recorder; print the figures."""
    parser = argparse.ArgumentParser(prog="python -m sbus_relay.bench.pipeline")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dir", default="/tmp/sbus-bench-synth", help="synthetic capture")
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster runs")
    parser.add_argument(
        "--recorder", type=int, metavar="N", help="benchmark record with N flood messages instead"
    )
    parser.add_argument("--flood", nargs=3, metavar=("ADDR", "N", "TAG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.flood:
        flood(args.flood[0], int(args.flood[1]), args.flood[2])
        return 0
    if args.recorder:
        return recorder_benchmark(args.recorder)
    return analysis_benchmark(args.rows, args.dir, max(1, args.runs), not args.no_cluster)


if __name__ == "__main__":
    sys.exit(main())
