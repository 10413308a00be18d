"""This host's NATS subscriptions: when each is made and ended, which one takes a message.  No I/O.

What it owns: this host's NATS subscriptions, their graces and which one
takes a message.  What it may touch: ``natsmap``, ``index`` (the
subscriptions' relaxed patterns) and ``natsinterest``'s announcements.

Theory of operation (docs/nats.md, "Only wanted traffic crosses", "Every loss
seen").  Each local pattern maps to one NATS subscription, its relaxed form
(``natsmap.relaxed``); patterns with the same relaxed form share it.

* A subscription is made when its first pattern comes, before the pattern is
  announced (the bridge announces after), so nothing another host starts
  sending on hearing of it can miss it.
* When its last pattern goes it is kept ``UNSUB_GRACE`` seconds more: the
  removal is announced first, and the other hosts go on counting what they
  send us (``protocol.natsledger``) until they hear of it, so what they send
  meanwhile must still arrive: it is taken and counted, not delivered.
* NATS delivers a message once per matching subscription of a connection;
  the oldest live subscription that matches takes it (``taker``), and a
  message that only subscriptions in their grace match is taken by the oldest
  of those, for counting only.
* Each subscription remembers which of this host's announcements first named
  it and which announced its end (``announced``), so that an origin's count,
  which follows one of our announcements, is compared with exactly the
  messages its subscriptions at that announcement brought (``counted``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sbus_relay.accel import load_compiled

from .index import SubscriptionIndex
from .natsinterest import Announcement
from .natsmap import relaxed

#: Seconds a subscription outlives its last pattern: longer than the other
#: hosts take to hear of its removal (a lost delta is noticed at the next
#: heartbeat, every ``natsinterest.HEARTBEAT`` seconds, and a snapshot follows).
UNSUB_GRACE = 4.0
#: The announcement number of "not yet" and "not since" (above any real one).
NEVER = (1 << 63) - 1


class Subscription:
    """One NATS subscription of this host (a relaxed pattern)."""

    __slots__ = ("added", "order", "patterns", "removed")

    def __init__(self, order: int) -> None:
        #: local patterns behind it (0: in its grace)
        self.patterns = 1
        #: when it was made, among this host's subscriptions: the oldest takes
        self.order = order
        #: the first of our announcements that holds it, and the first that no
        #: longer does (NEVER: not yet / not since)
        self.added = NEVER
        self.removed = NEVER


class Subscriptions:
    """Every NATS subscription of this host, live or in its grace."""

    def __init__(self, first: int = 1) -> None:
        self.subs: dict[bytes, Subscription] = {}
        self._live: SubscriptionIndex = SubscriptionIndex()
        self._grace: SubscriptionIndex = SubscriptionIndex()
        #: subscriptions in their grace -> when it ends
        self._ending: dict[bytes, float] = {}
        #: the last subscription's order (its sid: the first is ``first``)
        self._made = first - 1
        #: raised by every change of which subscription takes what: an answer of
        #: ``decide`` kept from before is stale
        self.version = 0
        #: made, or ended, since the last announcement
        self._added: set[bytes] = set()
        self._removed: set[bytes] = set()
        #: taken over from an earlier process (``restore``), not yet made on NATS here
        self._restored: set[bytes] = set()

    def __len__(self) -> int:
        return len(self.subs)

    def change(self, pattern: bytes, present: bool, now: float) -> bytes | None:
        """One of this host's patterns came or went: the relaxed pattern a new
        NATS subscription is needed for (make it now), or None."""
        r = relaxed(pattern)
        if r is None:
            return None  # it matches nothing: nothing to subscribe to
        s = self.subs.get(r)
        if present:
            if s is None:
                self._made += 1
                self.version += 1
                self.subs[r] = Subscription(self._made)
                self._live.add(r, r)
                self._added.add(r)
                return r
            if s.patterns == 0:  # back within its grace (or taken over): the same subscription
                self.version += 1
                self._ending.pop(r, None)
                self._grace.remove(r, r)
                self._live.add(r, r)
                if r in self._removed:
                    self._removed.discard(r)  # its end was never announced
                else:
                    # announced gone, soon to be announced again: counted as
                    # held throughout (what it brings then is never a loss)
                    s.removed = NEVER
                if s.added == NEVER:
                    self._added.add(r)
                s.patterns = 1
                if r in self._restored:
                    self._restored.discard(r)
                    return r
                return None
            s.patterns += 1
            return None
        if s is None or s.patterns == 0:
            return None
        s.patterns -= 1
        if s.patterns == 0:
            self.version += 1
            self._live.remove(r, r)
            self._grace.add(r, r)
            self._ending[r] = now + UNSUB_GRACE
            self._added.discard(r)
            self._removed.add(r)
        return None

    def announced(self, announcements: list[Announcement]) -> None:
        """These of our announcements went out: the subscriptions made or
        ended since are held from (or no longer held from) their numbers.
        Rounded the safe way: a subscription counts from the first, and ends
        with the last, of a delta in several parts."""
        seqs = [a.seq for a in announcements if a.kind in ("D", "S")]
        if not seqs:
            return
        for r in self._restored:  # taken over, and no pattern of the bus came back to it
            del self.subs[r]
        self._restored.clear()
        first, last = min(seqs), max(seqs)
        for r in self._added:
            s = self.subs.get(r)
            if s is not None and s.added == NEVER:
                s.added = first
        for r in self._removed:
            s = self.subs.get(r)
            if s is not None:
                s.removed = last
        self._added.clear()
        self._removed.clear()

    def sid(self, r: bytes) -> int:
        """Subscription ``r``'s number (its order: the engine's sid)."""
        return self.subs[r].order

    def due(self, now: float) -> list[tuple[int, bytes]]:
        """Subscriptions whose grace is over, as (sid, relaxed pattern): end
        them on NATS now."""
        over = [r for r, until in self._ending.items() if until <= now]
        ended = []
        for r in over:
            del self._ending[r]
            self._grace.remove(r, r)
            self._removed.discard(r)
            ended.append((self.subs.pop(r).order, r))
        if ended:
            self.version += 1
        return ended

    def decide(self, key: bytes) -> tuple[int, bool, tuple[bytes, ...]] | None:
        """Which subscription's copy of a message of ``key`` to take (NATS gives
        one to each that matches): (its sid, whether to deliver it, every
        subscription that matches, for ``counted``); deliver is False when only
        subscriptions in their grace match (it is counted, not delivered).
        None: none of ours matches now.  Its answer holds until ``version`` moves."""
        holders = self._live.match(key)
        if holders:
            if self._ending:
                return self._oldest_sid(holders), True, holders + self._grace.match(key)
            return self._oldest_sid(holders), True, holders
        ending = self._grace.match(key)
        if not ending:
            return None
        return self._oldest_sid(ending), False, ending

    def _oldest_sid(self, holders: tuple[bytes, ...]) -> int:
        return self.subs[self._oldest(holders)].order

    def taker(self, r: bytes, key: bytes) -> tuple[bool, tuple[bytes, ...]] | None:
        """Subscription ``r`` brought a message of ``key``: None if another
        subscription takes it (NATS brings it there too), else (deliver, every
        subscription that matches it, for ``counted``): deliver is False when
        only subscriptions in their grace match (it is counted, not delivered)."""
        holders = self._live.match(key)
        if holders:
            if self._oldest(holders) != r:
                return None
            if self._ending:
                return True, holders + self._grace.match(key)
            return True, holders
        ending = self._grace.match(key)
        if not ending or self._oldest(ending) != r:
            return None  # (none: a subscription already ended; nobody counts it)
        return False, ending

    def _oldest(self, holders: tuple[bytes, ...]) -> bytes:
        """The oldest of these subscriptions (the one that takes a message)."""
        if len(holders) == 1:
            return holders[0]
        subs = self.subs
        first = holders[0]
        order = subs[first].order
        for h in holders:
            if subs[h].order < order:
                first, order = h, subs[h].order
        return first

    def export(self) -> dict[str, list[list[object]]]:
        """Every subscription and the announcements that name it, as plain
        data: a live upgrade's new process, going on under the same
        incarnation, counts what the old one's announcements promised."""
        subs = self.subs.items()
        return {"subs": [[r.hex(), s.patterns, s.order, s.added, s.removed] for r, s in subs]}

    def restore(self, record: Mapping[str, Any], now: float) -> list[bytes]:
        """Take up an earlier process's ``export`` (before any ``change``): its
        subscriptions' numbers.  The patterns themselves come again from the
        bus (``change``, which then answers each subscription to make); those
        that were in their grace are returned: make them now, they end
        ``UNSUB_GRACE`` from now."""
        grace = []
        for hexed, patterns, order, added, removed in record["subs"]:
            r = bytes.fromhex(str(hexed))
            s = Subscription(int(order))
            s.patterns, s.added, s.removed = 0, int(added), int(removed)
            self.subs[r] = s
            self._made = max(self._made, s.order)
            if int(patterns) == 0:
                self._grace.add(r, r)
                self._ending[r] = now + UNSUB_GRACE
                grace.append(r)
            else:
                self._restored.add(r)
        self.version += 1
        return grace

    def counted(self, holders: tuple[bytes, ...], view: int) -> bool:
        """Whether a message these subscriptions matched is one an origin whose
        count follows our announcement ``view`` counted for us."""
        subs = self.subs
        for h in holders:
            s = subs.get(h)
            if s is not None and s.added <= view < s.removed:
                return True
        return False


load_compiled(globals(), "sbus_relay.protocol._c_natssubs")
