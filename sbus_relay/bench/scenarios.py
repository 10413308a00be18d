"""The benchmark's building blocks: servers, one load run, the relay warm-up, memory.

A *load* is some loadgen processes against one or two addresses: optional idle
clients holding non-matching patterns, optional clients that subscribe and
unsubscribe all along (churn), optional stalled subscribers, reading
subscribers, then publishers released together.  Throughput is counted at the
reading subscribers: deliveries / (last receive - first send).  The servers'
CPU time (utime + stime from /proc) is read just before the publishers start
and after the last subscriber is done; their RSS at the end of the run.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sbus_relay.client import Client
from sbus_relay.protocol.keys import Credentials

from .procs import BenchProcessError, Child, ProcessSet, cpu_seconds, rss_bytes, wait_accepting

#: Routing-key prefix of the measured traffic (keys are PREFIX/<publisher>/...).
KEY_PREFIX = "bench"
#: The reading subscribers' pattern: every measured key.
PATTERN = f"{KEY_PREFIX}/"
#: The wildcard-heavy subscriber: what matches the "wild" keys (a/P/c/Q, bench/P/Q
#: and the secret bench/P/Q), plus wildcard patterns that never match.
WILD_PATTERNS = (
    "a/*/c/",
    PATTERN,
    f"!/cred////{KEY_PREFIX}/",
    "a/*/d/",
    "b/*/c/",
    f"{KEY_PREFIX}/*/x/",
    "*/*/never/",
)
#: Key prefix of secret messages to a subscriber whose pattern left its
#: credentials empty.  Our server fills them in at SUB (docs/protocol.md,
#: "Credentials and secret keys"), so the key
#: carries the subscriber's gid/uid/pid; the reference stores the pattern as
#: given, so the key must carry the empty fields too.
SECRET_LITERAL = "!/cred////"
#: Flood mode the reading subscribers ask for (docs/protocol.md, "Flood
#: control"): over the hard limit the
#: server stops reading publishers instead of dropping, so every run is lossless
#: like the reference sbusd (which always blocks) and deliveries = messages.
#: The stalled subscriber keeps the defaults (queue, then discard): it must not
#: be able to block anyone.
SUB_FLOOD_MODE = "hard/block"
#: Prefix of the idle clients' patterns (PREFIX/<client>/<n>/x): in the measured
#: keys' namespace, as on a real bus, but never matching one (publisher ids are numbers).
IDLE_PREFIX = f"{KEY_PREFIX}/idle"
#: Seconds for idle clients to connect, and again to subscribe everything.
IDLE_SETUP_TIMEOUT = 120.0
#: Seconds for a subscriber or publisher to connect and pass its barrier.
READY_TIMEOUT = 30.0
#: Seconds the relay gets for its upstream link and interest to work end to end.
RELAY_WARMUP_TIMEOUT = 15.0
#: Key and pattern of the relay warm-up probes: outside ``PATTERN``.
WARMUP_KEY = "warmup/probe"
WARMUP_PATTERN = "warmup/"
#: Seconds to wait for one warm-up probe before sending the next.
WARMUP_PROBE_WAIT = 0.05
#: Seconds left to a server to settle before its RSS is read.
RSS_SETTLE = 0.5
#: Idle clients connected, each with a pattern, before a memory measurement
#: starts: what a server sets up on its first clients and first patterns (a
#: logger, read buffers, its tables' first sizes) is not counted as the cost
#: of the ones measured.
MEMORY_WARM_CLIENTS = 50
#: Seconds a publisher may still take once every subscriber is done; longer
#: means the server stopped reading it (the reference blocks on a full socket).
STALL_GRACE = 3.0
#: Seconds for a run, on top of the time its messages need at this rate.
RUN_BUDGET_BASE = 60.0
RUN_BUDGET_RATE = 2_000.0

_serial = itertools.count(1)


@dataclass(frozen=True)
class Tools:
    """Where the programs are: the load generator and the argv of the servers."""

    loadgen: Path
    sbusd: tuple[str, ...]
    sbus_relay: tuple[str, ...]
    reference: Path | None
    #: the NATS C load generator (where libnats is installed), for the fleet's limit
    natsload: Path | None = None


def _entry_point(script: str, func: str) -> tuple[str, ...]:
    """The console script beside this Python, else ``python -c`` calling it."""
    beside = Path(sys.executable).parent / script
    if beside.exists():
        return (str(beside),)
    found = shutil.which(script)
    if found:
        return (found,)
    code = f"import sys; from sbus_relay.cli import {func}; sys.exit({func}())"
    return (sys.executable, "-P", "-c", code)


def find_tools(
    programs: dict[str, Path], sbusd: Sequence[str] | None = None, reference: Path | None = None
) -> Tools:
    """Tools from the built programs; ``sbusd`` overrides our measured server's argv."""
    return Tools(
        loadgen=programs["loadgen"],
        sbusd=tuple(sbusd) if sbusd else _entry_point("sbusd", "sbusd_main"),
        sbus_relay=_entry_point("sbus-relay", "main"),
        reference=reference,
        natsload=programs.get("natsload"),
    )


def child_env() -> dict[str, str]:
    """Environment of the children: this package importable even if not installed."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def new_address(workdir: Path, name: str) -> str:
    """A fresh socket path in ``workdir`` (short enough for sun_path)."""
    return str(workdir / f"{name}{next(_serial)}.sock")


@contextlib.contextmanager
def running_server(
    procs: ProcessSet, name: str, argv: Sequence[str], address: str
) -> Iterator[Child]:
    """Start a server, wait until it accepts on ``address``, stop it afterwards."""
    child = procs.start(name, argv)
    try:
        wait_accepting(address, child)
        yield child
    finally:
        child.stop()


def server_argv(tools: Tools, server: str, address: str) -> list[str]:
    """``ours`` or ``reference``, in the foreground on ``address``."""
    if server == "reference":
        if tools.reference is None:
            raise ValueError("no reference sbusd")
        return [str(tools.reference), "-f", "-a", address]
    return [*tools.sbusd, "-f", "-a", address]


def relay_argv(tools: Tools, address: str, upstream: str) -> list[str]:
    return [*tools.sbus_relay, "serve", "-f", "-a", address, "--upstream", upstream]


@dataclass(frozen=True)
class Load:
    """What to throw at a server in one run."""

    messages: int  # published in total, split between the publishers
    publishers: int = 1  # publisher processes
    pub_conns: int = 1  # connections per publisher process (one publisher id each)
    subscribers: int = 1  # reading subscriber processes
    sub_conns: int = 1  # connections per subscriber process
    each: bool = False  # subscriber connection j hears only publisher j
    patterns: tuple[str, ...] = (PATTERN,)
    keymode: str = "distinct"  # fixed | cycle | distinct | wild (see loadgen.c)
    keys: int = 1000  # distinct keys per publisher in "cycle"
    size: int = 64  # payload bytes
    rate: float = 0.0  # packets/s per publisher process; 0 = as fast as possible
    stalled: int = 0  # subscribers that never read
    idle_clients: int = 0
    idle_patterns: int = 0  # per idle client
    churn: float = 0.0  # subscription changes/s by other clients while the messages flow
    churn_clients: int = 0  # the connections making them, round-robin

    @property
    def sent_total(self) -> int:
        return self.per_pub * self.publishers

    @property
    def per_pub(self) -> int:
        return self.messages // self.publishers

    @property
    def expected(self) -> int:
        """Deliveries if nothing is lost."""
        if self.each:
            return self.sent_total
        return self.sent_total * self.subscribers * self.sub_conns

    @property
    def per_sub_conn(self) -> int:
        """Messages each reading connection should receive."""
        if self.each:
            return self.sent_total // (self.publishers * self.pub_conns)
        return self.sent_total


@dataclass(frozen=True)
class RunResult:
    """One run's outcome, as counted by the reading subscribers."""

    sent: int
    expected: int  # deliveries if nothing is lost
    delivered: int
    window_s: float
    rate: float  # deliveries per second
    lat_p50_us: float
    lat_p99_us: float
    lat_max_us: float
    gaps: int
    reordered: int
    truncated: int
    cpu_s: float  # server CPU time during the run
    cpu_us_per_delivery: float
    #: the load generators' CPU per delivery (publishers and subscribers,
    #: while the messages flowed): what the load costs the shared cores
    load_cpu_us_per_delivery: float
    rss_bytes: int  # server RSS at the end of the run
    stalled: bool  # a publisher never finished: the server stopped reading it
    #: subscription changes/s the churning clients made while the messages flowed
    churn_per_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _loadgen(tools: Tools, mode: str, address: str, *args: object) -> list[str]:
    return [str(tools.loadgen), mode, "-a", address, *(str(a) for a in args)]


def _secret_prefix(sub: Child, literal: bool) -> str:
    if literal:
        return SECRET_LITERAL
    return Credentials(os.getegid(), os.geteuid(), sub.pid).identity().decode() + "/"


def drive(
    procs: ProcessSet,
    tools: Tools,
    load: Load,
    pub_address: str,
    sub_address: str,
    servers: Sequence[Child],
    idle_s: float,
    *,
    literal_secrets: bool = False,
    before_publish: Callable[[], object] | None = None,
) -> RunResult:
    """Run ``load``: publishers on ``pub_address``, everyone else on ``sub_address``.

    ``servers`` are the processes whose CPU and RSS are measured.
    ``before_publish`` runs once every subscriber is ready (the relay warm-up).
    """
    with ProcessSet(procs.log_dir, procs.env) as mine:
        if load.idle_clients:
            idle = mine.start(
                "idle",
                _loadgen(
                    tools,
                    "idle",
                    sub_address,
                    "-c",
                    load.idle_clients,
                    "-K",
                    load.idle_patterns,
                    "-P",
                    IDLE_PREFIX,
                    "-w",
                ),
                stdin=True,
            )
            idle.expect("connected", IDLE_SETUP_TIMEOUT)
            idle.tell("go")
            idle.expect("ready", IDLE_SETUP_TIMEOUT)
        churner = None
        if load.churn:
            churner = mine.start(
                "churn",
                _loadgen(
                    tools,
                    "churn",
                    sub_address,
                    "-c",
                    load.churn_clients,
                    "-r",
                    load.churn,
                    "-P",
                    KEY_PREFIX,
                    "-w",
                ),
                stdin=True,
            )
            churner.expect("ready", READY_TIMEOUT)
        for i in range(load.stalled):
            stalled = mine.start(
                f"stalled{i}", _loadgen(tools, "stalled", sub_address, "-p", PATTERN), stdin=True
            )
            stalled.expect("ready", READY_TIMEOUT)
        subs = []
        for i in range(load.subscribers):
            args: list[object] = ["-n", load.per_sub_conn, "-c", load.sub_conns, "-t", idle_s]
            args += ["-m", SUB_FLOOD_MODE]
            for pattern in load.patterns:
                args += ["-p", pattern]
            if load.each:
                args.append("-e")
            sub = mine.start(f"sub{i}", _loadgen(tools, "sub", sub_address, *args))
            sub.expect("ready", READY_TIMEOUT)
            subs.append(sub)
        if before_publish is not None:
            before_publish()
        pubs = []
        for i in range(load.publishers):
            args = ["-n", load.per_pub, "-c", load.pub_conns, "-s", load.size, "-r", load.rate]
            args += ["-k", KEY_PREFIX, "-x", load.keymode, "-N", load.keys]
            args += ["-i", i * load.pub_conns, "-w"]
            if load.keymode == "wild":
                args += ["-S", _secret_prefix(subs[0], literal_secrets)]
            pub = mine.start(f"pub{i}", _loadgen(tools, "pub", pub_address, *args), stdin=True)
            pub.expect("ready", READY_TIMEOUT)
            pubs.append(pub)
        cpu0 = sum(cpu_seconds(s.pid) for s in servers)
        if churner is not None:
            churner.tell("go")
        for pub in pubs:
            pub.tell("go")
        budget = RUN_BUDGET_BASE + load.expected / RUN_BUDGET_RATE
        if load.rate:
            budget += load.per_pub / load.rate
        sub_results = [sub.result(budget + idle_s) for sub in subs]
        cpu1 = sum(cpu_seconds(s.pid) for s in servers)
        rss = sum(rss_bytes(s.pid) for s in servers)
        churn_per_s = 0.0
        if churner is not None:
            churner.end_input()
            churned = churner.result(STALL_GRACE)
            if float(churned["seconds"]) > 0:
                churn_per_s = int(churned["changes"]) / float(churned["seconds"])
        pub_results = []
        stalled_run = False
        for pub in pubs:
            try:
                pub_results.append(pub.result(STALL_GRACE))
            except BenchProcessError:
                if pub.popen.poll() is not None:
                    raise
                stalled_run = True
    delivered = sum(int(r["count"]) for r in sub_results)
    starts = [int(r["start_ns"]) for r in pub_results]
    firsts = [int(r["first_ns"]) for r in sub_results if r["count"]]
    start = min(starts) if starts else min(firsts, default=0)
    lasts = [int(r["last_ns"]) for r in sub_results if r["count"]]
    window = (max(lasts) - start) / 1e9 if lasts else 0.0
    cpu = max(0.0, cpu1 - cpu0)
    load_ns = sum(int(r.get("cpu_ns", 0)) for r in [*pub_results, *sub_results])
    return RunResult(
        sent=sum(int(r["sent"]) for r in pub_results),
        expected=load.expected,
        delivered=delivered,
        window_s=round(window, 6),
        rate=delivered / window if window > 0 else 0.0,
        lat_p50_us=max(float(r["lat_p50_us"]) for r in sub_results),
        lat_p99_us=max(float(r["lat_p99_us"]) for r in sub_results),
        lat_max_us=max(float(r["lat_max_us"]) for r in sub_results),
        gaps=sum(int(r["gaps"]) for r in sub_results),
        reordered=sum(int(r["reordered"]) for r in sub_results),
        truncated=sum(int(r["truncated"]) for r in sub_results),
        cpu_s=round(cpu, 3),
        cpu_us_per_delivery=cpu * 1e6 / delivered if delivered else 0.0,
        load_cpu_us_per_delivery=load_ns / 1e3 / delivered if delivered else 0.0,
        rss_bytes=rss,
        stalled=stalled_run,
        churn_per_s=round(churn_per_s, 1),
    )


def relay_warmup(
    pub_address: str, sub_address: str, timeout: float = RELAY_WARMUP_TIMEOUT
) -> float:
    """Publish probes on ``pub_address`` until one reaches a subscriber on ``sub_address``.

    Run after the measured subscribers are ready: subscriptions travel between
    relay and master in order, so once a later probe pattern works, theirs
    does too.  Returns the seconds it took; raises ``TimeoutError``.
    """
    started = time.monotonic()
    with Client(sub_address, timeout=timeout) as sub, Client(pub_address, timeout=timeout) as pub:
        sub.subscribe(WARMUP_PATTERN)
        sub.whoami()  # the server handles a client's packets in order: subscribed
        while time.monotonic() - started < timeout:
            pub.publish(WARMUP_KEY, b"probe")
            try:
                if sub.receive(WARMUP_PROBE_WAIT).key == WARMUP_KEY.encode():
                    return time.monotonic() - started
            except TimeoutError:
                continue
    raise TimeoutError(f"no probe crossed the relay within {timeout:.0f} s")


@dataclass(frozen=True)
class MemoryResult:
    """RSS of a server with a few clients already, after more idle clients
    connect, after they subscribe: what each client and pattern adds."""

    clients: int
    patterns: int
    rss_start: int
    rss_connected: int
    rss_subscribed: int

    @property
    def per_client_bytes(self) -> float:
        return (self.rss_connected - self.rss_start) / self.clients

    @property
    def per_pattern_bytes(self) -> float:
        return (self.rss_subscribed - self.rss_connected) / self.patterns if self.patterns else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_memory(
    procs: ProcessSet, tools: Tools, server: Child, address: str, clients: int, per_client: int
) -> MemoryResult:
    """RSS of ``server`` before, after ``clients`` idle connections, after their patterns.

    ``MEMORY_WARM_CLIENTS`` clients connect and subscribe first, and stay."""
    with ProcessSet(procs.log_dir, procs.env) as mine:
        warm = mine.start(
            "idle-warm",
            _loadgen(
                tools, "idle", address, "-c", MEMORY_WARM_CLIENTS, "-K", 1, "-P", "warm", "-w"
            ),
            stdin=True,
        )
        warm.expect("connected", IDLE_SETUP_TIMEOUT)
        warm.tell("go")
        warm.expect("ready", IDLE_SETUP_TIMEOUT)
        time.sleep(RSS_SETTLE)
        rss0 = rss_bytes(server.pid)
        idle = mine.start(
            "idle-mem",
            _loadgen(
                tools, "idle", address, "-c", clients, "-K", per_client, "-P", IDLE_PREFIX, "-w"
            ),
            stdin=True,
        )
        idle.expect("connected", IDLE_SETUP_TIMEOUT)
        time.sleep(RSS_SETTLE)
        rss1 = rss_bytes(server.pid)
        idle.tell("go")
        idle.expect("ready", IDLE_SETUP_TIMEOUT)
        time.sleep(RSS_SETTLE)
        rss2 = rss_bytes(server.pid)
    return MemoryResult(clients, clients * per_client, rss0, rss1, rss2)
