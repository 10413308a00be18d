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


def _up_until_serving(config: Path, err: Path) -> Any:
    """``sbus-relay up FILE``, once it says how to try it (every bus serves)."""
    import subprocess

    from tests.support import VENV_BIN, read_line

    with open(err, "wb") as stream:
        up = subprocess.Popen(
            [os.path.join(VENV_BIN, "sbus-relay"), "up", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stream,
        )  # fmt: skip
    assert up.stdout is not None
    line = b""
    while not line.startswith(b" and: "):
        line = read_line(up.stdout.fileno(), 60)
        assert line, err.read_text()
    return up


@pytest.mark.timeout(300)
def test_an_up_tree_upgraded_under_load_loses_nothing(tmp_path: Path) -> None:
    """``sbus-relay upgrade TREE.yaml`` of the configs/dev-fleet.yaml tree (two
    masters joined by a 3-node cluster, a relay below each), three times, while
    each relay publishes 1,000 messages a second to the other host's relay:
    every bus is upgraded, both masters cut over to new links, nothing is lost,
    duplicated or reordered, and nothing is counted lost.  (The tree whose old
    master answered a cut late, as a link hand-over that needed the old bus
    would have it, is the case this covers.)"""
    import shutil

    from tests.nats.cluster import http_json, nats_server_binary
    from tests.nats.test_up_fleet import fleet_config
    from tests.support import short_dir

    nats_server_binary()  # skips without one
    where = short_dir()
    config, document = fleet_config(tmp_path, where)
    buses = {b["name"]: b for b in document["buses"]}
    up = _up_until_serving(config, tmp_path / "up.err")
    pubs: list[Publisher] = []
    takers: dict[str, tuple[Taker, list[str]]] = {}
    try:
        masters = ("hosta", "hostb")

        def linked(name: str) -> dict[str, Any]:
            doc = http_json(f"http://{buses[name]['metrics']}/clients")
            link: dict[str, Any] = doc["server"]["nats"]
            return link

        def log(name: str) -> str:
            return (Path(where) / f"{name}.log").read_text(errors="replace")

        wait_until(lambda: all(linked(m)["settled"] for m in masters), 30, "both joined")
        relays = {"a": buses["hosta-relay"]["address"], "b": buses["hostb-relay"]["address"]}
        takers = {
            "hostb-relay": (Taker(relays["b"], [b"f/a/"], "b"), ["a"]),
            "hosta-relay": (Taker(relays["a"], [b"f/b/"], "a"), ["b"]),
        }
        for taker, _ in takers.values():
            taker.start()
        deadline = time.monotonic() + 30
        while not all(set(w) <= t.warm for t, w in takers.values()):
            assert time.monotonic() < deadline, "interest never whole"
            for name, address in relays.items():
                with Client(address, timeout=10) as w:
                    w.publish(b"f/%s/x" % name.encode(), name.encode() + b" warm")
            time.sleep(0.2)
        pubs = [Publisher(address, name) for name, address in relays.items()]
        for p in pubs:
            p.start()
        time.sleep(1.0)
        for i in range(3):
            done = run_cli("upgrade", str(config), timeout=120)
            assert done.returncode == 0, (done.stdout.decode(), done.stderr.decode())
            for m in masters:
                wait_until(
                    lambda m=m, i=i: log(m).count('"nats.link_took_over"') >= i + 1,  # type: ignore[misc]
                    CUT_WAIT,
                    f"upgrade {i + 1} of {m}: the new link took over",
                )
            time.sleep(0.5)
        time.sleep(1.0)
        for p in pubs:
            p.stopping.set()
        for p in pubs:
            p.join(10)
        flows = {p.name: p.sent for p in pubs}
        expected = sum(flows[f] for _, wanted in takers.values() for f in wanted)
        deadline = time.monotonic() + 30
        while sum(len(t.got[f]) for t, w in takers.values() for f in w) < expected:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        figures: dict[str, Any] = {"flows": check(flows, takers)}
        for m in masters:
            link = linked(m)
            figures[m] = {
                "lost": link["lost"],
                "refused": sum(o["duplicate"] + o["late"] for o in link["origins"].values()),
                "drops": {k: v for k, v in link["drops"].items() if v},
                "cuts": log(m).count('"nats.link_cut"'),
                "failed": log(m).count('"nats.link_handover_failed"'),
                "shared": log(m).count('"nats.host_name_shared"'),
            }
        print("up tree, 3 upgrades:", figures)
        for name, flow in figures["flows"].items():
            assert flow["sent"] > 0, (name, figures)
            assert flow["lost"] == flow["duplicated"] == flow["out_of_order"] == 0, (name, figures)
        for m in masters:
            assert figures[m] == {
                "lost": 0, "refused": 0, "drops": {}, "cuts": 3, "failed": 0, "shared": 0,
            }, figures  # fmt: skip
        for name in buses:
            assert "Traceback" not in log(name), name
    finally:
        for p in pubs:
            p.stopping.set()
        for taker, _ in takers.values():
            taker.stopping.set()
        up.send_signal(signal.SIGINT)
        up.wait(30)
        if up.stdout is not None:
            up.stdout.close()
        shutil.rmtree(where, ignore_errors=True)
