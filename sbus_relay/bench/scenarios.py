"""The benchmark's building blocks: servers, one load run, the relay warm-up, memory.

A *load* is some loadgen processes against one or two addresses: optional idle
clients holding non-matching patterns, optional stalled subscribers, reading
subscribers, then publishers released together.  Throughput is counted at the
reading subscribers: deliveries / (last receive - first send).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .procs import Child, ProcessSet, rss_bytes, wait_accepting

#: Routing key of the measured traffic and the subscribers' pattern.
KEY = "bench/data"
#: Flood mode the reading subscribers ask for (SPEC §4): over the hard limit the
#: server stops reading publishers instead of dropping, so every run is lossless
#: like the reference sbusd (which always blocks) and deliveries = messages.
#: The stalled subscriber keeps the defaults (queue, then discard): it must not
#: be able to block anyone.
SUB_FLOOD_MODE = "hard/block"
#: Prefix of the idle clients' patterns: never matches ``KEY``.
IDLE_PREFIX = "idle"
#: Seconds for idle clients to connect, and again to subscribe everything.
IDLE_SETUP_TIMEOUT = 120.0
#: Seconds for a subscriber or publisher to connect and pass its barrier.
READY_TIMEOUT = 30.0
#: Seconds the relay gets for its upstream link and interest to work end to end.
RELAY_WARMUP_TIMEOUT = 15.0
#: Seconds left to a server to settle before its RSS is read.
RSS_SETTLE = 0.5

_serial = itertools.count(1)


@dataclass(frozen=True)
class Tools:
    """Where the programs are: the compiled C ones and the argv of our servers."""

    loadgen: Path
    forwarder: Path
    sbusd: tuple[str, ...]
    sbus_relay: tuple[str, ...]


def _entry_point(script: str, func: str) -> tuple[str, ...]:
    """The console script beside this Python, else ``python -c`` calling it."""
    beside = Path(sys.executable).parent / script
    if beside.exists():
        return (str(beside),)
    found = shutil.which(script)
    if found:
        return (found,)
    code = f"import sys; from sbus_relay.cli import {func}; sys.exit({func}())"
    return (sys.executable, "-c", code)


def find_tools(programs: dict[str, Path], sbusd: Sequence[str] | None = None) -> Tools:
    """Tools from the built C programs; ``sbusd`` overrides the measured server's argv."""
    return Tools(
        loadgen=programs["loadgen"],
        forwarder=programs["forwarder"],
        sbusd=tuple(sbusd) if sbusd else _entry_point("sbusd", "sbusd_main"),
        sbus_relay=_entry_point("sbus-relay", "main"),
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


def bus_argv(tools: Tools, address: str) -> list[str]:
    return [*tools.sbusd, "-f", "-a", address]


def forwarder_argv(tools: Tools, address: str) -> list[str]:
    return [str(tools.forwarder), address]


def relay_argv(tools: Tools, address: str, upstream: str) -> list[str]:
    return [*tools.sbus_relay, "serve", "-f", "-a", address, "--upstream", upstream]


@dataclass(frozen=True)
class Load:
    """What to throw at a server in one run."""

    messages: int  # published in total, split between the publishers
    publishers: int = 1
    subscribers: int = 1
    size: int = 64  # payload bytes
    rate: float = 0.0  # packets/s per publisher; 0 = as fast as possible
    stalled: int = 0  # subscribers that never read
    idle_clients: int = 0
    idle_patterns: int = 0  # per idle client


@dataclass(frozen=True)
class RunResult:
    """One run's outcome, as counted by the reading subscribers."""

    sent: int
    expected: int  # deliveries if nothing is lost: sent x reading subscribers
    delivered: int
    window_s: float
    rate: float  # deliveries per second
    lat_p50_us: float
    lat_p99_us: float
    lat_max_us: float
    gaps: int
    reordered: int
    truncated: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _loadgen(tools: Tools, mode: str, address: str, *args: object) -> list[str]:
    return [str(tools.loadgen), mode, "-a", address, *(str(a) for a in args)]


def drive(
    procs: ProcessSet,
    tools: Tools,
    load: Load,
    pub_address: str,
    sub_address: str,
    idle_s: float,
    before_publish: Callable[[], object] | None = None,
) -> RunResult:
    """Run ``load``: publishers on ``pub_address``, everyone else on ``sub_address``.

    ``before_publish`` runs once every subscriber is ready (the relay warm-up).
    """
    per_pub = load.messages // load.publishers
    sent_total = per_pub * load.publishers
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
        for i in range(load.stalled):
            stalled = mine.start(
                f"stalled{i}", _loadgen(tools, "stalled", sub_address, "-p", KEY), stdin=True
            )
            stalled.expect("ready", READY_TIMEOUT)
        subs = []
        for i in range(load.subscribers):
            sub = mine.start(
                f"sub{i}",
                _loadgen(
                    tools,
                    "sub",
                    sub_address,
                    "-n",
                    sent_total,
                    "-p",
                    KEY,
                    "-t",
                    idle_s,
                    "-m",
                    SUB_FLOOD_MODE,
                ),
            )
            sub.expect("ready", READY_TIMEOUT)
            subs.append(sub)
        if before_publish is not None:
            before_publish()
        pubs = []
        for i in range(load.publishers):
            pub = mine.start(
                f"pub{i}",
                _loadgen(
                    tools,
                    "pub",
                    pub_address,
                    "-n",
                    per_pub,
                    "-s",
                    load.size,
                    "-r",
                    load.rate,
                    "-k",
                    KEY,
                    "-i",
                    i,
                    "-w",
                ),
                stdin=True,
            )
            pub.expect("ready", READY_TIMEOUT)
            pubs.append(pub)
        for pub in pubs:
            pub.tell("go")
        budget = 30.0 + sent_total / 5_000 + (sent_total / load.rate if load.rate else 0.0)
        pub_results = [pub.result(budget) for pub in pubs]
        sub_results = [sub.result(budget + idle_s) for sub in subs]
    start = min(int(r["start_ns"]) for r in pub_results)
    delivered = sum(int(r["count"]) for r in sub_results)
    lasts = [int(r["last_ns"]) for r in sub_results if r["count"]]
    window = (max(lasts) - start) / 1e9 if lasts else 0.0
    return RunResult(
        sent=sum(int(r["sent"]) for r in pub_results),
        expected=sent_total * load.subscribers,
        delivered=delivered,
        window_s=round(window, 6),
        rate=delivered / window if window > 0 else 0.0,
        lat_p50_us=max(float(r["lat_p50_us"]) for r in sub_results),
        lat_p99_us=max(float(r["lat_p99_us"]) for r in sub_results),
        lat_max_us=max(float(r["lat_max_us"]) for r in sub_results),
        gaps=sum(int(r["gaps"]) for r in sub_results),
        reordered=sum(int(r["reordered"]) for r in sub_results),
        truncated=sum(int(r["truncated"]) for r in sub_results),
    )


def _await_control(sock: socket.socket, timeout: float) -> None:
    """Read until a CMSG arrives (the answer to our whoami barrier)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if ready and sock.recv(65536).startswith(b"CMSG "):
            return
    raise TimeoutError("no answer to CMSG !/cred/whoami")


def relay_warmup(relay: str, master: str, timeout: float = RELAY_WARMUP_TIMEOUT) -> float:
    """Publish probes on the relay until one reaches a subscriber on the master.

    Run after the measured subscribers are ready: the master sends the relay its
    interest in order, so once a later probe pattern works, theirs does too.
    Returns the seconds it took; raises ``TimeoutError``.
    """
    started = time.monotonic()
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sub,
        socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as pub,
    ):
        sub.connect(master)
        sub.send(b"SUB bench/warmup")
        sub.send(b"CMSG !/cred/whoami")
        _await_control(sub, timeout)
        pub.connect(relay)
        while time.monotonic() - started < timeout:
            pub.send(b"MSG bench/warmup\0probe")
            ready, _, _ = select.select([sub], [], [], 0.05)
            if ready and sub.recv(65536).startswith(b"MSG bench/warmup\0"):
                return time.monotonic() - started
    raise TimeoutError(f"no probe crossed relay -> master within {timeout:.0f} s")


@dataclass(frozen=True)
class MemoryResult:
    clients: int
    patterns: int
    rss_start: int
    rss_connected: int
    rss_subscribed: int
    per_client_bytes: float
    per_pattern_bytes: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_memory(
    procs: ProcessSet, tools: Tools, server: Child, address: str, clients: int, per_client: int
) -> MemoryResult:
    """RSS of ``server`` before, after ``clients`` idle connections, after their patterns."""
    time.sleep(RSS_SETTLE)
    rss0 = rss_bytes(server.pid)
    with ProcessSet(procs.log_dir, procs.env) as mine:
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
    patterns = clients * per_client
    return MemoryResult(
        clients=clients,
        patterns=patterns,
        rss_start=rss0,
        rss_connected=rss1,
        rss_subscribed=rss2,
        per_client_bytes=(rss1 - rss0) / clients,
        per_pattern_bytes=(rss2 - rss1) / patterns if patterns else 0.0,
    )
