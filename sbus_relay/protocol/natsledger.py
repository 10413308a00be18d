"""What this host sends each other host over NATS: sequence numbers, and counts.  No I/O.

What it owns: this host's sequence numbers and its per-destination counts.
What it may touch: ``natsinterest``'s remote interest (as its watcher),
``index``, ``natsmap`` and ``natsenvelope``.

Theory of operation (docs/nats.md, "Every loss seen").  Each message this
host publishes takes the next number of one sequence (``stamp``), over every
subject: the receivers see order and duplicates by it.  A host receives only
what it subscribed to, so the numbers it sees have gaps that are no loss
(messages for other hosts); what it should have received is counted here
instead.  For every other host (a *destination*, from the interest
announcements: ``RemoteInterest`` tells this ``Ledger`` as a ``HostWatcher``)
the ledger counts the messages published that its NATS subscriptions
match: the relaxed form (``natsmap.relaxed``) of each pattern it announced,
as of the announcement its view follows.  Periodically, and at once when a
destination's view changes (a *cut*), the bridge publishes to it, on the same
connection after the data, ``count`` (``natsenvelope.encode_count``): "up to
my sequence number G, following your announcement V, since my number S, I
sent you N".  NATS keeps one connection's messages in order towards another,
so the receiver compares N with what it received up to G
(``protocol.natsorigins``): the difference is what NATS lost, counted there,
once.

A destination that falls silent (a partition) is still counted for, from
what the bus offers the link, but published to no more (``stamp`` answers 0
when only silent hosts want a key): its first count after the heal holds the
whole gap.  One that goes away keeps its count for a while (``RETIRED_MAX``)
should it come back with the same incarnation.

``export``/``restore`` carry the state across a live upgrade.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sbus_relay.accel import load_compiled

from .index import SubscriptionIndex
from .natsenvelope import encode_count, prefix
from .natsinterest import HEARTBEAT
from .natsmap import relaxed

#: Seconds between two counts to one destination while messages flow to it.
LEDGER_INTERVAL = 0.25
#: Destinations gone (goodbye, or silent too long) whose count is kept for
#: their return under the same incarnation; the oldest leave first.
RETIRED_MAX = 1024


class Destination:
    """One other host as this one counts what it sends it."""

    __slots__ = ("count", "incarnation", "repeated", "silent", "start", "told", "told_at", "view")

    def __init__(self, incarnation: int, view: int, start: int) -> None:
        self.reset(incarnation, view, start)

    def reset(self, incarnation: int, view: int, start: int) -> None:
        """A count begins (a new host, or a new process of one)."""
        self.incarnation = incarnation
        #: the sequence number of its announcement its patterns here follow
        self.view = view
        #: this host's sequence number when this count began
        self.start = start
        #: messages published (or, while it is silent, offered) that it wants
        self.count = 0
        #: ``count`` as last told, when, and whether that was told twice
        self.told = -1
        self.told_at = 0.0
        self.repeated = False
        self.silent = False


#: The holder of the patterns published for NATS clients that are not hosts.
_ALWAYS = Destination(0, 0, 0)


class Ledger:
    """This host's sequence and what it counted for every other host."""

    def __init__(self, host: str, incarnation: int, always: tuple[bytes, ...] = ()) -> None:
        self.incarnation = incarnation
        #: what every envelope value of this origin begins with
        self.prefix = prefix(host, incarnation)
        #: the last sequence number taken
        self.seq = 0
        self.dests: dict[str, Destination] = {}
        self._retired: dict[str, Destination] = {}
        #: relaxed patterns -> the destinations (and ``_ALWAYS``) holding them
        self._index: SubscriptionIndex = SubscriptionIndex()
        for p in always:
            r = relaxed(p)
            if r is not None:
                self._index.add(_ALWAYS, r)
        #: destinations silent now (how many)
        self.silenced = 0
        #: destinations owed a count at once (their view changed)
        self._cuts: dict[str, None] = {}

    # --- per message -------------------------------------------------------------

    def stamp(self, key: bytes) -> int:
        """A message of ``key`` is about to be published: its sequence number,
        counted for each destination that wants it; 0 if only silent ones
        want it (then it is counted for them and not published)."""
        holders = self._index.match(key)
        wanted = not self.silenced or not holders
        for d in holders:
            d.count += 1
            if not d.silent:
                wanted = True
        if not wanted:
            return 0
        self.seq += 1
        return self.seq

    def stamp_long(self) -> int:
        """As ``stamp``, for a key too long for a subject: every host takes those."""
        for d in self.dests.values():
            d.count += 1
        if self.silenced and self.silenced == len(self.dests):
            return 0
        self.seq += 1
        return self.seq

    def unstamp(self, key: bytes, long: bool = False) -> None:
        """The message ``stamp`` just numbered was not published after all (NATS
        refused it, counted as such): it is no more counted for anyone."""
        for d in self.dests.values() if long else self._index.match(key):
            d.count -= 1

    def value(self, seq: int) -> str:
        """The envelope of message ``seq`` (``natsenvelope.HEADER``'s value)."""
        return f"{self.prefix}{seq}"  # (compiled: one allocation, no int object)

    # --- counts to publish -------------------------------------------------------

    def cuts(self) -> list[tuple[str, str, bytes]]:
        """Counts owed at once, as (destination, envelope, payload): publish
        them before anything else is stamped."""
        out = []
        for host in self._cuts:
            d = self.dests.get(host)
            if d is not None:
                out.append(self._tell(host, d, 0.0))
        self._cuts.clear()
        return out

    def due(self, now: float) -> list[tuple[str, str, bytes]]:
        """The counts to publish now (call every ``LEDGER_INTERVAL``): to each
        destination whose count moved, and once more ``HEARTBEAT`` after the
        last, in case that one was lost."""
        out = []
        for host, d in self.dests.items():
            since = now - d.told_at
            if d.count != d.told:
                if since >= LEDGER_INTERVAL:
                    d.repeated = False
                    out.append(self._tell(host, d, now))
            elif not d.repeated and since >= HEARTBEAT:
                d.repeated = True
                out.append(self._tell(host, d, now))
        return out

    def _tell(self, host: str, d: Destination, now: float) -> tuple[str, str, bytes]:
        d.told = d.count
        if now:
            d.told_at = now
        else:
            d.repeated = False  # a cut: said once more later, as the last count is
        payload = encode_count(d.incarnation, d.view, d.start, d.count)
        return host, self.value(self.seq), payload

    # --- HostWatcher: what the interest announcements say of each host ----------

    def view(self, host: str, incarnation: int, seq: int) -> None:
        d = self.dests.get(host)
        if d is None:
            d = self._retired.pop(host, None)
            if d is None or d.incarnation != incarnation:
                d = Destination(incarnation, seq, self.seq)
            self.dests[host] = d
        elif d.incarnation != incarnation:  # a new process of that host: a new count
            if d.silent:
                self.silenced -= 1
            d.reset(incarnation, seq, self.seq)
        d.view = seq
        self._cuts[host] = None

    def pattern(self, host: str, present: bool, pattern: bytes) -> None:
        d = self.dests.get(host)
        r = relaxed(pattern)
        if d is None or r is None:
            return
        if present:
            self._index.add(d, r)
        else:
            self._index.remove(d, r)

    def silent(self, host: str) -> None:
        d = self.dests.get(host)
        if d is not None and not d.silent:
            d.silent = True
            self.silenced += 1

    def heard(self, host: str) -> None:
        d = self.dests.get(host)
        if d is not None and d.silent:
            d.silent = False
            self.silenced -= 1

    def gone(self, host: str) -> None:
        d = self.dests.pop(host, None)
        if d is None:
            return
        if d.silent:
            d.silent = False
            self.silenced -= 1
        self._cuts.pop(host, None)
        self._retired.pop(host, None)
        self._retired[host] = d
        if len(self._retired) > RETIRED_MAX:
            del self._retired[next(iter(self._retired))]

    # --- a live upgrade ------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The sequence and every count, as plain data (``restore`` takes it)."""
        dests = {**self._retired, **self.dests}
        return {
            "incarnation": self.incarnation,
            "seq": self.seq,
            "dests": {h: [d.incarnation, d.view, d.start, d.count] for h, d in dests.items()},
        }

    def restore(self, record: Mapping[str, Any]) -> None:
        """Go on from an earlier process's ``export`` of the same incarnation:
        its sequence, and its counts for the hosts its views will name again."""
        if record.get("incarnation") != self.incarnation:
            raise ValueError("a ledger goes on only under the same incarnation")
        self.seq = max(self.seq, int(record["seq"]))
        for host, (inc, view, start, count) in dict(record["dests"]).items():
            d = Destination(int(inc), int(view), int(start))
            d.count = int(count)
            self._retired[str(host)] = d


load_compiled(globals(), "sbus_relay.protocol._c_natsledger")
