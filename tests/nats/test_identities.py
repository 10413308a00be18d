"""Identities crossing hosts (``nats: {identities: true}``): three hosts, each a
master with a relay, whose clients' identities are headed by their host's own
``!/cred/<host>/`` group.  A whoami-addressed message crosses once, to its owner
only; no host can hold a pattern below another host's identities.  (With the
setting off nothing crosses: tests/nats/test_fleet.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sbus_relay.client import Client
from sbus_relay.protocol import natsinterest as ni
from tests.nats.cluster import (
    Cluster,
    Host,
    NatsServer,
    drain,
    free_port,
    three_hosts,
    wait_until,
)
from tests.support import run_cli

pytestmark = pytest.mark.timeout(120)

DISCONNECT = b"CMSG disconnect\0"


@pytest.fixture(scope="module")
def hosts(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Host]]:
    tmp = tmp_path_factory.mktemp("hosts")
    config = tmp / "identities.yaml"
    # the servers named here give way to each host's --nats
    config.write_text("nats:\n  servers: [127.0.0.1:1]\n  identities: true\n")
    with three_hosts(cluster, tmp, "-C", str(config)) as made:
        yield made


def test_whoami_is_headed_by_the_host_on_the_master_and_through_relays(
    hosts: list[Host],
) -> None:
    a = hosts[0]
    assert a.relay is not None
    with Client(a.master.address, timeout=5) as m, Client(a.relay.address, timeout=5) as r:
        on_master, on_relay = m.whoami(), r.whoami()
    hosta = ni.host_identity("hosta").decode()
    assert on_master.startswith(hosta + "!/cred/") and on_master.count("!/cred/") == 2
    assert on_relay.startswith(hosta + "!/cred/") and on_relay.count("!/cred/") == 3


def test_a_whoami_addressed_message_crosses_once_to_its_owner(hosts: list[Host]) -> None:
    a, b, c = hosts
    assert a.relay is not None and b.relay is not None and c.relay is not None
    with (
        Client(b.relay.address, timeout=5) as owner,
        Client(b.master.address, timeout=5) as everything_b,
        Client(c.relay.address, timeout=5) as everything_c,
        Client(a.relay.address, timeout=5) as pub,
    ):
        me = owner.whoami().encode()
        assert me.startswith(ni.host_identity("hostb"))
        owner.subscribe(me + b"/inbox/")
        owner.subscribe(me + b"/")  # overlapping: still one copy
        everything_b.subscribe(b"")
        everything_c.subscribe(b"")
        probe = me + b"/inbox/probe"
        for _ in range(100):  # until hosta knows what hostb holds
            pub.publish(probe, b"probe")
            try:
                if bytes(owner.receive(timeout=0.2).key) == probe:
                    break
            except TimeoutError:
                continue
        else:
            raise AssertionError("the identity's message never crossed")
        drain(owner, 0.3)
        sent = a.count("sent")
        for i in range(50):
            pub.publish(me + b"/inbox/x", b"%d" % i)
        pub.publish(b"public/marker", b"m")
        got = drain(owner)
        assert got == [(me + b"/inbox/x", b"%d" % i) for i in range(50)]
        assert a.count("sent") - sent == 51  # once each, whatever matched on hostb
        for cl in (everything_b, everything_c):
            seen = drain(cl)
            assert (b"public/marker", b"m") in seen
            assert not [k for k, _ in seen if k.startswith(b"!/")]
    assert c.count("secret") == 0  # nothing of it was sent to hostc


def refused(address: str, pattern: bytes) -> bytes:
    """Subscribe to ``pattern`` on a raw connection; the server's disconnect notice."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(5)
        s.connect(address)
        s.send(b"SUB " + pattern)
        notice = s.recv(65536)
        assert s.recv(65536) == b"", "the server kept a refused client"
        return notice


def test_no_host_holds_a_pattern_below_another_hosts_identities(
    hosts: list[Host], cluster: Cluster
) -> None:
    a, b, c = hosts
    with Client(b.master.address, timeout=5) as owner:
        me = owner.whoami().encode()
    # a client of hostc asking for hostb's identities: refused by its own bus
    notice = refused(c.master.address, me + b"/")
    assert notice.startswith(DISCONNECT + b"secret_refused"), notice

    # a NATS client posing as a host announces a pattern below hostb's
    # identities and one below its own: hosta takes only the second
    before = _steady(lambda: int(a.link()["remote_patterns"]))
    own = ni.host_identity("intruder") + b"x/"
    intruder = ni.Announcement("S", time.time_ns(), 0, 0, True, [(True, me + b"/"), (True, own)])

    async def announce() -> None:
        import nats

        nc = await nats.connect(cluster.servers[0].url)
        await nc.publish("sbus._i.intruder", ni.encode(intruder))
        await nc.flush()
        await nc.close()

    # announced again until heard: a host silent for long is forgotten, and a
    # loaded machine may take that long between an announcement and a look
    deadline = time.monotonic() + 30
    while True:
        asyncio.run(announce())
        try:
            wait_until(lambda: a.link()["remote_patterns"] == before + 1, 3, "the intruder heard")
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    with Client(a.master.address, timeout=5) as pub:
        sent = a.count("sent")
        pub.publish(me + b"/stolen", b"never")  # nobody on hostb holds it: stays
        pub.publish(ni.host_identity("intruder") + b"x/y", b"to the intruder's own")
        wait_until(lambda: a.link()["sent"] - sent >= 1, 5, "the second sent")
        time.sleep(0.3)
        assert a.count("sent") - sent == 1


def test_a_live_upgrade_that_turns_identities_on_renames_what_clients_hold(
    tmp_path: Path,
) -> None:
    """The new process takes its own prefix: a client connected across the
    upgrade keeps its secret pattern (renamed below the host's group), learns
    its new identity by asking whoami again, and is reached from another host."""
    server = NatsServer(tmp_path, "solo", free_port(), free_port(), [])
    config = tmp_path / "a.yaml"
    config.write_text("nats:\n  servers: [127.0.0.1:1]\n")
    crossing = tmp_path / "b.yaml"
    crossing.write_text("nats:\n  servers: [127.0.0.1:1]\n  identities: true\n")
    a = Host(tmp_path, "hosta", server.url, "-C", str(config), relay=False)
    b = Host(tmp_path, "hostb", server.url, "-C", str(crossing), relay=False)
    new_pid = 0
    try:
        wait_until(lambda: a.link()["settled"] and b.link()["settled"], 20, "both settled")
        with Client(a.master.address, timeout=10) as owner:
            short = owner.whoami().encode()
            assert short.count(b"!/cred/") == 1
            owner.subscribe(short + b"/inbox/")
            config.write_text("nats:\n  servers: [127.0.0.1:1]\n  identities: true\n")
            done = run_cli("upgrade", "-a", a.master.address, timeout=60)
            assert done.returncode == 0, done.stderr.decode()
            new_pid = int(done.stdout.decode().strip().rsplit(" ", 1)[1])
            me = owner.whoami().encode()
            assert me == ni.host_identity("hosta") + short
            with Client(b.master.address, timeout=10) as pub:
                for _ in range(100):  # until hostb knows what hosta holds now
                    pub.publish(me + b"/inbox/x", b"from b")
                    try:
                        if bytes(owner.receive(timeout=0.2).key) == me + b"/inbox/x":
                            break
                    except TimeoutError:
                        continue
                else:
                    raise AssertionError("the renamed pattern never got a message from hostb")
    finally:
        if new_pid:
            os.kill(new_pid, signal.SIGTERM)
            wait_until(lambda: not os.path.exists(f"/proc/{new_pid}"), 10, "new process gone")
        a.stop()
        b.stop()
        server.stop()


def _steady(read: Callable[[], int], settle: float = 1.0, timeout: float = 20.0) -> int:
    """What ``read`` gives once it has not changed for ``settle`` seconds (the
    other hosts' departures from earlier tests announced and heard)."""
    deadline = time.monotonic() + timeout
    last = read()
    since = time.monotonic()
    while time.monotonic() - since < settle:
        assert time.monotonic() < deadline, f"not steady within {timeout}s"
        time.sleep(0.1)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
    return last
