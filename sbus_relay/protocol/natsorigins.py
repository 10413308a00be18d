"""What this host receives from each other host over NATS: order, duplicates, losses.  No I/O.

What it owns: per origin, the last number delivered, what is held for
release, the refusals and the losses with their episodes.  What it may touch:
``natsenvelope``, ``natssubs`` (which subscriptions a count follows) and
``episodes``.

Theory of operation (docs/nats.md, "Every loss seen").  Each message from
another bus carries its origin (host and link incarnation) and the origin's
sequence number (``protocol.natsenvelope``).  Per origin this host keeps the
highest number it delivered: a message numbered at or below it is refused,
never delivered out of order, and counted (``duplicate`` if that very number
was delivered lately, ``late`` otherwise).  Across a host's processes the
same holds: once a newer incarnation of a host has delivered here, what an
older one sent and still comes (it was held up in a member that hung, say)
is refused as ``late``, never delivered after the newer one's messages.  A
message without an envelope (a native NATS client's) is none of this
module's business.

A NATS client library hands over each subscription's messages on its own
(nats-py runs a task per subscription), so messages of one origin that came
in order through two subscriptions may be handed over in another order.  So
what arrives is *held* (``arrive``, ``count``) and *released* in each origin's
order once the library has handed over what it had (``release``: the bridge
calls it once per turn of its loop).

Losses.  The origin counts, for this host, what it published that this host's
subscriptions match, and publishes the count beside the data
(``protocol.natsledger``); held with the data and released in its place (just
after the message whose number it carries), a count is compared with what
arrived since the previous one: what is missing was lost, counted here once,
by cause (``CAUSES``: what this host saw meanwhile), with a logged episode
(``nats.loss`` ... ``nats.loss.ended``).  What arrives is counted only if the
subscriptions that match it are those the origin's count follows
(``natssubs.Subscriptions.counted``), so that a pattern coming or going never
shows as a loss.  A message that arrives after the count that took it for
lost is refused as ``late`` (and stays counted lost).  A count is a total
since the origin first heard of us, so a lost one is made up by the next;
the first to arrive is compared with what arrived before it (``early``,
``EARLY_MAX``), counting as arrived whatever it may cover.

Whatever any NATS client publishes lands here, so: origins are bounded
(``ORIGINS_MAX``: the least recently heard leave first, never those of
hosts that announce their interest, so that a flood of forged origins cannot
push a real host's out; when none can leave a new one is refused), so are
the origins with a metric label of their own (``LABELS``: hosts that
announce their interest, first come, and a few others, ``STRANGER_LABELS``;
the rest are ``other``: a label never changes, so every series only grows)
and the loss episodes logged apart (``EPISODES_MAX``); a forged
origin can at most make that origin's counts wrong, and a forged number far
ahead, which would have every later message of that origin refused, is
given up after ``RESYNC_SECONDS`` of nothing but refusals.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from sbus_relay.accel import load_compiled

from .episodes import ENDED, Episodes
from .limits import EPISODE_QUIET
from .natsenvelope import decode_count, origin, prefix, split
from .natssubs import Subscriptions

#: Origins (host and incarnation) followed at once.
ORIGINS_MAX = 1024
#: Recent sequence numbers remembered per origin: a refused message within
#: them is told apart as a duplicate (delivered before) or late (never was).
WINDOW = 1024
_MASK = WINDOW - 1
#: Hosts with a metric label of their own among those that announce their
#: interest, the first heard; later ones are counted as ``other``.
LABELS = 64
#: And among origins that announced nothing (yet): few, so that forged
#: origins cannot take the labels of the hosts that come after them.
STRANGER_LABELS = 8
#: Origins shown by name in ``/clients`` (the busiest; the rest as ``other``).
SHOWN = 16
#: Loss episodes logged apart at once; further origins' losses share one.
EPISODES_MAX = 64
#: Arrivals remembered, over every origin, from origins that have sent no
#: count yet (``Origin.early``): the first count is compared with them.
EARLY_MAX = 65_536
#: An origin of which nothing but refused messages came for this long (and at
#: least ``RESYNC_MESSAGES`` of them) is taken up afresh from its next message.
RESYNC_SECONDS = 3.0
RESYNC_MESSAGES = 20
#: Why a message was lost, as this host can tell: its link to NATS was down
#: meanwhile, its NATS client dropped messages (a slow consumer), the origin
#: fell silent (a partition between them), or nothing it saw.
CAUSES = ("link_down", "slow_consumer", "origin_silent", "unknown")
_SILENT = 1
#: What a refused message was.
REFUSALS = ("duplicate", "late")
#: Label of the origins without one of their own.
OTHER = "other"
#: A row: delivered, lost by cause (``CAUSES``), duplicate, late.
ROW = ("delivered", *("lost_" + c for c in CAUSES), "duplicate", "late")

#: What ``arrive`` and ``count`` answer.
REFUSED = 0  # not an envelope (or our own): counted, drop it
HELD = 1  # held until ``release``
FIRST = 2  # held, the first since the last ``release``: call it soon

_first = itemgetter(0)


class Origin:
    """One origin (a host's link incarnation) as this host receives it."""

    __slots__ = (
        "arrived",
        "base",
        "causes",
        "delivered",
        "duplicate",
        "early",
        "excess",
        "floor",
        "heard",
        "host",
        "incarnation",
        "label",
        "last",
        "late",
        "lost",
        "marks",
        "rebase",
        "ring",
        "sent",
        "start",
        "streak",
        "streak_since",
        "unordered",
        "view",
    )

    def __init__(self, host: str, incarnation: int, label: str, now: float) -> None:
        self.host = host
        self.incarnation = incarnation
        self.label = label
        #: the highest number delivered (refused at or below)
        self.last = 0
        #: the highest number a count covered (what did not arrive by then is lost)
        self.floor = 0
        self.ring = array("Q", bytes(8 * WINDOW))
        #: the origin's count being followed: its start, the announcement of ours
        #: it follows (-1: none yet), the last count, arrivals counted then
        self.start = -1
        self.view = -1
        self.sent = 0
        self.base = 0
        self.rebase = False
        #: arrivals counted (those the origin counts for us)
        self.arrived = 0
        #: until its first count, what arrived: the subscriptions that matched
        #: (None: the long-key subject) -> the numbers; None: given up
        #: (``EARLY_MAX``), the first count is only a start then
        self.early: dict[Any, list[int]] | None = {}
        #: the origin fell silent since the last count (``_SILENT``), and the
        #: link's downs and slow-consumer drops as they were then (``Origins``)
        self.causes = 0
        self.marks = (0, 0)
        self.delivered = 0
        self.lost = [0] * len(CAUSES)
        self.duplicate = 0
        self.late = 0
        #: arrivals beyond the origin's count (patterns that changed between
        #: two counts): never subtracted from a loss
        self.excess = 0
        self.heard = now
        self.streak = 0
        self.streak_since = 0.0
        self.unordered = False

    def row(self) -> list[int]:
        return [self.delivered, *self.lost, self.duplicate, self.late]


class Origins:
    """Every origin this host receives from (see the module's theory)."""

    def __init__(self, host: str, incarnation: int, subs: Subscriptions) -> None:
        self.incarnation = incarnation
        self.subs = subs
        self._own = prefix(host, incarnation).partition(" ")[0]
        self.origins: dict[str, Origin] = {}
        #: host -> the key of its origin followed now (one incarnation per host)
        self._by_host: dict[str, str] = {}
        #: how often this host's link went down, and its NATS client dropped
        #: messages (an origin compares them with what they were at its last count)
        self._downs = 0
        self._slows = 0
        self._batch: dict[Origin, list[tuple[int, Any, bool, Any]]] = {}
        #: label -> the rows of origins no longer followed
        self._gone: dict[str, list[int]] = {}
        #: hosts with a label of their own: announced, and strangers
        self._labels: set[str] = set()
        self._strangers: set[str] = set()
        #: hosts the interest announcements know of (their origins leave last)
        self._known: set[str] = set()
        #: the rows as last read (``rows`` never shows a count going down)
        self._shown: dict[str, list[int]] = {}
        self._episodes = Episodes()
        self._episode_start: dict[str, float] = {}
        self._ticked = 0.0
        #: what to log: (event, fields); the bridge takes them (``reports``)
        self._reports: list[tuple[str, dict[str, Any]]] = []
        #: envelopes and counts that were not (counted, nothing else done)
        self.malformed = 0
        #: messages of our own host name (a live upgrade's other process)
        self.own = 0
        #: counts for another incarnation of ours, or older than what arrived
        self.stale = 0
        #: origins forgotten to make room, and new ones refused for want of it
        self.evicted = 0
        self.crowded = 0
        self.resyncs = 0
        #: arrivals held in the origins' ``early`` (``EARLY_MAX``)
        self._early = 0

    # --- what arrives ----------------------------------------------------------------

    def arrive(
        self, value: object, holders: tuple[bytes, ...] | None, deliver: bool, item: Any, now: float
    ) -> int:
        """A message with envelope ``value``, that ``holders`` (our subscriptions;
        None: the long-key subject, always counted) matched: held (``HELD``,
        ``FIRST``) or ``REFUSED``; ``item`` comes back from ``release`` if it is
        to be delivered (``deliver``) and in order."""
        got = split(value)
        if got is None or not got[1]:
            self.malformed += 1
            return REFUSED
        o = self._origin(got[0], now)
        if o is None:
            return REFUSED
        return self._hold(o, got[1] << 1, holders, deliver, item)

    def count(self, value: object, payload: bytes, now: float) -> int:
        """A count from another host (its subject ``<prefix>._s.<us>``): held in its place."""
        got = split(value)
        numbers = decode_count(payload) if got is not None else None
        if got is None or numbers is None:
            self.malformed += 1
            return REFUSED
        o = self._origin(got[0], now)
        if o is None:
            return REFUSED
        return self._hold(o, (got[1] << 1) | 1, numbers, False, None)

    def _origin(self, text: str, now: float) -> Origin | None:
        """The origin ``text`` names, new if need be; None: refused (counted)."""
        o = self.origins.get(text)
        if o is None:
            o = self._new(text, now)
        return o

    def _hold(self, o: Origin, place: int, holders: Any, deliver: bool, item: Any) -> int:
        batch = self._batch
        entries = batch.get(o)
        if entries is None:
            first = not batch
            batch[o] = [(place, holders, deliver, item)]
            return FIRST if first else HELD
        if place < entries[-1][0]:
            o.unordered = True
        entries.append((place, holders, deliver, item))
        return HELD

    def _new(self, text: str, now: float) -> Origin | None:
        parsed = origin(text)
        if parsed is None:
            self.malformed += 1
            return None
        host, incarnation = parsed
        if text.partition(" ")[0] == self._own:
            self.own += 1
            return None
        key = self._by_host.get(host)
        if key is not None and self.origins[key].incarnation > incarnation:
            self.stale += 1  # an older link than one already heard: never heard before
            return None
        # a restart, or a live upgrade's new process: the new incarnation starts
        # afresh; the older one's last messages, still on the way, keep theirs
        if len(self.origins) >= ORIGINS_MAX:
            self._evict(now)
            if len(self.origins) >= ORIGINS_MAX:  # every one of them waits for release
                self.crowded += 1
                return None
        label = self._label(host)
        o = self.origins[text] = Origin(host, incarnation, label, now)
        o.marks = (self._downs, self._slows)
        self._by_host[host] = text
        return o

    def _label(self, host: str) -> str:
        if host in self._labels or host in self._strangers:
            return host
        if host in self._known:
            if len(self._labels) < LABELS:
                self._labels.add(host)
                return host
        elif len(self._strangers) < STRANGER_LABELS:
            self._strangers.add(host)
            return host
        return OTHER

    def _evict(self, now: float) -> None:
        """Make room: the least recently heard quarter goes (amortised: one
        scan per ``ORIGINS_MAX // 4`` new origins), never one being released,
        nor the newest of a host the interest announcements know."""
        held, known, newest = self._batch, self._known, self._by_host
        quiet = sorted(
            (o.heard, key)
            for key, o in self.origins.items()
            if o not in held and (o.host not in known or newest.get(o.host) != key)
        )[: max(1, ORIGINS_MAX // 4)]
        for _, key in quiet:
            self._forget(key)
            self.evicted += 1

    def _forget(self, key: str) -> None:
        o = self.origins.pop(key)
        self._early_done(o)
        if self._by_host.get(o.host) == key:
            del self._by_host[o.host]
        into = self._gone.setdefault(o.label, [0] * len(ROW))
        for i, n in enumerate(o.row()):
            into[i] += n

    # --- in order ---------------------------------------------------------------------

    def release(self, now: float) -> list[Any]:
        """Everything held, in each origin's order: the items to deliver, in
        that order; refused messages and losses are counted."""
        out: list[Any] = []
        for o, entries in self._batch.items():
            if o.unordered:
                entries.sort(key=_first)
                o.unordered = False
            o.heard = now
            superseded = self._superseded(o)
            for place, holders, deliver, item in entries:
                seq = place >> 1
                if place & 1:
                    self._counted(o, seq, holders, now)
                    continue
                if superseded:
                    # a newer process of its host has delivered here already:
                    # this one's last messages, still on the way (through a
                    # member that hung), would come after newer ones
                    o.late += 1
                    if seq > o.floor:
                        self._arrived(o, holders, seq)  # refused, not lost: counted as late
                    continue
                if seq > o.last and seq > o.floor:
                    o.last = seq
                    o.ring[seq & _MASK] = seq
                    o.streak = 0
                    self._arrived(o, holders, seq)
                    if deliver:
                        o.delivered += 1
                        out.append(item)
                    continue
                if seq <= o.last and o.last - seq < WINDOW and o.ring[seq & _MASK] == seq:
                    o.duplicate += 1
                    continue
                if self._resync(o, seq, now):
                    self._arrived(o, holders, seq)
                    if deliver:
                        o.delivered += 1
                        out.append(item)
                    continue
                o.late += 1
                if seq > o.floor:
                    self._arrived(o, holders, seq)  # refused, not lost: counted as late
        self._batch.clear()
        return out

    def _arrived(self, o: Origin, holders: Any, seq: int) -> None:
        """Message ``seq`` of ``o``, that ``holders`` matched, arrived (delivered,
        or refused as late: not lost): counted if the origin counts it for us
        (as of the count it follows), or kept for its first count."""
        if o.view < 0:
            self._early_add(o, holders, seq)
        elif holders is None or self.subs.counted(holders, o.view):
            o.arrived += 1

    def _early_add(self, o: Origin, holders: Any, seq: int) -> None:
        """What arrived from ``o`` before its first count (see ``_counted``)."""
        early = o.early
        if early is None:
            return
        if self._early >= EARLY_MAX:
            self._early_done(o)
            return
        seqs = early.get(holders)
        if seqs is None:
            seqs = early[holders] = []
        seqs.append(seq)
        self._early += 1

    def _early_got(self, o: Origin, view: int, start: int, upto: int) -> int:
        """Of what arrived from ``o`` before its first count, what that count
        (``view``, since ``start``, up to ``upto``) may cover: its total is
        over every announcement of ours the origin heard since ``start``, and
        which of them each message was counted under is not known here, so
        everything that any of them may have counted is taken as counted.  A
        loss found so is one for sure; one hidden by a pattern that came
        meanwhile goes uncounted."""
        got = 0
        assert o.early is not None
        for holders, seqs in o.early.items():
            if holders is None or self.subs.maybe_counted(holders, view):
                for seq in seqs:
                    got += start < seq <= upto
        return got

    def _early_done(self, o: Origin) -> None:
        if o.early is not None:
            self._early -= sum(len(seqs) for seqs in o.early.values())
            o.early = None

    def _superseded(self, o: Origin) -> bool:
        """Whether a newer incarnation of ``o``'s host has delivered messages here."""
        key = self._by_host.get(o.host)
        newest = self.origins.get(key) if key is not None else None
        return newest is not None and newest is not o and newest.delivered > 0

    def _resync(self, o: Origin, seq: int, now: float) -> bool:
        """One more refusal in a row; True if that gives the origin up and
        takes it again from ``seq`` (delivered then)."""
        o.streak += 1
        if o.streak == 1:
            o.streak_since = now
            return False
        if o.streak < RESYNC_MESSAGES or now - o.streak_since < RESYNC_SECONDS:
            return False
        fields = {"origin": o.host, "was": o.last, "now": seq, "refused": o.streak}
        self._reports.append(("nats.origin_resync", fields))
        self.resyncs += 1
        o.last = seq
        o.floor = min(o.floor, seq)
        o.ring[seq & _MASK] = seq
        o.streak = 0
        o.rebase = True
        return True

    def _counted(self, o: Origin, upto: int, numbers: Any, now: float) -> None:
        incarnation, view, start, sent = numbers
        if incarnation != self.incarnation:
            self.stale += 1  # a count for another process of ours
            return
        if upto < o.floor or upto < o.last:
            # it came after messages it does not cover (a count held up on an
            # older path): the next count, whose total includes it, goes on
            # from the last one; only if it follows a newer announcement of
            # ours than the last count did (the arrivals since were counted
            # as of the older one) is the next one taken as a fresh start
            self.stale += 1
            if o.view >= 0 and view > o.view:
                o.view = view
                o.rebase = True
            return
        if o.start == start and o.view >= 0 and not o.rebase and sent >= o.sent:
            expected = sent - o.sent
            got = o.arrived - o.base
        elif o.view < 0 and o.early is not None:
            # the first count: "since my number ``start``, I sent you ``sent``",
            # against what arrived of it meanwhile (its first counts may be lost)
            expected = sent
            got = self._early_got(o, view, start, upto)
        else:
            expected = got = 0
        if expected > got:
            self._lost(o, expected - got, now)
        else:
            o.excess += got - expected
        self._early_done(o)
        o.start = start
        o.view = view
        o.sent = sent
        o.base = o.arrived
        o.rebase = False
        o.floor = upto
        o.causes = 0
        o.marks = (self._downs, self._slows)

    def _lost(self, o: Origin, n: int, now: float) -> None:
        downs, slows = o.marks
        cause = (
            0 if self._downs != downs
            else 1 if self._slows != slows
            else 2 if o.causes & _SILENT
            else 3
        )  # fmt: skip
        o.lost[cause] += n
        starts = self._episode_start
        name = o.host if o.host in starts or len(starts) < EPISODES_MAX else OTHER
        episode = self._episodes.begin(name, now, tell_end=True)
        if episode is None:
            opened = self._episodes.get(name)
            assert opened is not None
            opened.count += n
            return
        episode.count = episode.reported = n
        self._episode_start[name] = now
        self._reports.append(
            ("nats.loss", {"origin": name, "start": now, "count": n, "cause": CAUSES[cause]})
        )

    # --- what this host saw ------------------------------------------------------------

    def link_down(self) -> None:
        """This host's link to NATS went down: a loss until the next counts is its."""
        self._downs += 1

    def slow_consumer(self) -> None:
        """This host's NATS client dropped messages (it fell behind)."""
        self._slows += 1

    # HostWatcher: the interest announcements' view of each host
    def silent(self, host: str) -> None:
        for o in list(self.origins.values()):
            if o.host == host:
                o.causes |= _SILENT

    def view(self, host: str, incarnation: int, seq: int) -> None:
        self._known.add(host)

    def pattern(self, host: str, present: bool, pattern: bytes) -> None:
        pass

    def heard(self, host: str) -> None:
        pass

    def gone(self, host: str) -> None:
        self._known.discard(host)

    # --- reports -------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Call often (every ``EPISODE_QUIET`` seconds at least): loss episodes
        go on or end (their lines come out of ``reports``)."""
        if now - self._ticked < EPISODE_QUIET or not self._episodes:
            return
        self._ticked = now
        for what, episode in self._episodes.tick(now):
            start = self._episode_start.get(episode.event, episode.since)
            fields: dict[str, Any] = {
                "origin": episode.event,
                "start": start,
                "count": episode.count,
            }
            if what == ENDED:
                self._episode_start.pop(episode.event, None)
                fields["end"] = now
            self._reports.append(("nats.loss." + what, fields))

    def reports(self) -> list[tuple[str, dict[str, Any]]]:
        """What to log since the last call: (event, fields)."""
        out, self._reports = self._reports, []
        return out

    def rows(self) -> dict[str, list[int]]:
        """Per label (``_label``'s hosts and ``OTHER``): ``ROW``'s counts, never
        lower than last read (read from another thread: an origin moving to
        the forgotten ones may be missed once, never counted twice)."""
        rows: dict[str, list[int]] = {k: list(v) for k, v in list(self._gone.items())}
        for o in list(self.origins.values()):
            into = rows.setdefault(o.label, [0] * len(ROW))
            for i, n in enumerate(o.row()):
                into[i] += n
        shown = self._shown
        for label, row in rows.items():
            before = shown.get(label)
            if before is not None:
                row[:] = [max(a, b) for a, b in zip(row, before, strict=True)]
            shown[label] = row
        return rows

    def summary(self) -> dict[str, dict[str, int]]:
        """``/clients``'s view: the busiest ``SHOWN`` labels, the rest as ``other``."""
        return summarize(self.rows())

    # --- a live upgrade ----------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """Every origin's order and counts, as plain data (``restore`` takes it)."""
        return {
            "incarnation": self.incarnation,
            "labels": sorted(self._labels),
            "strangers": sorted(self._strangers),
            "gone": {k: list(v) for k, v in self._gone.items()},
            "origins": {
                key: [
                    o.host, o.incarnation, o.label, o.last, o.floor, o.start, o.view,
                    o.sent, o.base, o.arrived, o.row(), o.excess,
                ]
                for key, o in self.origins.items()
            },
            "counters": [self.malformed, self.own, self.stale, self.evicted, self.crowded,
                         self.resyncs],
        }  # fmt: skip

    def restore(self, record: Mapping[str, Any], now: float) -> None:
        """Go on from an earlier process's ``export`` of the same incarnation."""
        if record.get("incarnation") != self.incarnation:
            raise ValueError("origins go on only under the same incarnation")
        self._labels = set(record["labels"])
        self._strangers = set(record["strangers"])
        self._gone = {str(k): [int(n) for n in v] for k, v in dict(record["gone"]).items()}
        counters = [int(n) for n in record.get("counters", ())]
        if len(counters) == 6:
            (self.malformed, self.own, self.stale, self.evicted, self.crowded,
             self.resyncs) = counters  # fmt: skip
        for key, fields in dict(record["origins"]).items():
            host, inc, label, last, floor, start, view, sent, base, arrived, row, excess = fields
            o = Origin(str(host), int(inc), str(label), now)
            o.last, o.floor, o.start, o.view = int(last), int(floor), int(start), int(view)
            o.sent, o.base, o.arrived, o.excess = int(sent), int(base), int(arrived), int(excess)
            o.delivered, o.duplicate, o.late = int(row[0]), int(row[-2]), int(row[-1])
            o.lost = [int(n) for n in row[1:-2]]
            o.early = None  # (what arrived before a first count stayed with the old link)
            self.origins[str(key)] = o
            self._by_host[o.host] = str(key)


def positions(record: Mapping[str, Any]) -> dict[str, int]:
    """Where an earlier link's ``export`` left each origin: the place (a message
    ``seq`` is ``seq << 1``, a count after it ``seq << 1 | 1``) up to which it
    took everything that came, delivered, refused or counted lost.  What a new
    link held meanwhile at or below it is the old link's (``covered``)."""
    out = {}
    for key, fields in dict(record["origins"]).items():
        last, floor = int(fields[3]), int(fields[4])
        out[str(key)] = max(last << 1, (floor << 1) | 1 if floor else 0)
    return out


def covered(places: Mapping[str, int], value: object, count: bool) -> bool:
    """Whether a message (a count with ``count``) with envelope ``value`` lies
    at or below the place ``positions`` gave its origin: the old link's."""
    got = split(value)
    if got is None:
        return False
    place = places.get(got[0])
    return place is not None and (got[1] << 1 | count) <= place


def summarize(rows: Mapping[str, list[int]]) -> dict[str, dict[str, int]]:
    """``rows`` (``Origins.rows``) as ``/clients`` shows them: the busiest
    ``SHOWN`` labels, the rest as ``other``."""
    busiest = sorted(rows, key=lambda k: (-sum(rows[k]), k))
    out: dict[str, dict[str, int]] = {}
    other = [0] * len(ROW)
    for i, label in enumerate(busiest):
        row = rows[label]
        if i < SHOWN and label != OTHER:
            out[label] = _brief(row)
        else:
            other = [a + b for a, b in zip(other, row, strict=True)]
    if any(other):
        out[OTHER] = _brief(other)
    return out


def _brief(row: list[int]) -> dict[str, int]:
    return {
        "delivered": row[0],
        "lost": sum(row[1 : 1 + len(CAUSES)]),
        "duplicate": row[-2],
        "late": row[-1],
    }


load_compiled(globals(), "sbus_relay.protocol._c_natsorigins")
