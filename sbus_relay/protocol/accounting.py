"""Who did it: traffic, drops and queues per child relay and per user, bounded.

What it owns: the bounded per-relay and per-user rows.  What it may touch: the
counts it is given.

Theory of operation.  Each connection counts its own traffic in plain
integers (``Connection.msgs_in`` ...).  On a scrape the server groups its
live connections by a *key* (the relay's name, or the uid) into rows of
``COUNTERS`` and ``GAUGES``, and hands them to a ``Tally``, which also holds
what closed connections left behind.  The tally exports the ``top`` keys by
recent activity under their own label and folds every other key into
``OTHER``, so the number of series stays at ``top + 1`` however many clients
come and go.

Counters must never go down, even as keys enter and leave the top.  So a key
entering the top starts its series from what ``other`` has not shown of it
yet (its ``base`` is its total at the previous scrape: a key that appeared
since, or any key at the first scrape, starts at its whole total), and a
key leaving it keeps counting into ``other``: what its series last showed
is remembered in ``_left``, so ``other`` takes over exactly the increments
its series never showed.  ``other`` is the grand total minus what
the exported keys show; every increment appears in exactly one series, so a
sum of rates over the labels is the server's rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

#: Counter fields of a row, in order (``sbus_<dimension>_<field>``).
COUNTERS = (
    "messages_in",
    "messages_out",
    "bytes_in",
    "bytes_out",
    "dropped_messages",
    "disconnects",
)
#: Gauge fields of a row, in order.
GAUGES = ("queued_messages", "queued_bytes", "connections")
#: Label of everything outside the top.
OTHER = "other"
#: Relay label of clients connected directly (not through a child relay).
LOCAL = "local"
#: Label values a relay may not announce as its name.
RESERVED_LABELS = frozenset({OTHER, LOCAL})
#: Longest relay name kept (longer or malformed names fall back to credentials).
MAX_NAME = 64
#: Allowed bounds of ``top`` (the config's ``accounting_top``).
TOP_MIN, TOP_MAX = 1, 1000
#: Seconds between re-rankings of the top: a full top changes at most this often.
RANK_INTERVAL = 10.0

_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:@-")
_N = len(COUNTERS)
_ZERO = (0,) * _N

Row = tuple[Sequence[int], Sequence[int]]  # counters, gauges


def relay_name(raw: bytes) -> str | None:
    """The name a relay announced (``CMSG relay/name``), or None if unusable."""
    if not 0 < len(raw) <= MAX_NAME or not _NAME_BYTES.issuperset(raw):
        return None
    name = raw.decode("ascii")
    return None if name in RESERVED_LABELS else name


def credentials_label(gid: int, uid: int, pid: int) -> str:
    """The label of a relay that announced no usable name."""
    return "cred:%d/%d/%d" % (gid, uid, pid)


def _add(into: list[int], counters: Sequence[int], sign: int = 1) -> None:
    for i in range(_N):
        into[i] += sign * counters[i]


class Tally:
    """Per-key counters and gauges of one dimension (relay or user), bounded to
    ``top`` labelled keys plus ``OTHER``."""

    def __init__(self, top: int, rank_interval: float = RANK_INTERVAL) -> None:
        if not TOP_MIN <= top <= TOP_MAX:
            raise ValueError("top must be within %d..%d" % (TOP_MIN, TOP_MAX))
        self.top = top
        self._rank_interval = rank_interval
        #: counters left by closed connections (or moved off a key), per key
        self._closed: dict[str, list[int]] = {}
        #: counters of keys no longer tracked at all: part of the grand total
        self._forgotten = [0] * _N
        #: exported key -> its total when it entered the top
        self._base: dict[str, list[int]] = {}
        #: what keys that left the top had shown under their own label
        self._left = [0] * _N
        #: exported key -> what its series showed at the last scrape
        self._shown: dict[str, list[int]] = {}
        #: totals per key at the last ranking (activity is measured from them)
        self._ranked: dict[str, list[int]] = {}
        self._ranked_at: float | None = None
        #: totals per key at the previous scrape (``other`` has shown those)
        self._scraped: dict[str, list[int]] = {}

    # --- a live upgrade hands the tally to the next process ---------------------------

    def export(self) -> dict[str, object]:
        """Everything it holds, as plain data (``restore`` takes it)."""
        return {
            "closed": self._closed,
            "forgotten": self._forgotten,
            "base": self._base,
            "left": self._left,
            "shown": self._shown,
            "ranked": self._ranked,
            "ranked_at": self._ranked_at,
            "scraped": self._scraped,
        }

    def restore(self, state: Mapping[str, object]) -> None:
        """Take up an earlier process's tally, so its series go on without a reset."""
        self._closed = dict(state["closed"])  # type: ignore[call-overload]
        self._forgotten = list(state["forgotten"])  # type: ignore[call-overload]
        self._base = dict(state["base"])  # type: ignore[call-overload]
        self._left = list(state["left"])  # type: ignore[call-overload]
        self._shown = dict(state["shown"])  # type: ignore[call-overload]
        self._ranked = dict(state["ranked"])  # type: ignore[call-overload]
        ranked_at = state["ranked_at"]
        self._ranked_at = float(ranked_at) if ranked_at is not None else None  # type: ignore[arg-type]
        self._scraped = dict(state["scraped"])  # type: ignore[call-overload]

    # --- events from the server ---------------------------------------------------

    def closed(self, key: str, counters: Sequence[int]) -> None:
        """A connection of ``key`` closed: keep what it counted."""
        into = self._closed.get(key)
        if into is None:
            into = self._closed[key] = [0] * _N
        _add(into, counters)

    def moved(self, old: str, new: str, counters: Sequence[int]) -> None:
        """A live connection changed key: what it counted so far stays with ``old``."""
        self.closed(old, counters)
        self.closed(new, [-c for c in counters])

    def trim(self, live: Iterable[str]) -> None:
        """Forget closed totals of keys that are neither live nor exported
        (called when ``_closed`` grows past the live keys, so it stays bounded)."""
        keep = set(live) | self._base.keys()
        for key in [k for k in self._closed if k not in keep]:
            _add(self._forgotten, self._closed.pop(key))

    def set_top(self, top: int) -> None:
        """Name ``top`` keys from now on (a reload); ranked afresh at the next
        scrape, so the counters of keys that leave the top go on as ``other``."""
        if not TOP_MIN <= top <= TOP_MAX:
            raise ValueError("top must be within %d..%d" % (TOP_MIN, TOP_MAX))
        if top != self.top:
            self.top = top
            self._ranked_at = None

    def tracked(self) -> int:
        """Keys holding closed totals (bounded by live plus exported keys after ``trim``)."""
        return len(self._closed)

    # --- the scrape ----------------------------------------------------------------

    def rows(self, live: Mapping[str, Row], now: float) -> list[tuple[str, list[int], list[int]]]:
        """The exported rows: ``(label, counters, gauges)`` for at most ``top`` keys
        and ``OTHER`` (always present)."""
        totals: dict[str, list[int]] = {}
        for key, counts in self._closed.items():
            totals[key] = list(counts)
        gauges: dict[str, Sequence[int]] = {}
        for key, (counters, now_gauges) in live.items():
            into = totals.get(key)
            if into is None:
                into = totals[key] = [0] * _N
            _add(into, counters)
            gauges[key] = now_gauges
        due = self._ranked_at is None or now - self._ranked_at >= self._rank_interval
        room = len(self._base) < self.top and any(k not in self._base for k in totals)
        if due or room:  # a free slot is filled at once: nobody leaves for it
            self._rerank(totals, gauges)
            self._ranked_at = now
        grand = list(self._forgotten)
        for counts in totals.values():
            _add(grand, counts)
        out: list[tuple[str, list[int], list[int]]] = []
        other_counters = grand
        _add(other_counters, self._left, -1)
        other_gauges = [0] * len(GAUGES)
        for key, g in gauges.items():
            if key not in self._base:
                for i, v in enumerate(g):
                    other_gauges[i] += v
        for key, base in self._base.items():
            mine = list(totals.get(key, _ZERO))
            _add(mine, base, -1)
            _add(other_counters, mine, -1)
            self._shown[key] = mine
            out.append((key, mine, list(gauges.get(key, (0,) * len(GAUGES)))))
        out.sort(key=lambda row: row[0])
        out.append((OTHER, other_counters, other_gauges))
        self._scraped = totals
        return out

    def _rerank(
        self, totals: Mapping[str, Sequence[int]], gauges: Mapping[str, Sequence[int]]
    ) -> None:
        """Choose the exported keys: turn by turn the most active publisher,
        receiver, dropper and deepest queue since the last ranking, then the
        current members, up to ``top``."""
        ranked = self._ranked

        def recent(key: str, field: int) -> int:
            before = ranked.get(key)
            return totals[key][field] - (before[field] if before is not None else 0)

        def ladder(score: dict[str, int]) -> list[str]:
            return sorted((k for k, v in score.items() if v > 0), key=lambda k: (-score[k], k))

        ladders = [
            ladder({k: recent(k, 0) for k in totals}),  # publishers
            ladder({k: recent(k, 4) + recent(k, 5) for k in totals}),  # droppers
            ladder({k: g[1] for k, g in gauges.items()}),  # deepest queues (bytes)
            ladder({k: recent(k, 1) for k in totals}),  # receivers
        ]
        chosen: dict[str, None] = {}
        depth = 0
        while len(chosen) < self.top and any(depth < len(lad) for lad in ladders):
            for lad in ladders:
                if depth < len(lad) and len(chosen) < self.top:
                    chosen.setdefault(lad[depth])
            depth += 1
        for key in sorted(self._base):  # keep quiet members while there is room
            if len(chosen) >= self.top:
                break
            if key in totals:
                chosen.setdefault(key)
        for key in sorted(totals):  # then anyone live, so a quiet bus still shows who is there
            if len(chosen) >= self.top:
                break
            if key in gauges:
                chosen.setdefault(key)
        for key in [k for k in self._base if k not in chosen]:
            del self._base[key]
            _add(self._left, self._shown.pop(key, _ZERO))
        for key in chosen:
            if key not in self._base:
                now, before = totals.get(key, _ZERO), self._scraped.get(key, _ZERO)
                self._base[key] = [min(a, b) for a, b in zip(now, before, strict=True)]
        self._ranked = {k: list(v) for k, v in totals.items()}
