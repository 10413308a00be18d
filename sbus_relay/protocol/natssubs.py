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
            if s.patterns == 0:  # back within its grace: the same subscription
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

    def export(self, now: float) -> dict[str, Any]:
        """Every subscription, the announcements that name it and what is left
        of its grace, as plain data: a live upgrade's new link process, going on
        under the same incarnation, holds and counts exactly what the old one's
        announcements promised (``restore``)."""
        return {
            "subs": [
                [r.hex(), s.patterns, s.order, s.added, s.removed,
                 max(0.0, self._ending[r] - now) if r in self._ending else None]
                for r, s in self.subs.items()
            ],
            "made": self._made,
            "added": [r.hex() for r in self._added],
            "removed": [r.hex() for r in self._removed],
        }  # fmt: skip

    def restore(self, record: Mapping[str, Any], now: float) -> list[tuple[int, bytes]]:
        """Become an earlier link's ``export`` (before any ``change`` here): every
        subscription, live or in its grace, with its number; returns each as
        (sid, relaxed pattern): the subscriptions to make on NATS."""
        self.subs.clear()
        self._live = SubscriptionIndex()
        self._grace = SubscriptionIndex()
        self._ending.clear()
        made = []
        for hexed, patterns, order, added, removed, left in record["subs"]:
            r = bytes.fromhex(str(hexed))
            s = Subscription(int(order))
            s.patterns, s.added, s.removed = int(patterns), int(added), int(removed)
            self.subs[r] = s
            if s.patterns > 0:
                self._live.add(r, r)
            else:
                self._grace.add(r, r)
                self._ending[r] = now + (UNSUB_GRACE if left is None else float(left))
            made.append((s.order, r))
        self._made = max(self._made, int(record.get("made", 0)))
        for s in self.subs.values():
            self._made = max(self._made, s.order)
        self._added = {bytes.fromhex(str(h)) for h in record.get("added", ())} & set(self.subs)
        self._removed = {bytes.fromhex(str(h)) for h in record.get("removed", ())} & set(self.subs)
        self.version += 1
        return sorted(made)

    def counted(self, holders: tuple[bytes, ...], view: int) -> bool:
        """Whether a message these subscriptions matched is one an origin whose
        count follows our announcement ``view`` counted for us."""
        subs = self.subs
        for h in holders:
            s = subs.get(h)
            if s is not None and s.added <= view < s.removed:
                return True
        return False

    def maybe_counted(self, holders: tuple[bytes, ...], view: int) -> bool:
        """Whether an origin whose count follows our announcement ``view`` may
        have counted a message these subscriptions matched: one of them was
        announced by then (or is gone, and so unknown), ended or not."""
        subs = self.subs
        for h in holders:
            s = subs.get(h)
            if s is None or s.added <= view:
                return True
        return False


load_compiled(globals(), "sbus_relay.protocol._c_natssubs")
