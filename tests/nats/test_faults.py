"""The link through NATS faults: a server unreachable at start, killed and
restarted, paused; a cluster member failing.  The local bus serves on
throughout, and what crosses after is counted."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbus_relay.client import Client
from tests.nats.cluster import Cluster, Host, NatsServer, wait_until
from tests.support import free_port

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.stop()


def drain(client: Client, quiet: float = 0.7) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(bytes(client.receive(timeout=quiet).payload))
        except TimeoutError:
            return got


def joined(*hosts: Host) -> None:
    wait_until(
        lambda: all(h.link()["connected"] and h.link()["remote_hosts"] == len(hosts) - 1
                    for h in hosts),
        30,
        "hosts joined",
    )  # fmt: skip


def test_unreachable_at_start_then_a_member_fails(tmp_path: Path, cluster: Cluster) -> None:
    """A host whose servers are not up yet serves locally and joins once they
    are; when its server dies it moves to another member and carries on."""
    late_port = free_port()
    a = Host(tmp_path, "hosta", f"nats://127.0.0.1:{late_port},{cluster.urls(0)}")
    b = Host(tmp_path, "hostb", cluster.urls(1, 2))
    try:
        joined(a, b)
        with Client(b.master.address, timeout=5) as sub:
            sub.subscribe(b"f/")
            wait_until(lambda: a.link()["remote_patterns"] >= 1, 15, "b's interest at a")
            with (
                Client(a.master.address, timeout=5) as local,
                Client(a.relay.address, timeout=5) as pub,
            ):
                local.subscribe(b"f/")
                time.sleep(0.2)
                for i in range(100):
                    pub.publish(b"f/x", b"%d" % i)
                assert drain(sub) == [b"%d" % i for i in range(100)]
                assert len(drain(local)) == 100
                # the member a is connected to fails: a moves on
                server = a.link()["server"]
                victim = next(s for s in cluster.servers if server.endswith(":%d" % s.port))
                victim.stop()
                # the local bus serves on meanwhile
                pub.publish(b"f/during", b"local")
                assert drain(local, 0.5) == [b"local"]
                wait_until(lambda: a.link()["connected"], 20, "a reconnected elsewhere")
                assert a.link()["reconnects"] >= 1
                wait_until(lambda: a.link()["remote_patterns"] >= 1, 15, "interest again")
                drain(sub, 0.3)
                for i in range(100):
                    pub.publish(b"f/y", b"%d" % i)
                assert drain(sub) == [b"%d" % i for i in range(100)]
    finally:
        a.stop()
        b.stop()


def test_killed_restarted_and_paused_server(tmp_path: Path) -> None:
    """One server: killed, the publishes wait in the link's bounded queue, in
    order, and cross once it is back; paused (SIGSTOP), the link notices by
    its pings and reconnects when it resumes; losses are counted, never silent."""
    port = free_port()
    server = NatsServer(tmp_path, "solo", port, free_port(), [])
    a = Host(tmp_path, "hosta", server.url)
    b = Host(tmp_path, "hostb", server.url)
    try:
        joined(a, b)
        with Client(b.master.address, timeout=5) as sub, Client(a.relay.address, timeout=5) as pub:
            sub.subscribe(b"k/")
            wait_until(lambda: a.link()["remote_patterns"] >= 1, 15, "b's interest at a")
            server.stop()
            wait_until(lambda: not a.link()["connected"], 10, "a noticed the loss")
            assert "nats: down" in a.healthz()
            for i in range(500):
                pub.publish(b"k/held", b"%d" % i)
            # (held in the socket between bus and bridge, then in the link's queue)
            server.start()
            wait_until(lambda: a.link()["connected"] and b.link()["connected"], 20, "back")
            got = drain(sub, 1.5)
            link = a.link()
            lost = sum(link["drops"].values())
            # in order, and whatever did not arrive is counted
            assert got == sorted(got, key=int)
            assert len(got) == 500, (len(got), lost, link["drops"])
            # paused: pings go unanswered, the link says so; resumed, it is back
            server.pause()
            wait_until(lambda: not a.link()["connected"], 15, "a noticed the pause")
            server.resume()
            wait_until(lambda: a.link()["connected"] and b.link()["connected"], 20, "resumed")
            wait_until(lambda: a.link()["remote_patterns"] >= 1, 15, "interest again")
            for i in range(50):
                pub.publish(b"k/after", b"%d" % i)
            assert drain(sub, 1.5)[-50:] == [b"%d" % i for i in range(50)]
    finally:
        a.stop()
        b.stop()
        server.stop()


def test_what_overflows_the_queue_is_counted_and_said(tmp_path: Path) -> None:
    """NATS away longer than the link's queue lasts: what overflows is dropped,
    counted and logged as the link's drop episode; the rest crosses in order
    once NATS is back, and together they are every message published."""
    import yaml

    server = NatsServer(tmp_path, "solo", free_port(), free_port(), [])
    config = tmp_path / "small-queue.yaml"
    config.write_text(yaml.safe_dump({"nats": {"servers": [server.url], "queue_messages": 10}}))
    a = Host(tmp_path, "hosta", server.url, "-C", str(config), relay=False)
    b = Host(tmp_path, "hostb", server.url, relay=False)
    try:
        joined(a, b)
        with Client(b.master.address, timeout=5) as sub, Client(a.master.address, timeout=5) as pub:
            sub.subscribe(b"q/")
            wait_until(lambda: a.link()["remote_patterns"] >= 1, 15, "b's interest at a")
            server.stop()
            wait_until(lambda: not a.link()["connected"], 10, "a noticed the loss")
            n = 3000  # 3 MB: past the socket pair's buffers and the queue of 10
            for i in range(n):
                pub.publish(b"q/x", b"%d " % i + b"x" * 1000)
            wait_until(lambda: a.link()["drops"]["queue_overflow"] > 0, 10, "overflow counted")
            server.start()
            wait_until(lambda: a.link()["connected"] and b.link()["connected"], 20, "back")
            got = [int(bytes(p).split(b" ")[0]) for p in drain(sub, 2.0)]
        dropped = a.link()["drops"]["queue_overflow"]
        assert got == sorted(got) and got  # in order
        assert len(got) + dropped == n, (len(got), dropped)
        assert '"flood.drop"' in a.master.stderr_text()
    finally:
        a.stop()
        b.stop()
        server.stop()


def test_what_a_paused_server_swallows_is_counted(tmp_path: Path) -> None:
    """Host A publishes steadily to host B while A's server is paused until A
    notices (then resumed): what did not reach B is covered by A's count of
    what its server never confirmed (an upper bound), and by its other drops."""
    cluster = Cluster(tmp_path, n=2)
    a = b = None
    try:
        a = Host(tmp_path, "hosta", cluster.urls(0, 1), relay=False)
        wait_until(lambda: a.link()["connected"], 30, "a joined")
        ours = 0 if a.link()["server"].endswith(":%d" % cluster.servers[0].port) else 1
        victim = cluster.servers[ours]
        b = Host(tmp_path, "hostb", cluster.urls(1 - ours), relay=False)
        joined(a, b)
        got: set[int] = set()
        done = threading.Event()

        def read(sub: Client) -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    got.add(int(bytes(sub.receive(timeout=0.2).payload)))

        with Client(b.master.address, timeout=5) as sub:
            sub.subscribe(b"u/")
            wait_until(lambda: a.link()["remote_patterns"] >= 1, 15, "b's interest at a")
            reading = threading.Thread(target=read, args=(sub,))
            reading.start()
            sent = 0
            try:
                with Client(a.master.address, timeout=5) as pub:

                    def publish(n: int) -> None:
                        nonlocal sent
                        for _ in range(n):
                            pub.publish(b"u/x", b"%d" % sent)
                            sent += 1
                            time.sleep(0.002)

                    publish(200)
                    # (the link reports every STATS_SECONDS: ``sent`` says the report is new)
                    wait_until(
                        lambda: a.link()["sent"] >= sent and a.link()["unconfirmed"] == 0,
                        30,
                        "a's sends confirmed",
                    )
                    reconnects = a.link()["reconnects"]
                    victim.pause()
                    try:
                        # a notices (its pings go unanswered) and moves to the other server
                        deadline = time.monotonic() + 30
                        while time.monotonic() < deadline:
                            link = a.link()
                            if not link["connected"] or link["reconnects"] > reconnects:
                                break
                            publish(20)
                        else:
                            raise AssertionError("a never noticed the pause")
                    finally:
                        victim.resume()
                    wait_until(lambda: a.link()["connected"], 20, "a back on a server")
                    publish(200)

                def covered() -> bool:
                    link = a.link()
                    return sent - len(got) <= link["unconfirmed_total"] + sum(
                        link["drops"].values()
                    )

                # B's count only grows; A's drops are settled once it is back
                wait_until(covered, 30, "every message received or counted")
                # and B itself counts what never reached it, exactly (what
                # came after its count, held by the paused server, is late)
                wait_until(lambda: len(got) + b.link()["lost"] >= sent, 30, "b counted its losses")
            finally:
                done.set()
                reading.join(10)
        link = a.link()
        unconfirmed = link["unconfirmed_total"]
        assert sent - len(got) <= unconfirmed + sum(link["drops"].values()), (sent, len(got), link)
        assert unconfirmed > 0, link  # traffic flowed while it was paused
        # what was confirmed before the pause, or sent after it, is not counted
        assert unconfirmed <= sent - 400, (sent, unconfirmed)
        assert '"nats.unconfirmed"' in a.master.stderr_text()
        # (the link reports its counts every 0.5 s)
        wait_until(lambda: b.link()["origins"]["hosta"]["delivered"] >= len(got), 10, "b's report")
        at_b = b.link()["origins"]["hosta"]
        assert len(got) == at_b["delivered"]
        assert len(got) + at_b["lost"] <= sent <= len(got) + at_b["lost"] + at_b["late"], at_b
    finally:
        for h in (a, b):
            if h is not None:
                h.stop()
        cluster.stop()
