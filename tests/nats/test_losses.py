"""Every loss across hosts seen by the receiver, on real nats-servers: the
member a receiving host uses paused or killed under steady traffic, the
member a sending host uses paused (its messages held there, then let go late),
and what each side counted: received plus counted lost is every message sent,
nothing is delivered out of order, and what comes late is refused."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbus_relay.client import Client
from tests.nats.cluster import Cluster, Host, NatsServer, wait_until

pytestmark = pytest.mark.timeout(240)

RATE = 500  # messages a second from A to B


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.stop()


class Traffic:
    """A steady publisher on host A and a subscriber on host B, each a thread."""

    def __init__(self, a: Host, b: Host, prefix: bytes = b"loss/") -> None:
        self.prefix = prefix
        self.sent = 0
        self.got: list[int] = []
        self._stop = threading.Event()
        self.sub = Client(b.master.address, timeout=10)
        self.sub.subscribe(prefix)
        self.sub.subscribe(b"other/")  # another subscription: delivered apart by nats-py
        wait_until(lambda: a.link()["remote_patterns"] >= 2, 20, "b's interest at a")
        self.pub = Client(a.relay.address if a.relay else a.master.address, timeout=10)
        self._threads = [threading.Thread(target=self._send), threading.Thread(target=self._read)]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        start = time.perf_counter()
        while not self._stop.is_set():
            # two keys, through two of b's subscriptions: one origin's order across both
            key = self.prefix + b"x" if self.sent % 2 else b"other/y"
            self.pub.publish(key, b"%d" % self.sent)
            self.sent += 1
            ahead = start + self.sent / RATE - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)

    def _read(self) -> None:
        while not self._stop.is_set() or True:
            try:
                self.got.append(int(bytes(self.sub.receive(timeout=0.5).payload)))
            except TimeoutError:
                if self._stop.is_set():
                    return

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self.pub.close()
        self.sub.close()


def settled(b: Host, traffic: Traffic) -> dict[str, int]:
    """B's counts of A once every message sent is delivered or counted lost."""

    def done() -> bool:
        at_b = b.link()["origins"].get("hosta", {})
        return len(traffic.got) + at_b.get("lost", 0) >= traffic.sent

    with contextlib.suppress(AssertionError):
        wait_until(done, 20, "b counted every message")
    counts: dict[str, int] = b.link()["origins"]["hosta"]
    return counts


def check(traffic: Traffic, counts: dict[str, int]) -> None:
    got, sent = traffic.got, traffic.sent
    assert got == sorted(got) and len(set(got)) == len(got), "out of order or twice"
    assert counts["delivered"] == len(got), (counts, len(got))
    # exactly: what was not delivered was counted lost, or arrived late (after
    # newer ones were delivered: refused) before its count said it was lost
    assert len(got) + counts["lost"] <= sent <= len(got) + counts["lost"] + counts["late"], (
        sent,
        len(got),
        counts,
    )


@contextlib.contextmanager
def two_hosts(
    tmp_path: Path, cluster: Cluster, a_members: tuple[int, ...], b_members: tuple[int, ...]
) -> Iterator[tuple[Host, Host]]:
    """Host A (a relay below its master) on ``a_members`` and host B (a master
    alone) on ``b_members``, once B has heard of A; both stopped after."""
    a = Host(tmp_path, "hosta", cluster.urls(*a_members))
    try:
        b = Host(tmp_path, "hostb", cluster.urls(*b_members), relay=False)
        try:
            wait_until(lambda: a.link()["settled"] and b.link()["remote_hosts"] == 1, 30, "joined")
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


@contextlib.contextmanager
def flowing(a: Host, b: Host) -> Iterator[Traffic]:
    """``Traffic`` from A to B, once it flows; stopped after."""
    traffic = Traffic(a, b)
    try:
        wait_until(lambda: len(traffic.got) > RATE, 20, "traffic flows")
        yield traffic
    finally:
        traffic.stop()


def victim_of(host: Host, cluster: Cluster) -> NatsServer:
    server = host.link()["server"]
    return next(s for s in cluster.servers if server.endswith(":%d" % s.port))


def test_the_receivers_member_paused_its_loss_counted_exactly(
    tmp_path: Path, cluster: Cluster
) -> None:
    with two_hosts(tmp_path, cluster, (0,), (1, 2)) as (a, b):
        with flowing(a, b) as traffic:
            victim = victim_of(b, cluster)
            reconnects = b.link()["reconnects"]
            victim.pause()
            try:
                time.sleep(5)
            finally:
                victim.resume()
            wait_until(lambda: b.link()["reconnects"] > reconnects, 30, "b moved on")
            time.sleep(1.5)
        counts = settled(b, traffic)
        check(traffic, counts)
        assert counts["lost"] > 0, counts  # 5 s of 500 msg/s, 3 s before b noticed
        assert b.link()["origin_counts"]["hosta"]["lost_link_down"] == counts["lost"]
        log = b.master.stderr_text()
        assert '"nats.loss"' in log and '"origin": "hosta"' in log
        wait_until(lambda: '"nats.loss.ended"' in b.master.stderr_text(), 10, "episode ends")
        print("paused receiver's member:", traffic.sent, "sent;", counts)


def test_the_receivers_member_killed_nothing_unseen(tmp_path: Path, cluster: Cluster) -> None:
    with two_hosts(tmp_path, cluster, (0,), (1, 2)) as (a, b):
        with flowing(a, b) as traffic:
            victim_of(b, cluster).stop(signal.SIGKILL)
            wait_until(lambda: b.link()["connected"], 30, "b elsewhere")
            time.sleep(1.5)
        counts = settled(b, traffic)
        check(traffic, counts)
        print("killed receiver's member:", traffic.sent, "sent;", counts)


def test_the_senders_member_paused_order_kept_late_ones_refused(
    tmp_path: Path, cluster: Cluster
) -> None:
    """A's member is paused: what A wrote into it waits there, A moves on and
    goes on sending; when the member resumes it lets the held messages go,
    after newer ones: refused (late), never delivered out of order."""
    with two_hosts(tmp_path, cluster, (0, 1), (2,)) as (a, b):
        with flowing(a, b) as traffic:
            victim = victim_of(a, cluster)
            reconnects = a.link()["reconnects"]
            victim.pause()
            try:
                wait_until(lambda: a.link()["reconnects"] > reconnects, 30, "a moved on")
                time.sleep(1)
            finally:
                victim.resume()
            time.sleep(2)
        counts = settled(b, traffic)
        check(traffic, counts)
        missing = traffic.sent - len(traffic.got)
        assert missing > 0, counts
        # the sender's own upper bound covers it
        assert a.link()["unconfirmed_total"] >= missing - counts["late"], a.link()
        print("paused sender's member:", traffic.sent, "sent;", counts)
