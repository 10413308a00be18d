"""Flood control: every decision about a packet that cannot be sent now.  No I/O.

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
from collections import deque
from enum import Enum

from sbus_relay.accel import load_compiled

from .quota import Account, unlimited

SOFT_MODES = ("queue", "discard", "block", "error")
HARD_MODES = ("discard", "block", "error")
ORDERS = ("queue", "stack", "random")

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


#: Actions that make the publisher wait (it stops being read) until ``still_blocked`` is False.
BLOCKING = frozenset({Action.QUEUE_AND_WAIT_EMPTY, Action.QUEUE_AND_WAIT_BELOW})


class OutboundQueue:
    """Packets waiting for one client, bounded by bytes and messages, with its modes.

    Packets and their enqueue times sit in two parallel deques rather than a
    deque of tuples: bytes and floats are not tracked by the garbage
    collector, so a stalled client's 65,536 queued messages do not make every
    full collection scan them (only ``order/random`` keeps heap tuples).  The
    deques are made on first use, so an idle client's queue is a few slots.
    ``count`` and ``nbytes`` are plain attributes so the hot path reads them
    without a call.
    """

    __slots__ = (
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
        self.soft = "queue"
        self.hard = "discard"
        self.order = "queue"
        self.count = 0
        self.nbytes = 0
        self._packets: deque[bytes] | None = None
        self._times: deque[float] | None = None
        self._heap: list[tuple[int, int, bytes, float]] | None = None
        self._seq = 0

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
        if self._packets is None:
            self._packets = deque()
            self._times = deque()
        assert self._times is not None
        self._packets.append(packet)
        self._times.append(now)

    def peek(self) -> tuple[bytes, float]:
        """The next packet to send, without removing it."""
        if self.order == "random":
            assert self._heap
            _, _, packet, t = self._heap[0]
            return packet, t
        assert self._packets is not None and self._times is not None
        if self.order == "stack":
            return self._packets[-1], self._times[-1]
        return self._packets[0], self._times[0]

    def pop(self) -> None:
        """Remove the packet ``peek`` returned (it was sent)."""
        if self.order == "random":
            assert self._heap is not None
            packet = heapq.heappop(self._heap)[2]
        else:
            assert self._packets is not None and self._times is not None
            if self.order == "stack":
                packet = self._packets.pop()
                self._times.pop()
            else:
                packet = self._packets.popleft()
                self._times.popleft()
        self.count -= 1
        self.nbytes -= len(packet)
        self.account.nbytes -= len(packet)

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
        self._heap = None
        self.count = self.nbytes = 0
        return n

    def _items_oldest_first(self) -> list[tuple[bytes, float]]:
        if self._heap:
            return [(p, t) for _, _, p, t in sorted(self._heap, key=lambda e: e[1])]
        if self._packets is None or self._times is None:
            return []
        return list(zip(self._packets, self._times, strict=True))


def decide(q: OutboundQueue) -> Action:
    """The action for one more published message that cannot be sent now."""
    soft = q.soft
    if soft == "discard":
        return Action.DROP_SOFT
    if soft == "error":
        return Action.DISCONNECT
    if q.over_limit():
        hard = q.hard
        if hard == "discard":
            return Action.DROP_UPWARD if q.upward else Action.DROP_HARD
        if hard == "error":
            return Action.DISCONNECT
        return Action.QUEUE_AND_WAIT_BELOW
    if soft == "block":
        return Action.QUEUE_AND_WAIT_EMPTY
    return Action.QUEUE


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
    if reason == Action.DROP_SOFT.value:
        return q.soft != "discard" or q.count == 0
    return not q.over_limit()


def decide_reply(q: OutboundQueue) -> Action:
    """A reply the server owes a client (whoami, drops/count) that cannot be sent now.

    A client that is over its limit still gets its replies, within
    ``REPLY_SLACK`` packets past the limit; beyond that they are dropped.  A
    reply is never a reason to disconnect, whatever the modes.
    """
    if q.count < q.max_messages + REPLY_SLACK:
        return Action.QUEUE
    return Action.DROP_HARD


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
