"""Flood control: every decision about a packet that cannot be sent now.  No I/O.

What it owns: every flood-control decision and a client's outbound queue.
What it may touch: the queue's account (quota).

docs/protocol.md, "Flood control".
A packet goes straight to a client's socket when the socket can take it and
nothing is queued before it.  Otherwise this module decides, and the bus only
carries the decision out:

* ``decide`` -- a published message for a client that cannot take it now:
  queue it, queue it and pause the publisher, drop it (and shed the next ones
  without trying), or disconnect the client.  The table below is the whole
  policy; ``tests/unit/test_flood.py`` checks every row.
* ``still_blocked`` -- whether a paused publisher must go on waiting.
* ``shedding_ends`` -- whether a client that sheds may be tried again.
* ``decide_reply`` -- a server-made reply (whoami, drops/count) for a client
  at or over its limit: queued within a small slack, else dropped, never a
  reason to disconnect.

A relay's link to its upstream has a queue like a client's (queue, then
discard past its bound: ``DROP_UPWARD``): a relay's local bus never waits for
its upstream.  Interest notices are not decided here: they are coalesced per
pattern in the connection, so they are bounded by the number of distinct
patterns and never dropped.

=============  =============  ======================  ==========================
soft mode      under limit    over the hard limit      (hard mode)
=============  =============  ======================  ==========================
queue          QUEUE          discard: DROP_HARD       block: QUEUE_AND_WAIT_BELOW
                              error: DISCONNECT
block          QUEUE_AND_     (as for queue)
               WAIT_EMPTY
discard        DROP_SOFT      DROP_SOFT
error          DISCONNECT     DISCONNECT
=============  =============  ======================  ==========================

The hard limit counts a client's queued messages and bytes, and its user's
queued bytes across all of that user's connections (``Account``).
"""

from __future__ import annotations

import heapq
from enum import Enum

from sbus_relay.accel import load_compiled

from .quota import Account, unlimited
from .scan import size_of

SOFT_MODES = ("queue", "discard", "block", "error")
HARD_MODES = ("discard", "block", "error")
ORDERS = ("queue", "stack", "random")
#: The modes of a client that never asked for others (docs/protocol.md).
DEFAULT_SOFT = "queue"
DEFAULT_HARD = "discard"

#: Packets a queue's sent head may reach before it is cut off (when no shorter
#: than what still waits): one memmove per that many packets sent.
COMPACT_AFTER = 1024

#: Server-made replies (whoami, drops/count) queued past the hard limit before
#: further ones are dropped: a client that asks without reading cannot grow
#: its queue by more than this.
REPLY_SLACK = 64


class Action(Enum):
    """What to do with a packet the socket cannot take right now."""

    QUEUE = "queue"
    QUEUE_AND_WAIT_EMPTY = "queue_wait_empty"  # soft/block: publisher waits for this client
    QUEUE_AND_WAIT_BELOW = "queue_wait_below"  # hard/block: publisher waits until below limit
    DROP_SOFT = "soft_discard"  # the value is the drop reason counted
    DROP_HARD = "hard_discard"
    DROP_UPWARD = "upstream_queue_overflow"
    DISCONNECT = "disconnect"


# The members as plain module names: an Enum's attribute lookup is costly on
# the hot path, where the compiled build reads these as C globals.
_QUEUE = Action.QUEUE
_QUEUE_AND_WAIT_EMPTY = Action.QUEUE_AND_WAIT_EMPTY
_QUEUE_AND_WAIT_BELOW = Action.QUEUE_AND_WAIT_BELOW
_DROP_SOFT = Action.DROP_SOFT
_DROP_HARD = Action.DROP_HARD
_DROP_UPWARD = Action.DROP_UPWARD
_DISCONNECT = Action.DISCONNECT
_SOFT_DISCARD = Action.DROP_SOFT.value

#: Actions that make the publisher wait (it stops being read) until ``still_blocked`` is False.
BLOCKING = frozenset({Action.QUEUE_AND_WAIT_EMPTY, Action.QUEUE_AND_WAIT_BELOW})


class OutboundQueue:
    """Packets waiting for one client, bounded by bytes and messages, with its modes.

    Packets and their enqueue times sit in two parallel lists rather than a
    list of tuples: bytes and floats are not tracked by the garbage
    collector, so a stalled client's 65,536 queued messages do not make every
    full collection scan them (only ``order/random`` keeps heap tuples).  The
    packets waiting are ``_packets[_head:]``: "queue" order sends from the
    head, "stack" from the end; the sent head is cut off once it is as long as
    what waits (``COMPACT_AFTER``), so a list append is all a queued packet
    costs.  The lists are made on first use, so an idle client's queue is a
    few slots.  ``count`` and ``nbytes`` are plain attributes so the hot path
    reads them without a call.
    """

    __slots__ = (
        "_front",
        "_head",
        "_heap",
        "_packets",
        "_seq",
        "_times",
        "account",
        "count",
        "hard",
        "max_bytes",
        "max_messages",
        "nbytes",
        "order",
        "soft",
        "upward",
    )

    def __init__(
        self,
        max_bytes: int,
        max_messages: int,
        account: Account | None = None,
        *,
        upward: bool = False,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.account = account if account is not None else unlimited()
        #: a relay's queue of messages for its upstream (past its bound: DROP_UPWARD)
        self.upward = upward
        self.soft = DEFAULT_SOFT
        self.hard = DEFAULT_HARD
        self.order = "queue"
        self.count = 0
        self.nbytes = 0
        self._packets: list[bytes] | None = None
        self._times: list[float] | None = None
        self._head = 0
        self._heap: list[tuple[int, int, bytes, float]] | None = None
        self._seq = 0
        self._front = 0  # sequence numbers of packets put back in front (order/random)

    def over_limit(self) -> bool:
        """True when the hard limit is reached: this client's, or its user's (bytes)."""
        return (
            self.count >= self.max_messages
            or self.nbytes >= self.max_bytes
            or self.account.nbytes >= self.account.max_bytes
        )

    def push(self, packet: bytes, now: float) -> None:
        """Queue a packet (the caller has decided it may)."""
        size = len(packet)
        self.count += 1
        self.nbytes += size
        self.account.nbytes += size
        if self.order == "random":
            if self._heap is None:
                self._heap = []
            self._seq += 1
            heapq.heappush(self._heap, (-size, self._seq, packet, now))
            return
        if self._packets is None or self._times is None:
            self._packets = []
            self._times = []
        self._packets.append(packet)
        self._times.append(now)

    def take(self, limit: int) -> tuple[list[bytes], list[float]]:
        """Remove up to ``limit`` packets in the order they are to be sent, with
        the times they were queued (so a socket gets a whole batch at once)."""
        if self.order == "random":
            packets: list[bytes] = []
            times: list[float] = []
            heap = self._heap
            while heap and len(packets) < limit:
                _, _, packet, t = heapq.heappop(heap)
                packets.append(packet)
                times.append(t)
        elif self._packets is None or self._times is None:
            return [], []
        else:
            n = min(limit, self.count)
            head = self._head
            if head >= COMPACT_AFTER and head >= self.count:
                del self._packets[:head]  # the sent ones: at most as many as wait
                del self._times[:head]
                head = self._head = 0
            if self.order == "stack":
                end = len(self._packets)
                packets = self._packets[end - n : end]
                times = self._times[end - n : end]
                packets.reverse()
                times.reverse()
                del self._packets[end - n :]
                del self._times[end - n :]
            else:
                packets = self._packets[head : head + n]
                times = self._times[head : head + n]
                self._head = head + n
        size = size_of(packets, len(packets))
        self.count -= len(packets)
        self.nbytes -= size
        self.account.nbytes -= size
        if not self.count and self._packets is not None:
            self._packets = self._times = None  # all sent: let the lists go
            self._head = 0
        return packets, times

    def put_back(self, packets: list[bytes], times: list[float]) -> None:
        """What ``take`` removed and the socket did not accept goes first again."""
        n = len(packets)
        if self.order == "random":
            # in front of every packet of the same size: sequence numbers below
            # any ``push`` has given, the first of the batch lowest
            heap = self._heap
            if heap is None:
                heap = self._heap = []
            for i in range(n - 1, -1, -1):
                self._front -= 1
                heapq.heappush(heap, (-len(packets[i]), self._front, packets[i], times[i]))
        elif self._packets is None or self._times is None:
            self._packets = list(packets)
            self._times = list(times)
            self._head = 0
            if self.order == "stack":
                self._packets.reverse()
                self._times.reverse()
        elif self.order == "stack":
            for i in range(n - 1, -1, -1):
                self._packets.append(packets[i])
                self._times.append(times[i])
        elif self._head >= n:
            head = self._head = self._head - n
            self._packets[head : head + n] = packets
            self._times[head : head + n] = times
        else:
            self._packets[: self._head] = packets
            self._times[: self._head] = times
            self._head = 0
        size = size_of(packets, n)
        self.count += n
        self.nbytes += size
        self.account.nbytes += size

    def set_order(self, order: str) -> None:
        """Switch order, re-arranging what is queued (oldest first is kept as the base)."""
        if order == self.order:
            return
        items = self._items_oldest_first()
        self.clear()
        self.order = order
        for packet, t in items:
            self.push(packet, t)

    def clear(self) -> int:
        """Drop everything; returns how many packets were dropped."""
        n = self.count
        self.account.nbytes -= self.nbytes
        self._packets = self._times = None
        self._head = 0
        self._heap = None
        self.count = self.nbytes = 0
        return n

    def _items_oldest_first(self) -> list[tuple[bytes, float]]:
        if self._heap:
            return [(p, t) for _, _, p, t in sorted(self._heap, key=lambda e: e[1])]
        if self._packets is None or self._times is None:
            return []
        head = self._head
        return list(zip(self._packets[head:], self._times[head:], strict=True))


def decide(q: OutboundQueue) -> Action:
    """The action for one more published message that cannot be sent now."""
    soft = q.soft
    if soft == "discard":
        return _DROP_SOFT
    if soft == "error":
        return _DISCONNECT
    if q.over_limit():
        hard = q.hard
        if hard == "discard":
            return _DROP_UPWARD if q.upward else _DROP_HARD
        if hard == "error":
            return _DISCONNECT
        return _QUEUE_AND_WAIT_BELOW
    if soft == "block":
        return _QUEUE_AND_WAIT_EMPTY
    return _QUEUE


def still_blocked(action: Action, q: OutboundQueue) -> bool:
    """Must a publisher paused by ``action`` on this queue go on waiting?

    soft/block waits until the client's socket has taken everything queued;
    hard/block until the queue is below its hard limit again.
    """
    if action is Action.QUEUE_AND_WAIT_EMPTY:
        return q.count > 0
    return q.over_limit()


def shedding_ends(reason: str, q: OutboundQueue) -> bool:
    """May a client shedding for ``reason`` be tried again, now that its socket drained?

    soft/discard sheds only while its socket is full (nothing is ever queued
    in that mode, so a drained socket ends it); hard/discard until its queue is
    below the hard limit.
    """
    if reason == _SOFT_DISCARD:
        return q.soft != "discard" or q.count == 0
    return not q.over_limit()


def decide_reply(q: OutboundQueue) -> Action:
    """A reply the server owes a client (whoami, drops/count) that cannot be sent now.

    A client that is over its limit still gets its replies, within
    ``REPLY_SLACK`` packets past the limit; beyond that they are dropped.  A
    reply is never a reason to disconnect, whatever the modes.
    """
    if q.count < q.max_messages + REPLY_SLACK:
        return _QUEUE
    return _DROP_HARD


def parse_flood_control(key: bytes) -> tuple[str, str] | None:
    """``(setting, value)`` for a flood-control CMSG key, else None.

    settings: "soft", "hard", "order" -- e.g. ``blocking/soft/discard`` ->
    ("soft", "discard").  Unknown values are None (ignored, as the protocol says).
    """
    text = key.decode("ascii", "replace")
    if text.startswith("blocking/soft/"):
        value = text[14:]
        return ("soft", value) if value in SOFT_MODES else None
    if text.startswith("blocking/hard/"):
        value = text[14:]
        return ("hard", value) if value in HARD_MODES else None
    if text.startswith("order/"):
        value = text[6:]
        return ("order", value) if value in ORDERS else None
    return None


load_compiled(globals(), "sbus_relay.protocol._c_flood")
