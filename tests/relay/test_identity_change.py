"""A relay whose identity changes tells its own relays in place (docs/relays.md,
"When the upstream goes away"): the path between two buses below it never
stops, and nothing is owed after a live upgrade.

Relay a is upgraded live: the master still knows it by the pid that
connected.  When the master restarts, a reconnects from its new pid and its
identity changes.  Its relay c is told its new identity over the link it
already has (``CMSG identity/changed``), renames its clients' secret
patterns, and is never disconnected: a client of a publishing to a client of
c, a path that never touches the master, loses nothing.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from sbus_relay.ops.addresses import parse_address
from sbus_relay.ops.supervisor import listener_pid
from tests.relay.conftest import Hierarchy
from tests.relay.helpers import Peer, identity, wait_until
from tests.support import run_cli

pytestmark = pytest.mark.timeout(90)

RECONNECTS = "sbus_upstream_reconnects_total"


@pytest.fixture
def upgraded() -> Iterator[list[str]]:
    """Addresses whose buses were upgraded: their new processes are stopped after."""
    addresses: list[str] = []
    yield addresses
    for address in addresses:
        pid = listener_pid(parse_address(address))
        if pid:
            os.kill(pid, signal.SIGTERM)


def upgrade(address: str) -> int:
    """``sbus-relay upgrade -a ADDRESS``; the new process's pid."""
    before = listener_pid(parse_address(address))
    done = run_cli("upgrade", "-a", address, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    after = listener_pid(parse_address(address))
    assert after and after != before
    return after


class Stream:
    """Publishes ``path/<n>`` from one client as fast as a 1 ms pause allows,
    until stopped; ``sent`` says how many."""

    def __init__(self, peer: object) -> None:
        self.peer = peer
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peer.pub(b"path/%d" % self.sent)  # type: ignore[attr-defined]
            self.sent += 1
            time.sleep(0.001)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.sent


def test_a_restart_above_an_upgraded_relay_costs_the_buses_below_nothing(
    tree: Hierarchy, upgraded: list[str]
) -> None:
    master = tree.bus("m")
    a = tree.bus("a", "--reconnect-min", "0.01", "--reconnect-max", "0.1", upstream=master)
    c = tree.bus("c", upstream=a)
    c.wait_log("upstream.interest_ready")
    receiver = tree.peer(c)
    me = receiver.whoami()
    assert me == identity(a.pid, c.pid, os.getpid())
    receiver.sub(b"path/")
    receiver.sub(me + b"/inbox")
    sender = tree.peer(a)

    upgraded.append(a.address)
    new_a = upgrade(a.address)
    stream = Stream(sender)
    time.sleep(0.3)
    master.kill()
    restarted = tree.bus("m", "-r")
    wait_until(lambda: a.events("relay.identity_changed"), "a's new identity", 15)
    time.sleep(0.3)
    sent = stream.stop()

    got = receiver.messages(sent, timeout=15)
    numbers = [int(p.split(b"\0")[0].rsplit(b"/", 1)[1]) for p in got]
    missing = sorted(set(range(sent)) - set(numbers))
    assert numbers == list(range(sent)), (
        f"{sent} sent, {len(got)} arrived, missing {missing[:20]}...\n{c.log()[-3000:]}"
    )
    # c was told in place: never cut off, never reconnected
    assert not c.events("upstream.lost"), c.log()[-3000:]
    assert c.metric(RECONNECTS) == 0
    assert "upstream_identity_changed" not in a.log()
    # and its client's identity, and secret patterns, follow
    new_me = receiver.whoami()
    assert new_me == identity(new_a, c.pid, os.getpid())
    key = new_me + b"/inbox"
    wait_until(lambda: c.events("relay.identity_changed"), "c's new identity")
    sender_m = tree.peer(restarted)
    packet = b""
    for _ in range(20):  # until the renamed pattern has reached the master
        packet = sender_m.pub(key, b"secret")
        if receiver.messages(1, drain=0, timeout=0.25) == [packet]:
            break
    else:
        raise AssertionError(f"no secret message at {key!r}\n{c.log()[-2000:]}")
    assert "secret_refused" not in restarted.log()
    assert "pattern_refused" not in restarted.log()
    assert "unknown_unsubscribe" not in restarted.log() + a.log()


def test_an_older_relay_is_disconnected_and_a_follower_told_its_new_identity(
    tree: Hierarchy, upgraded: list[str]
) -> None:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    a.wait_log("upstream.ready")
    old = tree.peer(a)  # a relay of an older version: no identity/follow
    old.send(b"CMSG interest/on")
    follower = tree.peer(a)
    follower.send(b"CMSG interest/on")
    follower.send(b"CMSG identity/follow")
    for peer in (old, follower):
        assert peer.whoami() == identity(a.pid, os.getpid())

    upgraded.append(a.address)
    new_a = upgrade(a.address)
    master.kill()
    tree.bus("m", "-r")
    assert packets_until(follower, b"CMSG identity/changed\0") == identity(new_a, os.getpid())
    assert follower.whoami() == identity(new_a, os.getpid())
    assert packets_until(old, b"CMSG disconnect\0") == b"upstream_identity_changed"
    assert old.is_closed()


def packets_until(peer: Peer, head: bytes) -> bytes:
    """Read until a packet starting with ``head`` arrives; the rest of it."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        packet = peer.recv(max(0.01, deadline - time.monotonic()))
        if packet.startswith(head):
            return packet[len(head) :]
    raise AssertionError(f"no {head!r} within 15 s")
