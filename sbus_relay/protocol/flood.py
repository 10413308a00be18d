"""A client's outbound queue and the flood-control decisions.  No I/O.

sbus-README "Flood control", settled by SPEC §4.  A message goes straight to
the client's socket when the socket can take it and nothing is queued before
it.  Otherwise ``OutboundQueue.decide`` says what to do, from the client's
soft mode (what to do when the socket would block) and hard mode (what to do
once the queue is over its limits).  ``order`` chooses which queued message
the writer sends next: oldest (queue), newest (stack) or largest (random:
frees memory fastest).
"""

from __future__ import annotations

import heapq
from collections import deque
from enum import Enum

SOFT_MODES = ("queue", "discard", "block", "error")
HARD_MODES = ("discard", "block", "error")
ORDERS = ("queue", "stack", "random")


class Action(Enum):
    """What to do with a message the socket cannot take right now."""

    QUEUE = "queue"
    QUEUE_AND_WAIT_EMPTY = "queue_wait_empty"  # soft/block: publisher waits for this client
    QUEUE_AND_WAIT_BELOW = "queue_wait_below"  # hard/block: publisher waits until below limit
    DROP_SOFT = "soft_discard"
    DROP_HARD = "hard_discard"
    DISCONNECT = "disconnect"


class OutboundQueue:
    """Packets waiting for one client, bounded by bytes and messages.

    Packets and their enqueue times sit in two parallel deques rather than a
    deque of tuples: bytes and floats are not tracked by the garbage
    collector, so a stalled client's 65,536 queued messages do not make every
    full collection scan them (only ``order/random`` keeps heap tuples).
    ``count`` and ``nbytes`` are plain attributes so the hot path reads them
    without a call.
    """

    __slots__ = (
        "_heap",
        "_packets",
        "_seq",
        "_times",
        "count",
        "hard",
        "max_bytes",
        "max_messages",
        "nbytes",
        "order",
        "soft",
    )

    def __init__(self, max_bytes: int, max_messages: int) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.soft = "queue"
        self.hard = "discard"
        self.order = "queue"
        self.count = 0
        self.nbytes = 0
        self._packets: deque[bytes] = deque()
        self._times: deque[float] = deque()
        self._heap: list[tuple[int, int, bytes, float]] = []
        self._seq = 0

    def over_limit(self) -> bool:
        """True when the hard limit is reached (SPEC §4)."""
        return self.count >= self.max_messages or self.nbytes >= self.max_bytes

    def decide(self) -> Action:
        """The action for one more message that cannot be sent now."""
        soft = self.soft
        if soft == "discard":
            return Action.DROP_SOFT
        if soft == "error":
            return Action.DISCONNECT
        if self.over_limit():
            hard = self.hard
            if hard == "discard":
                return Action.DROP_HARD
            if hard == "error":
                return Action.DISCONNECT
            return Action.QUEUE_AND_WAIT_BELOW
        if soft == "block":
            return Action.QUEUE_AND_WAIT_EMPTY
        return Action.QUEUE

    def push(self, packet: bytes, now: float) -> None:
        """Queue a packet (the caller has decided it may)."""
        self.count += 1
        self.nbytes += len(packet)
        if self.order == "random":
            self._seq += 1
            heapq.heappush(self._heap, (-len(packet), self._seq, packet, now))
        else:
            self._packets.append(packet)
            self._times.append(now)

    def peek(self) -> tuple[bytes, float]:
        """The next packet to send, without removing it."""
        if self.order == "random":
            _, _, packet, t = self._heap[0]
            return packet, t
        if self.order == "stack":
            return self._packets[-1], self._times[-1]
        return self._packets[0], self._times[0]

    def pop(self) -> None:
        """Remove the packet ``peek`` returned (it was sent)."""
        if self.order == "random":
            packet = heapq.heappop(self._heap)[2]
        elif self.order == "stack":
            packet = self._packets.pop()
            self._times.pop()
        else:
            packet = self._packets.popleft()
            self._times.popleft()
        self.count -= 1
        self.nbytes -= len(packet)

    def set_order(self, order: str) -> None:
        """Switch order, re-arranging what is queued (oldest first is kept as the base)."""
        if order == self.order:
            return
        items = self._items_oldest_first()
        self.order = order
        self._packets.clear()
        self._times.clear()
        self._heap.clear()
        self.count = self.nbytes = 0
        for packet, t in items:
            self.push(packet, t)

    def clear(self) -> int:
        """Drop everything; returns how many packets were dropped."""
        n = self.count
        self._packets.clear()
        self._times.clear()
        self._heap.clear()
        self.count = self.nbytes = 0
        return n

    def _items_oldest_first(self) -> list[tuple[bytes, float]]:
        if self.order == "random":
            return [(p, t) for _, _, p, t in sorted(self._heap, key=lambda e: e[1])]
        return list(zip(self._packets, self._times, strict=True))


def parse_flood_control(key: bytes) -> tuple[str, str] | None:
    """``(setting, value)`` for a flood-control CMSG key, else None.

    settings: "soft", "hard", "order" -- e.g. ``blocking/soft/discard`` ->
    ("soft", "discard").  Unknown values are None (ignored, SPEC §4).
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
