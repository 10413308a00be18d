"""The analysis benchmark: Spark local, a standalone cluster and DuckDB, side by side.

    python -m sbus_relay.pipeline.benchmark --rows 10000000 --dir /tmp/synth10m

Generates a synthetic capture (``synth``) unless ``--dir`` already holds one, then
times, on the same files and in the same run:

- ``duckdb``: the same aggregates in DuckDB (the live peer), as Parquet tables;
- ``spark local``: ``sbus-relay analyze`` with its defaults (``local[*]``);
- ``spark cluster``: the same against a standalone master and worker started
  from the installed pyspark (``cluster.standalone_cluster``) on the same cores.

With ``--recorder`` it measures ``sbus-relay record`` instead, against a fresh
bus (``sbusd``) on a private socket: one, then two publishers (FLOOD_PUBLISHERS)
send distinct keys with 64-byte payloads as fast as they can; the rate the bus
routed them at, what the recorder recorded and what it reports lost are
printed.  Then a steady stream (KILL_RATE msgs/s for KILL_SECONDS) with a
``kill -9`` of the recorder at the end: how many messages the recovered capture
misses.

Memory is the peak resident set of the processes doing the work, sampled from
/proc every SAMPLE_SECONDS: for Spark the JVMs (driver, and executor on the
cluster), reported apart from the Python driver; for DuckDB its process.  The
table goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: Seconds between memory samples.
SAMPLE_SECONDS = 0.2
#: Prefix depth and window of the DuckDB query: analyze's defaults on a day of synthetic data.
DEPTH = 2
WINDOW_NS = 300 * 10**9
#: Executor cores and memory of the benchmark's cluster worker.
CLUSTER_CORES = os.cpu_count() or 2
CLUSTER_MEMORY = "4g"
#: The executor gets what a local run's driver gets (cli.analyze.LOCAL_CONF): the
#: same heap and collector on both sides, so the comparison is of the modes.
EXECUTOR_CONF = (
    "--conf", "spark.executor.memory=2g",
    "--conf", "spark.executor.extraJavaOptions=-XX:+UseParallelGC",
)  # fmt: skip

#: The aggregates analyze computes, in DuckDB SQL: the three scans and what derives from them.
DUCKDB_SQL = """
create temp table base as
  select time_ns, key, size::bigint as size, instance,
         array_to_string(list_slice(string_split(key, '/'), 1, {depth}), '/') as prefix,
         (time_ns // {w}) * {w} as window_start_ns
  from read_parquet('{glob}');
create temp table cells as
  select prefix, window_start_ns, instance, count(*) as messages, sum(size) as bytes,
         min(time_ns) as first_ns, max(time_ns) as last_ns
  from base group by all;
create temp table size_counts as select prefix, size, count(*) as n from base group by all;
create temp table key_stats as
  select key, count(*) as messages, sum(size) as bytes from base group by all;
copy (select prefix, window_start_ns, sum(messages) as messages, sum(bytes) as bytes
      from cells group by all) to '{out}/prefix_windows.parquet';
copy (select prefix, sum(n) as messages, sum(size * n) as bytes,
             quantile_cont(size, [0.5, 0.9, 0.99]) as p, max(size) as max_size
      from (select prefix, size, n, unnest(range(n)) from size_counts) group by prefix)
  to '{out}/size_percentiles.parquet';
copy (select * from key_stats order by messages desc, bytes desc, key limit 20)
  to '{out}/top_keys_by_messages.parquet';
copy (select * from key_stats order by bytes desc, messages desc, key limit 20)
  to '{out}/top_keys_by_bytes.parquet';
copy (select instance, sum(messages) as messages, sum(bytes) as bytes,
             min(first_ns) as first_ns, max(last_ns) as last_ns from cells group by all)
  to '{out}/instances.parquet';
copy (select case when size = 0 then 0 else least(floor(log2(size))::int + 1, 20) end as bucket,
             sum(n) as messages from size_counts group by all)
  to '{out}/size_histogram.parquet';
"""


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

    from .capture import capture_files, recover

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
                subprocess.Popen([sys.executable, "-P", "-m", "sbus_relay.pipeline.benchmark",
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
    """One engine's figures."""

    engine: str
    seconds: float
    jvm_mib: float | None
    other_mib: float
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


class TreeSampler:
    """Peak RSS of the process trees under ``roots``: JVMs and the rest, apart."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.jvm_peak = 0.0
        self.other_peak = 0.0
        self.seen_jvm = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            kids = _children()
            todo, jvm, other = list(self.roots), 0.0, 0.0
            while todo:
                pid = todo.pop()
                mib, is_jvm = _rss_mib(pid)
                if is_jvm:
                    jvm += mib
                    self.seen_jvm = True
                else:
                    other += mib
                todo.extend(kids.get(pid, []))
            self.jvm_peak = max(self.jvm_peak, jvm)
            self.other_peak = max(self.other_peak, other)


def _timed(engine: str, cmd: list[str], extra_roots: list[int] | None = None) -> Run:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    with TreeSampler([proc.pid, *(extra_roots or [])]) as sampler:
        out, _ = proc.communicate()
    seconds = time.monotonic() - t0
    sys.stderr.write(out)
    jvm = sampler.jvm_peak if sampler.seen_jvm else None
    return Run(engine, seconds, jvm, sampler.other_peak, proc.returncode == 0)


def duckdb_query(directory: str, out: str) -> None:
    """Run DUCKDB_SQL over the captures in ``directory``, writing into ``out``."""
    import duckdb

    Path(out).mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    glob = os.path.join(directory, "**", "*.parquet")
    con.execute(DUCKDB_SQL.format(depth=DEPTH, w=WINDOW_NS, glob=glob, out=out))
    con.close()


def main(argv: list[str] | None = None) -> int:
    """Generate (if needed) and benchmark; print the table."""
    parser = argparse.ArgumentParser(prog="python -m sbus_relay.pipeline.benchmark")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dir", default="/tmp/sbus-bench-synth", help="synthetic capture")
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster run")
    parser.add_argument(
        "--recorder", type=int, metavar="N", help="benchmark record with N flood messages instead"
    )
    parser.add_argument("--duckdb-only", nargs=2, metavar=("DIR", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--flood", nargs=3, metavar=("ADDR", "N", "TAG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.duckdb_only:
        duckdb_query(*args.duckdb_only)
        return 0
    if args.flood:
        flood(args.flood[0], int(args.flood[1]), args.flood[2])
        return 0
    if args.recorder:
        return recorder_benchmark(args.recorder)

    from .capture import capture_files
    from .cluster import standalone_cluster
    from .synth import generate

    data = Path(args.dir)
    if not capture_files([str(data)]):
        generate(data, args.rows)
    size_mib = sum(f.stat().st_size for f in capture_files([str(data)])) / 2**20
    tmp = Path(tempfile.mkdtemp(prefix="sbus-bench-"))
    analyze = [os.path.join(os.path.dirname(sys.executable), "sbus-relay"), "analyze", str(data)]
    runs = []
    try:
        runs.append(
            _timed("duckdb", [sys.executable, "-P", "-m", "sbus_relay.pipeline.benchmark",
                              "--duckdb-only", str(data), str(tmp / "duckdb")])
        )  # fmt: skip
        runs.append(_timed("spark local", [*analyze, "--out", str(tmp / "local")]))
        if not args.no_cluster:
            with standalone_cluster(cores=CLUSTER_CORES, memory=CLUSTER_MEMORY) as cluster:
                runs.append(
                    _timed(
                        "spark cluster",
                        [
                            *analyze,
                            "--out",
                            str(tmp / "cluster"),
                            "--master",
                            cluster.url,
                            *EXECUTOR_CONF,
                        ],
                        extra_roots=[cluster.worker.pid],  # the executors are its children
                    )
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = runs[0].seconds
    print(f"{args.rows:,} rows, {size_mib:,.0f} MiB of Parquet, {os.cpu_count()} CPUs")
    print("| engine | wall time | vs DuckDB | peak RSS, JVMs | peak RSS, other processes |")
    print("|---|---|---|---|---|")
    for r in runs:
        jvm = "-" if r.jvm_mib is None else f"{r.jvm_mib:,.0f} MiB"
        status = "" if r.ok else " (FAILED)"
        print(
            f"| {r.engine}{status} | {r.seconds:.1f} s | {r.seconds / base:.1f}x | {jvm} | "
            f"{r.other_mib:,.0f} MiB |"
        )
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
