"""What the hosts on one NATS system want of each other.  No I/O.

What it owns: what the hosts on one NATS system want of each other, and how
they say it.  What it may touch: nothing but its own state.

Theory of operation (docs/nats.md, "Only wanted traffic crosses"): a message
leaves a host only when another host holds a pattern that matches its key,
so every host tells the others the distinct patterns its own clients (and
the relays below it) hold.  Each host publishes, on its own subject
``<prefix>._i.<host>``:

* ``D`` a *delta*: patterns that came (``+``) and went (``-``), in order;
* ``S`` a *snapshot*: every pattern it holds, in parts of at most
  ``ANNOUNCE_BYTES``, the last part flagged;
* ``H`` a *heartbeat* every ``HEARTBEAT`` seconds, saying where it is;
* ``B`` *goodbye* when its link closes for good.

Every message carries the sender's incarnation (when its link started, in
nanoseconds: a newer link of the same host supersedes an older one, as in a
live upgrade, where both talk for a moment) and a sequence number that each
delta raises by one.  NATS carries one
publisher's messages in order but may lose them (core NATS is at most once:
a reconnect, a slow consumer), so a receiver that sees a gap, an unknown
host or a new incarnation asks for a snapshot (``<prefix>._q``, naming the
host, or empty for every host) and keeps its old view until it comes.  A host
not heard from for ``HOST_SILENT`` seconds is *silent*: nothing is sent to it
any more, but what would have been is still counted for it
(``protocol.natsledger``), so that a partition's loss shows on its first count
after the heal; a host silent ``SILENT_KEEP`` seconds more is forgotten.

``RemoteInterest`` keeps the views and the union of everyone's patterns;
what it returns are the union's changes, which the bus applies to the link's
holds in its subscription index; its *watchers* (``HostWatcher``) hear of each
host's own changes.  ``LocalInterest`` is the sending side.

Whatever any NATS client publishes under the prefix lands here, so every
store is bounded: hosts (``HOSTS_MAX``), patterns per host and in all
(``HOST_PATTERNS_MAX``, ``PATTERNS_MAX``, ``PATTERN_BYTES_MAX``), snapshot
requests asked (``ASKED_MAX``) and answered (``ANSWER_INTERVAL``); what is
refused is counted (``refused``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .keys import BANG, CRED, is_secret
from .limits import MAX_PATTERN_LENGTH, MAX_PATTERNS_PER_RELAY

#: Bytes of patterns in one announcement: well below NATS's default
#: max_payload (1 MiB), so a snapshot of any size goes in parts.
ANNOUNCE_BYTES = 64 * 1024
#: Seconds between two heartbeats of a host: how soon a lost delta is noticed
#: when nothing else is said.
HEARTBEAT = 2.0
#: Seconds without a word after which a host is taken as gone (three
#: heartbeats missed): what it wanted stops attracting traffic.
HOST_SILENT = 3 * HEARTBEAT
#: Seconds a silent host's patterns are still counted for it (not sent):
#: the loss of a partition up to this long is counted whole once it heals.
SILENT_KEEP = 120.0
#: Seconds between two snapshot requests for one host: a host that is slow to
#: answer is not flooded with requests.
SNAPSHOT_RETRY = 1.0
#: Hosts whose last snapshot request is remembered (unknown names included:
#: anyone may announce under any name); beyond it no more are asked for.
ASKED_MAX = 8192
#: Seconds between two snapshots this host publishes when asked: a flood of
#: requests costs one snapshot per interval (answered at its end), not one each.
ANSWER_INTERVAL = 0.25
#: Longest host name taken (bytes of UTF-8), as in an envelope (a DNS name's limit).
HOST_NAME_MAX = 255
#: Numbers of an announcement are below this (as in an envelope).
NUMBER_END = 1 << 62

#: Distinct patterns one other host may hold here: as many as one relay may
#: hold at its master (the patterns of a whole host); beyond it its
#: announcements' further patterns are refused (counted), never stored.
HOST_PATTERNS_MAX = MAX_PATTERNS_PER_RELAY
#: Other hosts kept at once: announcements from more are refused (counted).
HOSTS_MAX = 4096
#: Distinct patterns of all other hosts together, being collected included,
#: and their bytes: what a flood of forged snapshots can pin at most.
PATTERNS_MAX = 2 * MAX_PATTERNS_PER_RELAY
PATTERN_BYTES_MAX = 256 * 1024 * 1024

Change = tuple[bool, bytes]  # (present, pattern)


@dataclass
class Announcement:
    kind: str  # "D", "S", "H", "B"
    incarnation: int
    seq: int = 0
    part: int = 0
    last: bool = True
    changes: list[Change] = field(default_factory=list)


def encode(a: Announcement) -> bytes:
    """One announcement as a NATS payload (patterns never hold a NUL)."""
    head = b"%s %d %d %d %d\n" % (a.kind.encode(), a.incarnation, a.seq, a.part, a.last)
    return head + b"".join((b"+" if p else b"-") + pat + b"\0" for p, pat in a.changes)


def decode(payload: bytes) -> Announcement | None:
    """An announcement, or None for a payload that is not one."""
    head, nl, body = payload.partition(b"\n")
    fields = head.split(b" ")
    if not nl or len(fields) != 5 or fields[0] not in (b"D", b"S", b"H", b"B"):
        return None
    try:
        inc, seq, part, last = (int(f) for f in fields[1:])
    except ValueError:
        return None
    if not (0 <= inc < NUMBER_END and 0 <= seq < NUMBER_END and 0 <= part < NUMBER_END):
        return None
    changes: list[Change] = []
    if body:
        if not body.endswith(b"\0"):
            return None
        for item in body[:-1].split(b"\0"):
            if not item or item[0] not in b"+-":
                return None
            changes.append((item[0] == 0x2B, item[1:]))
    return Announcement(fields[0].decode(), inc, seq, part, bool(last), changes)


def host_identity(host: str) -> bytes:
    """The prefix of every identity of ``host`` when identities cross hosts:
    one ``!/cred/0/0/<n>/`` group standing for it, as a relay's own identity
    heads its clients' (docs/relays.md).  A group's fields are digits (the
    protocol's key grammar), so ``n`` is the first 64 bits of the name's
    SHA-256: every host works out every other host's group from its name."""
    n = int.from_bytes(hashlib.sha256(host.encode("utf-8")).digest()[:8], "big")
    return CRED + b"0/0/%d/" % n


def acceptable(pattern: bytes, *, owner: bytes | None = None) -> bool:
    """A pattern a host may hold: not too long, no reserved '!', and secret
    only below ``owner``, that host's own identities (``host_identity``;
    None: identities do not cross)."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        return False
    if is_secret(pattern):
        return owner is not None and pattern.startswith(owner)
    return BANG not in pattern or b"!" not in pattern.split(b"/")


def parts(incarnation: int, seq: int, kind: str, changes: list[Change]) -> list[Announcement]:
    """``changes`` in announcements of at most ``ANNOUNCE_BYTES`` each (one at least)."""
    out: list[Announcement] = []
    chunk: list[Change] = []
    size = 0
    for change in changes:
        if chunk and size + len(change[1]) + 2 > ANNOUNCE_BYTES:
            out.append(Announcement(kind, incarnation, seq, len(out), False, chunk))
            chunk, size = [], 0
        chunk.append(change)
        size += len(change[1]) + 2
    out.append(Announcement(kind, incarnation, seq, len(out), True, chunk))
    return out


class LocalInterest:
    """The patterns this host announces, with its incarnation and sequence."""

    def __init__(self, incarnation: int | None = None) -> None:
        # the start time: a newer link of a host (a restart, a live upgrade's new
        # process) supersedes an older one whatever order their words arrive in
        self.incarnation = incarnation if incarnation is not None else time.time_ns()
        self.seq = 0
        self.patterns: set[bytes] = set()
        self._pending: dict[bytes, bool] = {}
        #: when a snapshot was last published (``answer``)
        self._answered = -ANSWER_INTERVAL

    def change(self, pattern: bytes, present: bool) -> None:
        """A pattern came or went (coalesced until ``delta``)."""
        if present == (pattern in self.patterns):
            return
        if present:
            self.patterns.add(pattern)
        else:
            self.patterns.discard(pattern)
        if pattern in self._pending:
            del self._pending[pattern]  # came and went: nothing to say
        else:
            self._pending[pattern] = present

    def delta(self) -> list[Announcement]:
        """The changes since the last delta, as announcements (each a sequence number)."""
        if not self._pending:
            return []
        changes = list(self._pending.items())
        self._pending.clear()
        out = []
        for a in parts(self.incarnation, 0, "D", [(p, pat) for pat, p in changes]):
            self.seq += 1
            a.seq, a.part, a.last = self.seq, 0, True
            out.append(a)
        return out

    def snapshot(self) -> list[Announcement]:
        """Everything held now.  Pending changes are part of it, under a
        sequence number of their own: the number a receiver's view carries
        then says exactly which patterns it holds (``natsledger`` counts by it)."""
        if self._pending:
            self._pending.clear()
            self.seq += 1
        return parts(self.incarnation, self.seq, "S", [(True, p) for p in sorted(self.patterns)])

    def answer(self, now: float) -> float:
        """A snapshot was asked for: 0 to publish it now, else the seconds to
        wait before one that answers every request meanwhile."""
        wait = self._answered + ANSWER_INTERVAL - now
        if wait > 0:
            return wait
        self._answered = now
        return 0.0

    def heartbeat(self) -> Announcement:
        return Announcement("H", self.incarnation, self.seq)

    def goodbye(self) -> Announcement:
        return Announcement("B", self.incarnation, self.seq)

    # --- a live upgrade: the link's hand-over (docs/nats.md, "How it is built") ---

    def export(self) -> dict[str, Any]:
        """What it announced and what it owes, as plain data (``restore`` takes it)."""
        return {
            "incarnation": self.incarnation,
            "seq": self.seq,
            "patterns": [_text(p) for p in sorted(self.patterns)],
            "pending": [[_text(p), present] for p, present in self._pending.items()],
            "answered": self._answered,
        }

    def restore(self, record: Mapping[str, Any]) -> None:
        """Go on from an earlier link's ``export`` under the same incarnation:
        its announcements' sequence goes on, so the other hosts see one host."""
        if record.get("incarnation") != self.incarnation:
            raise ValueError("an announcement sequence goes on only under the same incarnation")
        self.seq = int(record["seq"])
        self.patterns = {_raw(p) for p in record["patterns"]}
        self._pending = {_raw(p): bool(present) for p, present in record["pending"]}
        self._answered = float(record["answered"])


class HostWatcher(Protocol):
    """What hears of each other host's own changes (``RemoteInterest(watchers=...)``)."""

    def view(self, host: str, incarnation: int, seq: int) -> None:
        """``host``'s view now follows its announcement ``seq`` of ``incarnation``
        (a new host, a new incarnation, a snapshot or a delta taken)."""

    def pattern(self, host: str, present: bool, pattern: bytes) -> None:
        """``host`` came to hold, or let go of, ``pattern``."""

    def silent(self, host: str) -> None:
        """``host`` has not been heard for ``HOST_SILENT`` seconds."""

    def heard(self, host: str) -> None:
        """A silent ``host`` is heard again."""

    def gone(self, host: str) -> None:
        """``host`` is forgotten (goodbye, or silent too long); its patterns went first."""


@dataclass
class _View:
    incarnation: int
    seq: int
    patterns: set[bytes]
    heard: float
    #: a snapshot being received: (incarnation, seq, next part, patterns so far)
    collecting: tuple[int, int, int, set[bytes]] | None = None
    #: not heard for HOST_SILENT seconds: its patterns are counted, not sent to
    silent: bool = False


def _weight(patterns: set[bytes]) -> tuple[int, int]:
    return len(patterns), sum(map(len, patterns))


class RemoteInterest:
    """Every other host's patterns, and their union (what may leave this host)."""

    def __init__(
        self,
        *,
        secrets: bool = False,
        always: tuple[bytes, ...] = (),
        watchers: tuple[HostWatcher, ...] = (),
    ) -> None:
        self.secrets = secrets
        self.watchers = watchers
        self.hosts: dict[str, _View] = {}
        #: pattern -> how many hosts hold it (the ``always`` patterns one more:
        #: published whoever wants them, for NATS clients that are not hosts)
        self.union: dict[bytes, int] = dict.fromkeys(always, 1)
        self.always = always
        #: host -> when a snapshot was last asked of it
        self._asked: dict[str, float] = {}
        #: announcements (and patterns) refused: malformed, not acceptable, over a bound
        self.refused = 0
        #: patterns stored in every view and snapshot being collected, and their bytes
        self.stored = 0
        self.stored_bytes = 0

    @property
    def live(self) -> int:
        """Other hosts heard from lately (the silent ones are not)."""
        return sum(1 for v in self.hosts.values() if not v.silent)

    def initial(self) -> list[Change]:
        """The union before any host is heard: the ``always`` patterns."""
        return [(True, p) for p in self.always]

    def _owner(self, host: str) -> bytes | None:
        """Where ``host``'s secret patterns must lie: below its own identities."""
        return host_identity(host) if self.secrets else None

    def _store(self, pattern: bytes) -> bool:
        """Room for one more stored pattern (counted if not)."""
        if self.stored >= PATTERNS_MAX or self.stored_bytes + len(pattern) > PATTERN_BYTES_MAX:
            self.refused += 1
            return False
        self.stored += 1
        self.stored_bytes += len(pattern)
        return True

    def _free(self, patterns: set[bytes]) -> None:
        n, size = _weight(patterns)
        self.stored -= n
        self.stored_bytes -= size

    def receive(self, host: str, a: Announcement, now: float) -> tuple[list[Change], bool]:
        """Take one announcement of ``host``: the union's changes, and whether
        a snapshot of that host should be asked for now."""
        if not host or len(host.encode("utf-8", "replace")) > HOST_NAME_MAX:
            self.refused += 1
            return [], False
        view = self.hosts.get(host)
        if view is not None and a.incarnation < view.incarnation:
            if not view.silent or a.kind == "B":
                return [], False  # an older link of that host, still talking: superseded
            # the newer one fell silent (a forged announcement, or a new process
            # that never came up) while this one talks: this one is the host
            self._free_view(view)
            forgotten = self._replace(host, None)
            changes, ask = self.receive(host, a, now)
            return forgotten + changes, ask
        if a.kind == "B":
            if view is not None and view.incarnation == a.incarnation:
                self._free_view(view)
                return self._replace(host, None), False
            return [], False
        if a.kind == "S":
            return self._snapshot_part(host, view, a, now)
        if view is None or view.incarnation != a.incarnation:
            return [], self._ask(host, now)
        self._heard(host, view, now)
        if a.kind == "H":
            return [], a.seq != view.seq and self._ask(host, now)
        if a.seq <= view.seq:
            return [], False  # an old one
        if a.seq != view.seq + 1:
            return [], self._ask(host, now)  # a gap: something was lost
        view.seq = a.seq
        for w in self.watchers:
            w.view(host, view.incarnation, view.seq)
        out: list[Change] = []
        for present, pattern in a.changes:
            if not acceptable(pattern, owner=self._owner(host)):
                self.refused += 1
                continue
            if present and pattern not in view.patterns:
                if len(view.patterns) >= HOST_PATTERNS_MAX or not self._store(pattern):
                    self.refused += 1
                    continue
                view.patterns.add(pattern)
                self._tell(host, True, pattern)
                out.extend(self._count(pattern, 1))
            elif not present and pattern in view.patterns:
                view.patterns.discard(pattern)
                self.stored -= 1
                self.stored_bytes -= len(pattern)
                self._tell(host, False, pattern)
                out.extend(self._count(pattern, -1))
        return out, False

    def _heard(self, host: str, view: _View, now: float) -> None:
        view.heard = now
        if view.silent:
            view.silent = False
            for w in self.watchers:
                w.heard(host)

    def _tell(self, host: str, present: bool, pattern: bytes) -> None:
        for w in self.watchers:
            w.pattern(host, present, pattern)

    def _snapshot_part(
        self, host: str, view: _View | None, a: Announcement, now: float
    ) -> tuple[list[Change], bool]:
        if view is None:
            if len(self.hosts) >= HOSTS_MAX:
                self.refused += 1
                return [], False
            view = self.hosts[host] = _View(a.incarnation, -1, set(), now)
        self._heard(host, view, now)
        got = view.collecting
        if a.part == 0:
            if got is not None:
                self._free(got[3])
            got = (a.incarnation, a.seq, 0, set())
        elif got is None or got[:3] != (a.incarnation, a.seq, a.part):
            if got is not None:
                self._free(got[3])
            view.collecting = None
            return [], self._ask(host, now)  # a part went missing
        patterns = got[3]
        for present, pattern in a.changes:
            wanted = present and acceptable(pattern, owner=self._owner(host))
            if wanted and pattern in patterns:
                continue
            if wanted and len(patterns) < HOST_PATTERNS_MAX and self._store(pattern):
                patterns.add(pattern)
            elif present:
                self.refused += 1
        if not a.last:
            view.collecting = (a.incarnation, a.seq, a.part + 1, patterns)
            return [], False
        view.collecting = None
        self._asked.pop(host, None)
        self._free(view.patterns)
        changes = self._replace(host, _View(a.incarnation, a.seq, patterns, now))
        return changes, False

    def _free_view(self, view: _View) -> None:
        """Its patterns (and a snapshot it was collecting) leave the store's count."""
        self._free(view.patterns)
        if view.collecting is not None:
            self._free(view.collecting[3])
            view.collecting = None

    def _replace(self, host: str, new: _View | None) -> list[Change]:
        """``host``'s view becomes ``new`` (None: forgotten); the store's count
        of the old view's patterns is the caller's to drop first."""
        old = self.hosts.pop(host, None)
        before = old.patterns if old is not None else set()
        after = new.patterns if new is not None else set()
        if new is not None:
            self.hosts[host] = new
            for w in self.watchers:
                w.view(host, new.incarnation, new.seq)
        out: list[Change] = []
        for pattern in before - after:
            self._tell(host, False, pattern)
            out.extend(self._count(pattern, -1))
        for pattern in after - before:
            self._tell(host, True, pattern)
            out.extend(self._count(pattern, 1))
        if new is None and old is not None:
            if old.collecting is not None:
                self._free(old.collecting[3])
            for w in self.watchers:
                w.gone(host)
        return out

    def _count(self, pattern: bytes, step: int) -> list[Change]:
        n = self.union.get(pattern, 0) + step
        if n:
            self.union[pattern] = n
        else:
            del self.union[pattern]
        if step > 0 and n == 1:
            return [(True, pattern)]
        if step < 0 and n == 0:
            return [(False, pattern)]
        return []

    def _ask(self, host: str, now: float) -> bool:
        last = self._asked.get(host)
        if last is not None and now - last < SNAPSHOT_RETRY:
            return False
        if last is None and len(self._asked) >= ASKED_MAX:
            for h in [h for h, t in self._asked.items() if now - t >= SNAPSHOT_RETRY]:
                del self._asked[h]
            if len(self._asked) >= ASKED_MAX:
                self.refused += 1  # a flood of names: asked of none of them for now
                return False
        self._asked[host] = now
        return True

    # --- a live upgrade: the link's hand-over ---------------------------------------

    def export(self) -> dict[str, Any]:
        """Every other host's view, as plain data (``restore`` takes it).  A
        snapshot being collected is left out: its host is asked again."""
        return {
            "hosts": {
                host: [v.incarnation, v.seq, [_text(p) for p in sorted(v.patterns)], v.heard,
                       v.silent]
                for host, v in self.hosts.items()
            },
            "always": [_text(p) for p in self.always],
            "refused": self.refused,
        }  # fmt: skip

    def restore(self, record: Mapping[str, Any]) -> list[Change]:
        """Take up an earlier link's views (before any announcement is taken here):
        the watchers hear of every host as if it had announced itself, and the
        union's changes returned are only those from the earlier link's union (its
        holds in the bus's index) to this one's: the ``always`` patterns that a new
        setting added or took away."""
        self.refused = int(record.get("refused", 0))
        for host, (incarnation, seq, patterns, heard, silent) in dict(record["hosts"]).items():
            if host in self.hosts or len(self.hosts) >= HOSTS_MAX:
                continue
            view = _View(int(incarnation), int(seq), set(), float(heard), silent=bool(silent))
            self.hosts[host] = view
            for w in self.watchers:
                w.view(host, view.incarnation, view.seq)
            for text in patterns:
                pattern = _raw(text)
                if len(view.patterns) >= HOST_PATTERNS_MAX or not self._store(pattern):
                    continue
                view.patterns.add(pattern)
                self._tell(host, True, pattern)
                self._count(pattern, 1)
            if view.silent:
                for w in self.watchers:
                    w.silent(host)
        before = {_raw(p) for p in record.get("always", ())}
        for view in self.hosts.values():
            before |= view.patterns
        after = set(self.union)
        return [(True, p) for p in sorted(after - before)] + [
            (False, p) for p in sorted(before - after)
        ]

    def expire(self, now: float) -> list[Change]:
        """Hosts not heard from for ``HOST_SILENT`` seconds fall silent; those
        silent ``SILENT_KEEP`` seconds more are forgotten."""
        out: list[Change] = []
        for host, view in list(self.hosts.items()):
            quiet = now - view.heard
            if quiet > HOST_SILENT + SILENT_KEEP:
                self._free_view(view)
                out.extend(self._replace(host, None))
                self._asked.pop(host, None)
            elif quiet > HOST_SILENT and not view.silent:
                view.silent = True
                if view.collecting is not None:
                    self._free(view.collecting[3])
                    view.collecting = None
                for w in self.watchers:
                    w.silent(host)
        for host in [h for h, t in self._asked.items() if now - t > HOST_SILENT]:
            if host not in self.hosts:
                del self._asked[host]
        return out


def _text(pattern: bytes) -> str:
    """A pattern in a hand-over record (JSON): every byte but NUL, as latin-1."""
    return pattern.decode("latin-1")


def _raw(text: str) -> bytes:
    return text.encode("latin-1")
