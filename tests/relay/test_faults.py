"""A relay under faults (docs/protocol.md): upstream killed and restarted, an upstream
that ignores the interest extension, no upstream at all, loops."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.relay.conftest import Hierarchy
from tests.relay.helpers import WAIT, identity, wait_until
from tests.support import VENV_BIN

pytestmark = pytest.mark.timeout(60)

CONNECTED = "sbus_upstream_connected"
QUEUED = "sbus_upstream_queued_messages"
OVERFLOW = 'sbus_messages_dropped_total{reason="upstream_queue_overflow"}'
STORED = "sbus_patterns_stored"
INTEREST = "sbus_upstream_interest_patterns"
#: protocol.md as promised: traffic flows again within this many seconds
#: of the master coming back (the back-off is capped by reconnect_max, 2 s).
RECOVERY = 5.0


def test_master_killed_and_restarted_relay_resubscribes_within_5s(tree: Hierarchy) -> None:
    master = tree.bus("m")
    relay = tree.bus("r", upstream=master)  # default back-off: 0.05 s doubling to 2 s
    receiver = tree.peer(relay)
    receiver.sub(b"k/")
    master.wait_metric(STORED, 1)
    first = tree.peer(master).pub(b"k/before")
    assert receiver.messages(1) == [first]

    master.kill()  # SIGKILL: the socket file stays behind
    relay.wait_metric(CONNECTED, 0)
    time.sleep(2.0)  # long enough for the relay's back-off to reach its cap
    # local delivery never stopped
    local = tree.peer(relay).pub(b"k/local")
    assert receiver.messages(1, drain=0) == [local]

    restarted = tree.bus("m", "-r")  # same address; -r removes the stale socket file
    started = time.monotonic()
    sender = tree.peer(restarted)
    got: list[bytes] = []
    # Publish until one arrives: proves resubscription and delivery down, end to end.
    while not got and time.monotonic() - started < RECOVERY:
        sender.pub(b"k/after")
        got = receiver.messages(1, drain=0, timeout=0.1)
    elapsed = time.monotonic() - started
    assert got, f"no delivery {RECOVERY}s after the master came back:\n{relay.log()[-2000:]}"
    assert restarted.metric(STORED) == 1, "the relay did not send its pattern set again"
    assert relay.metric("sbus_upstream_reconnects_total") == 1
    print(f"recovered in {elapsed:.2f}s")


def test_messages_published_during_an_outage_go_up_in_order_up_to_the_bound(
    tree: Hierarchy,
) -> None:
    bound, published = 50, 80
    master = tree.bus("m")
    relay = tree.bus("r", "--upstream-queue-messages", str(bound), upstream=master)
    relay.wait_metric(CONNECTED, 1)
    master.kill()
    relay.wait_metric(CONNECTED, 0)
    publisher = tree.peer(relay)
    for i in range(published):
        publisher.pub(b"q/%d" % i, b"outage")
    relay.wait_metric(QUEUED, bound)
    assert relay.metric(OVERFLOW) == published - bound

    # The new master must have its subscriber in place before the relay reconnects,
    # else the queue could drain before anyone wants it.  So it listens elsewhere
    # first and its socket file is then renamed onto the relay's upstream path:
    # rename(2) is atomic, and connect(2) finds the socket by the file's inode.
    staging = tree.path("m2")
    restarted = tree.bus("m2", "-r")
    receiver = tree.peer(restarted)
    receiver.sub(b"q/")
    os.unlink(master.address)  # the dead master's stale socket
    os.rename(staging, master.address)

    got = receiver.messages(bound)
    assert got == [b"MSG q/%d\0outage" % i for i in range(bound)], "not the first N, in order"
    relay.wait_metric(QUEUED, 0)
    assert relay.metric(OVERFLOW) == published - bound
    # and the link is live again for new traffic
    after = tree.peer(relay).pub(b"q/after")
    assert receiver.messages(1) == [after]


class FakeUpstream:
    """A minimal upstream like the reference ``sbusd``: answers whoami, ignores
    ``interest/on`` (so the relay never gets an interest snapshot) and records
    every MSG it receives."""

    IDENTITY = b"!/cred/7/8/9"

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(4)
        self.messages: list[bytes] = []
        self.controls: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return  # closed before anyone came
        with conn:
            while True:
                packet = conn.recv(409_601)
                if not packet:
                    return
                if packet.startswith(b"MSG "):
                    self.messages.append(packet)
                elif packet.startswith(b"CMSG "):
                    self.controls.append(packet)
                    if packet == b"CMSG !/cred/whoami":
                        conn.send(b"CMSG !/cred/whoami\0" + self.IDENTITY)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def fake_upstream(tree: Hierarchy) -> Iterator[FakeUpstream]:
    fake = FakeUpstream(tree.path("fake"))
    yield fake
    fake.close()


def test_an_upstream_that_ignores_interest_still_receives_everything(
    tree: Hierarchy, fake_upstream: FakeUpstream
) -> None:
    relay = tree.bus("r", upstream=tree.path("fake"))
    local, publisher = tree.peer(relay), tree.peer(relay)
    # the prefix is the fake's answer: proves the relay asks and uses it (docs/protocol.md)
    assert publisher.whoami() == FakeUpstream.IDENTITY + b"/" + identity(os.getpid())
    local.sub(b"a/")
    # wanted locally, wanted by nobody, and secret: without interest, all go up
    sent = [publisher.pub(b"%s/%d" % (key, i)) for i in range(30) for key in (b"a", b"b")]
    sent.append(publisher.pub(publisher.whoami() + b"/x"))
    wait_until(lambda: len(fake_upstream.messages) >= len(sent), "every publish at the upstream")
    time.sleep(0.3)
    assert fake_upstream.messages == sent
    assert b"CMSG interest/on" in fake_upstream.controls
    assert relay.metric('sbus_upstream_forwarded_messages_total{direction="up"}') == len(sent)


def test_a_relay_without_upstream_serves_its_local_clients(tree: Hierarchy) -> None:
    nowhere = tree.path("nowhere")
    relay = tree.bus("r", upstream=nowhere)
    # protocol.md: a whoami waits for the upstream; it must not hold up anyone else
    waiting = tree.peer(relay)
    waiting.send(b"CMSG !/cred/whoami")
    sub, pub = tree.peer(relay), tree.peer(relay)
    sub.send(b"SUB local/")
    wait_until(lambda: relay.metric(STORED) == 1, "the local subscription")
    sent = [pub.pub(b"local/%d" % i) for i in range(5)]
    assert sub.messages(5) == sent
    assert relay.metric(CONNECTED) == 0
    failed = [line for line in relay.log().splitlines() if "upstream.connect_failed" in line]
    assert failed and "warning" in failed[0], failed  # the first of the streak is news
    assert all("warning" not in line for line in failed[1:]), failed  # its retries are not
    # once an upstream appears, the waiting whoami is answered with the full chain
    master = tree.bus("nowhere")
    assert waiting.whoami() == identity(relay.pid, os.getpid())
    # the relay sends its patterns up once its own whoami is answered
    master.wait_metric(STORED, 1)


def serve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-f", *args],
        capture_output=True,
        text=True,
        timeout=2,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_serve_refuses_an_upstream_equal_to_its_own_address(tree: Hierarchy) -> None:
    address = tree.path("self")
    try:
        result = serve_cli("-a", address, "--upstream", address)
    except subprocess.TimeoutExpired:
        pytest.fail("serve started with itself as upstream")
    assert result.returncode == 2
    assert "upstream" in result.stderr and address in result.stderr


def test_a_relay_connected_to_itself_notices_and_keeps_serving(tree: Hierarchy) -> None:
    # A spelling of the same socket that cannot be checked at start (a symlink
    # made later): the runtime SO_PEERCRED check must catch it (docs/relays.md,
    # "The tree rule").
    address = tree.path("self")
    later = tree.path("later")
    relay = tree.bus("self", upstream=later)
    os.symlink(address, later)
    relay.wait_log("upstream is this very server")
    sub, pub = tree.peer(relay), tree.peer(relay)
    sub.send(b"SUB x/")  # not sub(): its whoami round trip would wait for an upstream
    relay.wait_metric(STORED, 1)
    sent = pub.pub(b"x/1")
    assert sub.messages(1) == [sent]
    assert relay.metric('sbus_upstream_forwarded_messages_total{direction="up"}') == 0
    assert address == relay.address


def test_two_relays_pointed_at_each_other_stall_instead_of_storming(tree: Hierarchy) -> None:
    a = tree.bus("a", upstream=tree.path("b"))  # b does not exist yet: a keeps retrying
    b = tree.bus("b", upstream=a)
    a.wait_metric(CONNECTED, 1, timeout=WAIT)
    b.wait_metric(CONNECTED, 1)
    sub, pub = tree.peer(a), tree.peer(a)
    sub.send(b"SUB loop/")  # no whoami round trip: nobody in a cycle learns its prefix
    a.wait_metric(STORED, 1)
    sent = [pub.pub(b"loop/%d" % i) for i in range(20)]
    assert sub.messages(20) == sent, "local delivery must go on"
    time.sleep(0.5)
    # Each relay's whoami to the other waits for a prefix that never comes, and
    # the link's later packets (interest/on, SUBs) queue behind it: a full stall.
    assert b.metric(STORED) == 0
    for relay in (a, b):
        # Neither ever gets a whoami answer, so no publish ever goes up a cycle.
        assert relay.metric('sbus_upstream_forwarded_messages_total{direction="up"}') == 0
        assert relay.metric('sbus_upstream_forwarded_messages_total{direction="down"}') == 0
        assert relay.process.proc.poll() is None
    assert sub.messages(0) == []
