"""The link's NATS subscriptions for this host's patterns, and one copy per host.

What it owns: which NATS subscription (``sid``) stands for which relaxed
pattern, how many local patterns are behind each, and which of the matching
ones a message is taken from.  What it may touch: nothing (the bridge makes
the engine's calls it returns).

NATS delivers a message once per matching subscription of a connection, so
the link takes it from one of them only, the oldest of its subscriptions
that match (found with a ``SubscriptionIndex`` of the subscriptions' relaxed
patterns, which match exactly what the subscriptions do).
"""

from __future__ import annotations

from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.natsmap import relaxed

#: The link's own subscriptions' sids (interest, snapshot requests, long
#: keys); a pattern's sid is above them.
INTEREST_SID = 1
SNAPSHOT_SID = 2
LONG_SID = 3
FIRST_PATTERN_SID = 16


class Subscriptions:
    """Relaxed patterns -> sids, counted; sids grow, so the oldest is the smallest."""

    def __init__(self) -> None:
        self._sid: dict[bytes, int] = {}  # relaxed pattern -> sid
        self._count: dict[bytes, int] = {}  # relaxed pattern -> local patterns behind it
        self._next = FIRST_PATTERN_SID
        self._index: SubscriptionIndex = SubscriptionIndex()
        #: raised by every change: what was worked out from the set before is stale
        self.version = 0

    def __len__(self) -> int:
        return len(self._sid)

    def change(self, pattern: bytes, present: bool) -> tuple[int, bytes] | None:
        """A local pattern came or went: (sid, relaxed pattern) of a NATS
        subscription to make (present) or drop (absent), or None."""
        r = relaxed(pattern)
        if r is None:
            return None  # it matches nothing: nobody needs to hear of it
        n = self._count.get(r, 0) + (1 if present else -1)
        if n > 0:
            self._count[r] = n
        else:
            self._count.pop(r, None)
        if present and n == 1:
            self.version += 1
            sid = self._next
            self._next += 1
            self._sid[r] = sid
            self._index.add(r, r)
            return sid, r
        if not present and n == 0:
            self.version += 1
            self._index.remove(r, r)
            sid = self._sid.pop(r, 0)
            return (sid, r) if sid else None
        return None

    def taker(self, key: bytes) -> int:
        """The sid whose copy of ``key`` is the one to take (0: none matches now)."""
        holders = self._index.match(key)
        sids = self._sid
        return min((sids.get(h, 0) for h in holders), default=0)
