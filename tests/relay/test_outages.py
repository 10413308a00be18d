"""A hierarchy under faults: a hung master, churn, restarts at every level, an
upstream that hangs up mid-handshake, huge pattern sets, relays carrying many
clients (docs/relays.md, "Outages"; docs/reliability.md).

Every test runs real bus processes and reproduces the fault.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.relay.conftest import Hierarchy
from tests.relay.helpers import WAIT, Bus, identity, wait_until
from tests.support import rss

pytestmark = pytest.mark.timeout(90)

CONNECTED = "sbus_upstream_connected"
STORED = "sbus_patterns_stored"
OVERFLOW = 'sbus_messages_dropped_total{reason="upstream_queue_overflow"}'
RECONNECTS = "sbus_upstream_reconnects_total"


@pytest.fixture
def stopped() -> Iterator[list[Bus]]:
    """Buses SIGSTOPped by a test: always continued afterwards, so they can be stopped."""
    buses: list[Bus] = []
    yield buses
    for bus in buses:
        if bus.process.proc.poll() is None:
            os.kill(bus.pid, signal.SIGCONT)


def hang(bus: Bus, stopped: list[Bus]) -> None:
    os.kill(bus.pid, signal.SIGSTOP)
    stopped.append(bus)


def test_a_hung_master_never_slows_the_relays_local_traffic(
    tree: Hierarchy, stopped: list[Bus]
) -> None:
    master = tree.bus("m")
    relay = tree.bus("r", "--upstream-queue-messages", "1000", upstream=master)
    outside = tree.peer(master)
    outside.sub(b"k/")  # the master wants k/: the relay must forward every k/ publish
    local = tree.peer(relay)
    local.sub(b"k/")
    wait_until(lambda: relay.metric("sbus_upstream_interest_patterns") >= 1, "interest")
    hang(master, stopped)
    publisher = tree.peer(relay)
    publisher.sock.settimeout(5)  # a send that blocks this long: the relay stopped reading
    count = 20_000
    started = time.monotonic()
    for i in range(count):
        publisher.pub(b"k/%d" % i, b"x" * 64)
    got = local.messages(count, drain=0, timeout=30)
    elapsed = time.monotonic() - started
    assert len(got) == count, f"local subscriber got {len(got)} of {count}"
    assert elapsed < 20, f"local delivery took {elapsed:.1f}s with the master hung"
    wait_until(lambda: relay.metric(OVERFLOW) > 0, "the upward drops counted")
    # the drop episode is logged as it begins, once, naming the upward queue
    began = relay.events("flood.drop")
    assert [e["reason"] for e in began] == ["upstream_queue_overflow"]
    assert began[0]["upstream"] == master.address


def test_subscription_churn_while_the_master_hangs_stays_bounded(
    tree: Hierarchy, stopped: list[Bus]
) -> None:
    master = tree.bus("m")
    relay = tree.bus("r", upstream=master)
    relay.wait_metric(CONNECTED, 1)
    wait_until(lambda: "upstream.ready" in relay.log(), "the relay's handshake")
    hang(master, stopped)
    churner = tree.peer(relay)
    before = rss(relay.pid)
    for round_ in range(20):
        for i in range(2_000):
            churner.send(b"SUB churn/%d" % i)
        for i in range(2_000):
            churner.send(b"UNSUB churn/%d" % i)
        if round_ == 0:
            churner.sync()
            first = rss(relay.pid)
    churner.sync()
    grown = rss(relay.pid) - before
    # 80,000 SUB/UNSUB packets for 2,000 patterns: the net change is nothing, and
    # what waits for the master is bounded by the distinct patterns, not the packets.
    assert grown < 8 * 1024 * 1024, f"relay grew {grown / 2**20:.1f} MiB"
    assert rss(relay.pid) - first < 4 * 1024 * 1024


def secret_round_trip(tree: Hierarchy, master: Bus, leaf_client: object, me: bytes) -> bool:
    """Publish on the master to the leaf client's secret key; True if it arrives."""
    key = me + b"/inbox"
    sender = tree.peer(master)
    for _ in range(20):
        packet = sender.pub(key, b"hello")
        if leaf_client.messages(1, drain=0, timeout=0.25) == [packet]:  # type: ignore[attr-defined]
            return True
    return False


def test_a_restarted_middle_relay_does_not_cut_its_leaves_off(tree: Hierarchy) -> None:
    master = tree.bus("m")
    middle = tree.bus("mid", upstream=master)
    leaf = tree.bus("leaf", upstream=middle)
    client = tree.peer(leaf)
    me = client.whoami()
    assert me == identity(middle.pid, leaf.pid, os.getpid())
    client.sub(me + b"/inbox")  # a secret subscription, carrying the chain
    assert secret_round_trip(tree, master, client, me)

    middle.kill()
    new_middle = tree.bus("mid", "-r", upstream=master)
    # The leaf reconnects, learns its new identity, and renames its client's
    # secret patterns: the client asks again and is reachable at its new key.
    new_me = wait_until(
        lambda: (w := client.whoami()) != me and w, "the leaf client's new identity", 15
    )
    assert new_me == identity(new_middle.pid, leaf.pid, os.getpid())
    assert secret_round_trip(tree, master, client, new_me)
    time.sleep(1.0)
    assert leaf.metric(RECONNECTS) == 1, "the leaf kept being cut off"
    assert "secret_refused" not in new_middle.log()


class HangUpAfterWhoami:
    """An upstream that answers whoami and hangs up at once, ``times`` times."""

    def __init__(self, path: str, times: int) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(4)
        self.path = path
        self.times = times
        self.served = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.served < self.times:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                while True:
                    packet = conn.recv(409_601)
                    if not packet or packet == b"CMSG !/cred/whoami":
                        break
                conn.send(b"CMSG !/cred/whoami\0!/cred/1/2/3")
            self.served += 1
        self.listener.close()
        os.unlink(self.path)


def test_an_upstream_that_hangs_up_right_after_whoami_does_not_wedge_the_relay(
    tree: Hierarchy,
) -> None:
    path = tree.path("up")
    fake = HangUpAfterWhoami(path, times=3)
    relay = tree.bus("r", "--reconnect-max", "0.2", upstream=path)
    wait_until(lambda: fake.served == 3, "three hung-up handshakes")
    wait_until(lambda: not os.path.exists(path), "the fake upstream gone")
    master = tree.bus("up")  # a real upstream at the same address
    receiver = tree.peer(master)
    receiver.sub(b"up/")
    wait_until(lambda: relay.metric("sbus_upstream_interest_patterns") >= 1, "interest")
    sent = tree.peer(relay).pub(b"up/after")
    assert receiver.messages(1) == [sent], relay.log()[-3000:]


def test_a_relay_joining_a_master_with_80000_patterns_stays_connected(tree: Hierarchy) -> None:
    master = tree.bus("m", "--max-patterns-per-client", "100000")
    holder = tree.peer(master)
    holder.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    for i in range(80_000):
        holder.send(b"SUB many/%d" % i)
    holder.sync()
    relay = tree.bus("r", upstream=master)
    relay.wait_log("upstream.interest_ready", timeout=60)
    wait_until(
        lambda: relay.metric("sbus_upstream_interest_patterns") == 80_000, "the snapshot", 30
    )
    # Heavy churn on the master meanwhile: coalesced, never a reason to drop the relay.
    for _ in range(5):
        for i in range(5_000):
            holder.send(b"UNSUB many/%d" % i)
        for i in range(5_000):
            holder.send(b"SUB many/%d" % i)
    holder.sync()
    time.sleep(0.5)
    assert relay.metric(RECONNECTS) == 0
    assert master.metric('sbus_disconnects_total{reason="slow_client"}') == 0
    wait_until(
        lambda: relay.metric("sbus_upstream_interest_patterns") == 80_000, "the net state", 30
    )


def test_a_relay_is_never_cut_off_for_what_its_clients_hold(tree: Hierarchy) -> None:
    # Both buses limit an ordinary client to 10 patterns; the relay carries 3 x 8.
    master = tree.bus("m", "--max-patterns-per-client", "10", "--max-patterns-per-relay", "20")
    relay = tree.bus("r", "--max-patterns-per-client", "10", upstream=master)
    clients = [tree.peer(relay) for _ in range(3)]
    for n, client in enumerate(clients):
        for i in range(8):
            client.sub(b"c%d/%d" % (n, i))
    # 24 > 20: the master refuses the last patterns but keeps the relay.
    wait_until(lambda: master.metric('sbus_refusals_total{reason="too_many_patterns"}') > 0, "")
    assert master.metric(STORED) == 20
    # One client over the relay's own limit is cut off there, not the relay upstream.
    greedy = tree.peer(relay)
    for i in range(10):
        greedy.sub(b"g/%d" % i)
    greedy.send(b"SUB g/over")
    assert greedy.is_closed()
    time.sleep(0.5)
    assert relay.metric(CONNECTED) == 1
    assert relay.metric(RECONNECTS) == 0
    assert master.metric('sbus_disconnects_total{reason="too_many_patterns"}') == 0
    for client in clients:
        client.sync()  # still served


def test_relays_in_a_cycle_warn_naming_the_upstream(tree: Hierarchy) -> None:
    a = tree.bus("a", upstream=tree.path("b"))
    b = tree.bus("b", upstream=a)
    for relay, upstream in ((a, b), (b, a)):
        relay.wait_log("upstream.no_whoami", timeout=WAIT + 5)
        assert upstream.address in relay.log()
        assert "relay cycle" in relay.log()


def test_a_relay_whose_upstream_path_comes_to_lead_to_its_own_relay_refuses_it(
    tree: Hierarchy,
) -> None:
    # a cycle that resolves: the child already knows its identity, so it
    # answers the relay at once with a chain that begins with the relay's own
    link = tree.path("up")
    master = tree.bus("m")
    os.symlink(master.address, link)
    relay = tree.bus("r", upstream=link)
    relay.wait_log("upstream.ready")
    child = tree.bus("c", upstream=relay)
    child.wait_log("upstream.ready")
    master.kill()
    os.unlink(link)
    os.symlink(child.address, link)
    relay.wait_log("relay cycle detected", timeout=WAIT + 5)
    assert relay.log().count('"upstream.ready"') == 1  # it never took that chain
    assert "relay.identity_changed" not in relay.log()


def test_a_relay_refuses_its_own_socket_through_a_symlink(tree: Hierarchy) -> None:
    address = tree.path("self")
    link = tree.path("link")
    os.symlink(address, link)
    from tests.relay.test_faults import serve_cli

    result = serve_cli("-a", address, "--upstream", link)
    assert result.returncode == 2
    assert "upstream" in result.stderr and "own address" in result.stderr
