"""Live upgrades of a master joined to NATS lose nothing across hosts: three
hosts on a real 3-node cluster, 1,000 messages a second each way between the
upgraded master's host and the two others, every message checked by its flow
and sequence at every host that wants it, and the buses' own counts of what
they lost or refused (docs/nats.md, "A live upgrade's link")."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from sbus_relay.client import Client
from tests.nats.cluster import Cluster, Host, wait_until
from tests.support import run_cli

RATE = 1000  # messages a second, each way
TICK = 0.01  # publishers send a tick's messages at once
#: Seconds a cut may take once the new process serves (a new link process
#: starts, joins NATS, subscribes, and the old one hands over): generous, for
#: a loaded machine; measured 0.5-2 s.
CUT_WAIT = 60.0


class Publisher(threading.Thread):
    """``f/<name>/x`` at ``RATE``, the payload ``<name> <seq>``."""

    def __init__(self, address: str, name: str) -> None:
        super().__init__(daemon=True, name=f"pub-{name}")
        self.address, self.name = address, name
        self.sent = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        key = b"f/%s/x" % self.name.encode()
        head = self.name.encode() + b" "
        with Client(self.address, timeout=30) as c:
            start = time.monotonic()
            while not self.stopping.is_set():
                due = int((time.monotonic() - start) * RATE)
                if due > self.sent:
                    c.publish_many((key, head + b"%d" % i) for i in range(self.sent, due))
                    self.sent = due
                time.sleep(TICK)


class Taker(threading.Thread):
    """Takes the flows of ``patterns`` on one bus: each flow's sequence as it came."""

    def __init__(self, address: str, patterns: list[bytes], name: str) -> None:
        super().__init__(daemon=True, name=f"sub-{name}")
        self.client = Client(address, timeout=30)
        for p in patterns:
            self.client.subscribe(p)
        self.got: dict[str, list[int]] = defaultdict(list)
        self.warm: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        with self.client as c:
            while not self.stopping.is_set():
                try:
                    m = c.receive(timeout=0.2)
                except TimeoutError:
                    continue
                flow, _, seq = bytes(m.payload).partition(b" ")
                if seq == b"warm":
                    self.warm.add(flow.decode())
                else:
                    self.got[flow.decode()].append(int(seq))


def log_text(host: Host) -> str:
    """The master's log (every process of it writes to the same stderr file)."""
    with open(host.master.stderr_path, errors="replace") as src:
        return src.read()


def events(host: Host, event: str) -> int:
    return len(re.findall(rf'"event": ?"{re.escape(event)}"', log_text(host)))


def check(flows: dict[str, int], takers: dict[str, tuple[Taker, list[str]]]) -> dict[str, Any]:
    """Per receiving host and flow: lost, duplicated and out-of-order messages."""
    figures: dict[str, Any] = {}
    for where, (taker, wanted) in takers.items():
        for flow in wanted:
            got = taker.got[flow]
            seen: set[int] = set()
            dup = reordered = 0
            top = -1
            for seq in got:
                if seq in seen:
                    dup += 1
                elif seq < top:
                    reordered += 1
                seen.add(seq)
                top = max(top, seq)
            lost = flows[flow] - len(seen)
            figures[f"{flow}->{where}"] = {
                "sent": flows[flow], "lost": lost, "duplicated": dup, "out_of_order": reordered,
            }  # fmt: skip
    return figures


def upgrades_under_load(tmp_path: Path, cluster: Cluster, upgrades: int) -> dict[str, Any]:
    """``upgrades`` live upgrades of host a's master, one after the other, while
    a, b and c each publish ``RATE`` messages a second (a's to b and c, b's and
    c's to a); what arrived where, and what the buses counted."""
    hosts = [Host(tmp_path, n, cluster.urls(i)) for i, n in enumerate(("a", "b", "c"))]
    a, b, c = hosts
    new_pid = 0
    pubs: list[Publisher] = []
    takers: dict[str, tuple[Taker, list[str]]] = {}
    try:
        wait_until(
            lambda: all(h.link()["settled"] and h.link()["remote_hosts"] == 2 for h in hosts),
            30,
            "every host joined and heard the others",
        )
        takers = {
            "a": (Taker(a.master.address, [b"f/b/", b"f/c/"], "a"), ["b", "c"]),
            "b": (Taker(b.master.address, [b"f/a/"], "b"), ["a"]),
            "c": (Taker(c.master.address, [b"f/a/"], "c"), ["a"]),
        }
        for taker, _ in takers.values():
            taker.start()
        # until every flow reaches every host that wants it: interest is whole
        warmers = {"a": a.relay, "b": b.master, "c": c.master}
        deadline = time.monotonic() + 30
        while not all(set(w) <= t.warm for t, w in takers.values()):
            assert time.monotonic() < deadline, {k: t.warm for k, (t, _) in takers.items()}
            for name, bus in warmers.items():
                assert bus is not None
                with Client(bus.address, timeout=10) as w:
                    w.publish(b"f/%s/x" % name.encode(), name.encode() + b" warm")
            time.sleep(0.2)
        pubs = [Publisher(bus.address, name) for name, bus in warmers.items() if bus is not None]
        for p in pubs:
            p.start()
        time.sleep(1.0)
        seconds = []
        for i in range(upgrades):
            started = time.monotonic()
            done = run_cli("upgrade", "-a", a.master.address, timeout=60)
            assert done.returncode == 0, done.stderr.decode()
            new_pid = int(
                done.stdout.decode().strip().rsplit(" ", 1)[1]
            )  # "... pid OLD -> pid NEW"
            wait_until(
                lambda i=i: events(a, "nats.link_took_over") >= i + 1,  # type: ignore[misc]
                CUT_WAIT,
                f"upgrade {i + 1}: the new link took over",
            )
            seconds.append(round(time.monotonic() - started, 2))
            time.sleep(0.3)
        time.sleep(1.0)
        for p in pubs:
            p.stopping.set()
        for p in pubs:
            p.join(10)
        flows = {p.name: p.sent for p in pubs}
        expected = sum(flows[f] for _, wanted in takers.values() for f in wanted)
        deadline = time.monotonic() + 30  # every message arrived, or the check says which not
        while sum(len(t.got[f]) for t, w in takers.values() for f in w) < expected:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        time.sleep(1.0)  # anything more (a duplicate) would come by now
        figures: dict[str, Any] = {"flows": check(flows, takers), "upgrade_seconds": seconds}
        counted = {}
        for h in hosts:
            link = h.link()
            counted[h.name] = {
                "lost": link["lost"],
                "refused": sum(o["duplicate"] + o["late"] for o in link["origins"].values()),
                "drops": {k: v for k, v in link["drops"].items() if v},
            }
        figures["counted"] = counted
        figures["cuts"] = events(a, "nats.link_cut")
        figures["failed"] = events(a, "nats.link_handover_failed")
        figures["postponed"] = events(a, "nats.link_handover_postponed")
        figures["host_name_shared"] = sum(events(h, "nats.host_name_shared") for h in hosts)
        figures["tracebacks"] = sum(log_text(h).count("Traceback") for h in hosts)
        return figures
    finally:
        for p in pubs:
            p.stopping.set()
        for taker, _ in takers.values():
            taker.stopping.set()
        if new_pid:
            os.kill(new_pid, signal.SIGTERM)
            wait_until(lambda: not os.path.exists(f"/proc/{new_pid}"), 10, "new process gone")
        for h in hosts:
            h.stop()


def assert_lossless(figures: dict[str, Any], upgrades: int) -> None:
    for name, flow in figures["flows"].items():
        assert flow["sent"] > 0, (name, figures)
        assert (flow["lost"], flow["duplicated"], flow["out_of_order"]) == (0, 0, 0), (
            name,
            figures,
        )
    for host, counted in figures["counted"].items():
        assert counted == {"lost": 0, "refused": 0, "drops": {}}, (host, figures)
    assert figures["cuts"] == upgrades, figures  # every upgrade cut over, none failed
    assert figures["failed"] == figures["postponed"] == 0, figures
    assert figures["host_name_shared"] == 0, figures
    assert figures["tracebacks"] == 0, figures


@pytest.mark.timeout(300)
def test_three_upgrades_lose_nothing_across_hosts(tmp_path: Path, cluster: Cluster) -> None:
    """The short form (``make test``): three upgrades under 1,000 msg/s each way."""
    figures = upgrades_under_load(tmp_path, cluster, 3)
    print("3 upgrades:", figures)
    assert_lossless(figures, 3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_twenty_upgrades_lose_nothing_across_hosts(tmp_path: Path, cluster: Cluster) -> None:
    """The target: 20 upgrades of a master under 1,000 msg/s each way to and
    from two other hosts: nothing lost, duplicated or reordered, nothing counted."""
    figures = upgrades_under_load(tmp_path, cluster, 20)
    print("20 upgrades:", figures)
    assert_lossless(figures, 20)
