"""Ordering, bursts and flood control (docs/protocol.md) against a real server process.

A stalled client's messages sit in two places: the kernel (what the server's
socket already took -- always the oldest, in send order) and the server's own
queue for that client.  Only the latter obeys the client's modes, so the tests
measure the kernel part with FIONREAD and assert over what comes after it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.server.rawclient import (
    Closed,
    RawClient,
    client_factory,
    module_bus,
)

HARD_LIMIT_MESSAGES = 100
HARD_LIMIT_BYTES = 1_000_000


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from module_bus(tmp_path_factory)


@pytest.fixture
def connect(bus: Any) -> Iterator[Callable[[], RawClient]]:
    yield from client_factory(bus)


@pytest.fixture(scope="module")
def small_bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from module_bus(
        tmp_path_factory,
        "--hard-limit-messages",
        str(HARD_LIMIT_MESSAGES),
        "--hard-limit-bytes",
        str(HARD_LIMIT_BYTES),
        command="serve",
    )


@pytest.fixture
def small(small_bus: Any) -> Iterator[Callable[[], RawClient]]:
    yield from client_factory(small_bus)


def numbered(key: bytes, n: int, size: int = 0) -> list[bytes]:
    """``n`` packets ``MSG key\\0<seq>|xxx...`` with payloads padded to ``size``."""
    return [b"MSG " + key + b"\0" + (b"%08d|" % i).ljust(size, b"x") for i in range(n)]


def seq(packet: bytes) -> int:
    return int(packet.split(b"\0", 1)[1][:8])


class Reader(threading.Thread):
    """Reads ``n`` packets from a client in the background."""

    def __init__(self, client: RawClient, n: int, timeout: float = 20.0) -> None:
        super().__init__(daemon=True)
        self.client, self.n, self.timeout = client, n, timeout
        self.got: list[bytes] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while len(self.got) < self.n:
                self.got.append(self.client.recv_packet(self.timeout))
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float = 60.0) -> list[bytes]:
        self.join(timeout)
        assert not self.is_alive(), f"reader still waiting after {len(self.got)}/{self.n}"
        if self.error is not None:
            raise AssertionError(f"reader failed after {len(self.got)}/{self.n}") from self.error
        return self.got


def send_all(client: RawClient, packets: list[bytes]) -> None:
    for packet in packets:
        client.send(packet)


# --- the default mode: reliable and ordered -------------------------------------


@pytest.mark.timeout(60)
def test_20000_messages_arrive_complete_and_in_order(connect: Callable[[], RawClient]) -> None:
    sub, pub = connect(), connect()
    sub.sub(b"ord/")
    packets = numbered(b"ord/k", 20_000)
    reader = Reader(sub, len(packets))
    reader.start()
    send_all(pub, packets)
    assert reader.result() == packets


@pytest.mark.timeout(60)
def test_burst_is_queued_for_a_late_reader(connect: Callable[[], RawClient]) -> None:
    # The default soft mode is "queue": nothing is lost while the subscriber is busy.
    sub, pub = connect(), connect()
    sub.shrink_rcvbuf()
    sub.sub(b"burst/")
    packets = numbered(b"burst/k", 5_000, size=64)
    send_all(pub, packets)
    pub.sync()  # the server has routed the whole burst
    got = [sub.recv_packet() for _ in packets]
    assert [seq(p) for p in got] == list(range(len(packets)))
    assert got == packets
    sub.expect_nothing(0.2)


@pytest.mark.timeout(60)
def test_never_reading_subscriber_does_not_stop_others(connect: Callable[[], RawClient]) -> None:
    stalled, sub, pub = connect(), connect(), connect()
    stalled.shrink_rcvbuf()
    stalled.sub(b"")  # everything, and it never calls recv again
    sub.sub(b"nr/")
    packets = numbered(b"nr/k", 20_000)
    reader = Reader(sub, len(packets))
    reader.start()
    send_all(pub, packets)
    assert reader.result() == packets


# --- flood modes with a small hard limit ----------------------------------------


def stalled_client(make: Callable[[], RawClient], pattern: bytes, *modes: bytes) -> RawClient:
    client = make()
    client.shrink_rcvbuf()
    for mode in modes:
        client.cmsg(mode)
    client.sub(pattern)  # syncs: the modes and the SUB took effect
    return client


def publish_lockstep(
    pub: RawClient, watcher: RawClient, packets: list[bytes], window: int = 16
) -> list[bytes]:
    """Publish, keeping ``watcher`` (a live subscriber) at most ``window`` behind.

    Returns what the watcher got.  Once it has the last packet, the server has
    routed every packet to every subscriber.
    """
    got: list[bytes] = []
    for i, packet in enumerate(packets):
        pub.send(packet)
        if i >= window:
            got.append(watcher.recv_packet())
    while len(got) < len(packets):
        got.append(watcher.recv_packet())
    return got


def settled_inq(client: RawClient, quiet: float = 0.15, timeout: float = 5.0) -> int:
    """The stalled client's kernel backlog once it stops changing."""
    deadline = time.monotonic() + timeout
    last, since = client.inq(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.01)
        now = client.inq()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def drain(client: RawClient, quiet: float = 0.5) -> tuple[list[bytes], bool]:
    """Read until ``quiet`` seconds pass without a packet; also say if it was closed."""
    got: list[bytes] = []
    try:
        while True:
            got.append(client.recv_packet(quiet))
    except TimeoutError:
        return got, False
    except Closed:
        return got, True


def split_kernel_part(got: list[bytes], inq: int) -> tuple[list[bytes], list[bytes]]:
    """Split what a stalled client read into (kernel backlog, server-queued tail)."""
    total = 0
    for i, packet in enumerate(got):
        if total == inq:
            return got[:i], got[i:]
        total += len(packet)
    assert total == inq, f"kernel backlog of {inq} bytes does not end on a packet boundary"
    return got, []


FLOOD_SIZE = 4096
FLOOD_COUNT = 2000


@dataclass
class Flood:
    """What a stalled client was left with after a lockstep flood."""

    sub: RawClient  # the live subscriber (it received every packet)
    pub: RawClient
    packets: list[bytes]
    got: list[bytes]  # what the stalled client read once it started reading
    closed: bool  # whether the server disconnected it
    inq: int  # its kernel backlog, in bytes, before it read


def flood_stalled(
    small: Callable[[], RawClient],
    *modes: bytes,
    count: int = FLOOD_COUNT,
    size: int = FLOOD_SIZE,
    window: int = 16,
) -> Flood:
    """Flood a stalled client in ``modes`` beside a live subscriber, then drain it."""
    stalled = stalled_client(small, b"fl/", *modes)
    sub, pub = small(), small()
    sub.sub(b"fl/")
    packets = numbered(b"fl/k", count, size)
    assert publish_lockstep(pub, sub, packets, window=window) == packets
    inq = settled_inq(stalled)
    got, closed = drain(stalled)
    return Flood(sub, pub, packets, got, closed, inq)


@pytest.mark.timeout(60)
def test_hard_discard_keeps_the_oldest_up_to_the_limit(
    small: Callable[[], RawClient],
) -> None:
    f = flood_stalled(small, b"blocking/hard/discard")
    packets, got, sub, pub = f.packets, f.got, f.sub, f.pub
    assert not f.closed
    kernel, queued = split_kernel_part(got, f.inq)
    # "Drop new messages": what survives is the oldest, in order.
    assert got == packets[: len(got)]
    assert len(got) < len(packets)
    # At most the hard limit was queued in the server, and the queue was used.
    assert HARD_LIMIT_MESSAGES - 5 <= len(queued) <= HARD_LIMIT_MESSAGES + 1, (
        f"kernel held {len(kernel)}, server queue delivered {len(queued)}"
    )
    sub.sync()
    pub.sync()


@pytest.mark.timeout(60)
def test_hard_error_disconnects_only_the_slow_client(
    small: Callable[[], RawClient],
) -> None:
    f = flood_stalled(small, b"blocking/hard/error")
    packets, got, sub, pub = f.packets, f.got, f.sub, f.pub
    assert f.closed, "the slow client should have been disconnected"
    kernel, _ = split_kernel_part(got, f.inq)
    assert got == packets[: len(got)]
    assert len(got) <= len(kernel) + HARD_LIMIT_MESSAGES + 1
    # The others keep going.
    sent = pub.pub(b"fl/after", b"still here")
    assert sub.recv_packet() == sent


def paused_flow(
    small: Callable[[], RawClient], mode: bytes, count: int
) -> tuple[RawClient, RawClient, list[bytes], Reader, threading.Thread]:
    """A stalled client in ``mode``, a live subscriber and a publisher of ``count``
    packets to both, run until delivery to the live subscriber stops (the server
    stopped reading the publisher because of the stalled client).

    Returns (stalled, publisher client, packets, reader of the live one, publisher thread).
    """
    stalled = stalled_client(small, b"fl/", mode)
    sub, pub = small(), small()
    sub.cmsg(b"blocking/hard/block")  # so that a lagging reader thread cannot lose any
    sub.sub(b"fl/")
    pub.timeout = 60.0  # its sends are expected to block for a while
    packets = numbered(b"fl/k", count, FLOOD_SIZE)
    reader = Reader(sub, len(packets), timeout=30.0)
    reader.start()
    publisher = threading.Thread(target=send_all, args=(pub, packets), daemon=True)
    publisher.start()
    deadline = time.monotonic() + 10
    last = -1
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if len(reader.got) == last:
            break
        last = len(reader.got)
    return stalled, pub, packets, reader, publisher


def blocked_flow(small: Callable[[], RawClient], mode: bytes, count: int) -> tuple[int, int]:
    """A stalled client in a block ``mode`` holds back a publisher; then it reads.

    Asserts nothing is lost anywhere; returns (messages routed while stalled, how
    many of them sat in the stalled client's kernel buffer).
    """
    stalled, _pub, packets, reader, publisher = paused_flow(small, mode, count)
    routed = len(reader.got)
    in_kernel = settled_inq(stalled) // len(packets[0])
    assert routed < len(packets), "nothing was held back"
    assert publisher.is_alive(), "the publisher was never paused"
    # The stalled client reads: everything flows again, nothing is lost.
    got = [stalled.recv_packet(10) for _ in packets]
    assert got == packets
    publisher.join(30)
    assert not publisher.is_alive()
    assert reader.result() == packets
    return routed, in_kernel


@pytest.mark.timeout(60)
def test_hard_block_pauses_the_publisher_and_loses_nothing(
    small: Callable[[], RawClient],
) -> None:
    routed, in_kernel = blocked_flow(small, b"blocking/hard/block", 1000)
    # It blocks only once the hard limit is reached: the queue was used up to it.
    assert in_kernel + HARD_LIMIT_MESSAGES - 5 <= routed <= in_kernel + HARD_LIMIT_MESSAGES + 2


@pytest.mark.timeout(60)
def test_soft_block_pauses_the_publisher_and_loses_nothing(
    small: Callable[[], RawClient],
) -> None:
    routed, in_kernel = blocked_flow(small, b"blocking/soft/block", 300)
    # protocol.md: the publisher waits "until this client's socket has taken the
    # packet", so (almost) nothing waits in the server's queue.
    assert routed <= in_kernel + 2, f"{routed} routed, {in_kernel} in the kernel"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [b"blocking/hard/block", b"blocking/soft/block"])
def test_blocking_client_that_leaves_releases_the_publisher(
    small: Callable[[], RawClient], mode: bytes
) -> None:
    # Not spelled out by the protocol, but what any user expects: a paused publisher
    # resumes when the client it waited for disconnects, and nothing is lost for
    # the others.
    stalled, pub, packets, reader, publisher = paused_flow(small, mode, 600)
    assert len(reader.got) < len(packets), "nothing was held back"
    stalled.close()
    assert reader.result() == packets
    publisher.join(30)
    assert not publisher.is_alive()
    pub.sync()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [b"blocking/hard/block", b"blocking/soft/block"])
def test_block_mode_client_flooding_itself_stays_bounded(
    small: Callable[[], RawClient], mode: bytes
) -> None:
    # protocol.md: "Nothing grows without bound", and the hard limit bounds every
    # client's queue.  A client in a block mode that echoes its own flood to itself
    # and never reads must not make its queue grow past the limit: the server may
    # stop reading from it (its sends then block) or drop, but not queue forever.
    me = small()
    me.shrink_rcvbuf()
    me.cmsg(mode)
    me.sub(b"self/")
    me.timeout = 2.0  # a send that blocks this long means the server stopped reading
    packets = numbered(b"self/k", 1000, FLOOD_SIZE)
    sent = 0
    try:
        for packet in packets:
            me.send(packet)
            sent += 1
    except TimeoutError:
        pass
    in_kernel = settled_inq(me) // len(packets[0])
    got, _ = drain(me)
    # What it can get: its kernel backlog, a queue up to the limit, and what was
    # still waiting unread in its own send buffer (~50 at most with 4 KiB packets).
    bound = in_kernel + HARD_LIMIT_MESSAGES + 60
    assert len(got) <= bound, (
        f"sent {sent}, received {len(got)}: the server queued past the hard limit "
        f"({in_kernel} in the kernel, limit {HARD_LIMIT_MESSAGES})"
    )


@pytest.mark.timeout(60)
def test_control_request_from_a_client_at_its_hard_limit_does_not_disconnect_it(
    small: Callable[[], RawClient],
) -> None:
    # protocol.md disconnects a slow client only in the `error` modes; under the default
    # hard/discard, going over the limit means "drop new messages for it".  A whoami
    # asked while the queue is full must not turn that into a disconnect (which
    # would also throw away the queued messages).  Dropping the answer, or sending
    # it late, are both acceptable here.
    stalled = stalled_client(small, b"fl/")
    sub, pub = small(), small()
    sub.sub(b"fl/")
    packets = numbered(b"fl/k", 400, FLOOD_SIZE)
    assert publish_lockstep(pub, sub, packets) == packets
    inq = settled_inq(stalled)
    stalled.cmsg(b"!/cred/whoami")
    stalled.cmsg(b"!/cred/whoami")
    time.sleep(0.2)  # let the server handle the requests before we read
    got, closed = drain(stalled)
    messages = [p for p in got if p.startswith(b"MSG ")]
    assert not closed, f"disconnected after {len(messages)} messages"
    _, queued = split_kernel_part(messages, inq)
    assert len(queued) >= HARD_LIMIT_MESSAGES - 5
    assert stalled.whoami()  # and it is still served


@pytest.mark.timeout(60)
def test_hard_limit_counts_bytes(small: Callable[[], RawClient]) -> None:
    # 100 KiB messages: the 1,000,000-byte limit binds long before 100 messages.
    f = flood_stalled(small, b"blocking/hard/discard", count=60, size=100 * 1024, window=1)
    packets, got = f.packets, f.got
    assert not f.closed
    _, queued = split_kernel_part(got, f.inq)
    assert got == packets[: len(got)]
    limit = HARD_LIMIT_BYTES // len(packets[0])
    assert limit - 1 <= len(queued) <= limit + 1, f"{len(queued)} queued, limit {limit}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "modes",
    [(), (b"blocking/soft/discard", b"blocking/soft/queue")],
    ids=["defaults", "last-mode-wins"],
)
def test_default_soft_queue_hard_discard(
    small: Callable[[], RawClient], modes: tuple[bytes, ...]
) -> None:
    # protocol.md: soft/queue and hard/discard are the defaults; the protocol says
    # the most recently sent control message takes precedence.
    f = flood_stalled(small, *modes, count=400)
    packets, got = f.packets, f.got
    assert not f.closed
    _, queued = split_kernel_part(got, f.inq)
    assert got == packets[: len(got)]
    assert HARD_LIMIT_MESSAGES - 5 <= len(queued) <= HARD_LIMIT_MESSAGES + 1


@pytest.mark.timeout(60)
def test_soft_discard_queues_nothing(small: Callable[[], RawClient]) -> None:
    f = flood_stalled(small, b"blocking/soft/discard")
    packets, got = f.packets, f.got
    assert not f.closed
    _, queued = split_kernel_part(got, f.inq)
    assert got == packets[: len(got)]
    assert len(got) < len(packets), "nothing was dropped"
    # Whatever the socket could not take was dropped, not queued.  (One packet of
    # slack: it may have been in flight when FIONREAD was read.)
    assert len(queued) <= 1, f"{len(queued)} packets were queued in the server"


@pytest.mark.timeout(60)
def test_soft_error_disconnects_the_slow_client(small: Callable[[], RawClient]) -> None:
    f = flood_stalled(small, b"blocking/soft/error")
    packets, got, sub, pub = f.packets, f.got, f.sub, f.pub
    assert f.closed, "the slow client should have been disconnected"
    assert got == packets[: len(got)]
    assert len(got) < len(packets)
    sub.sync()
    pub.sync()


def fill_kernel(pub: RawClient, watcher: RawClient, stalled: RawClient, key: bytes) -> int:
    """Publish fillers until the stalled client's kernel backlog stops growing.

    Returns how many were published; the last one is in the server's queue.
    """
    count = 0
    while count < 5000:
        before = stalled.inq()
        packet = b"MSG " + key + b"\0" + b"filler%06d|" % count + b"f" * 3037
        pub.send(packet)
        count += 1
        assert watcher.recv_packet() == packet
        deadline = time.monotonic() + 0.3
        while stalled.inq() == before and time.monotonic() < deadline:
            time.sleep(0.002)
        if stalled.inq() == before:
            return count
    raise AssertionError("the stalled client's socket never filled up")


def queued_tail(
    small: Callable[[], RawClient], mode: bytes, tail_packets: list[bytes]
) -> tuple[list[bytes], list[bytes]]:
    """Stall a client in ``mode``, fill its socket, publish ``tail_packets``.

    Returns (everything it then read, the part that came from the server's queue).
    """
    stalled = stalled_client(small, b"ord/", mode)
    sub, pub = small(), small()
    sub.sub(b"ord/")
    fillers = fill_kernel(pub, sub, stalled, b"ord/fill")
    assert publish_lockstep(pub, sub, tail_packets) == tail_packets
    inq = settled_inq(stalled)
    got, closed = drain(stalled)
    assert not closed
    assert len(got) == fillers + len(tail_packets), "a queued message was lost"
    _, queued = split_kernel_part(got, inq)
    assert len(queued) >= 20, f"only {len(queued)} messages went through the server queue"
    return got, queued


def tail_numbers(queued: list[bytes]) -> list[int]:
    return [seq(p) for p in queued if not p.startswith(b"MSG ord/fill\0")]


@pytest.mark.timeout(60)
def test_order_queue_drains_oldest_first(small: Callable[[], RawClient]) -> None:
    # The default, and the control case for the two tests below.
    _, queued = queued_tail(small, b"order/queue", numbered(b"ord/k", 50, 4096))
    numbers = tail_numbers(queued)
    assert numbers == sorted(numbers)


@pytest.mark.timeout(60)
def test_order_stack_drains_newest_first(small: Callable[[], RawClient]) -> None:
    _, queued = queued_tail(small, b"order/stack", numbered(b"ord/k", 50, 4096))
    numbers = tail_numbers(queued)
    assert numbers == sorted(numbers, reverse=True), numbers
    assert len(numbers) >= 20


@pytest.mark.timeout(60)
def test_order_random_drains_largest_first(small: Callable[[], RawClient]) -> None:
    # Distinct sizes in a scrambled order (37 is coprime to 60: every size once).
    sizes = [1000 + 100 * ((i * 37) % 60) for i in range(60)]
    packets = [b"MSG ord/k\0" + (b"%08d|" % i).ljust(size, b"r") for i, size in enumerate(sizes)]
    _, queued = queued_tail(small, b"order/random", packets)
    lengths = [len(p) for p in queued]
    assert lengths == sorted(lengths, reverse=True), lengths
