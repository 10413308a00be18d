"""NATS -> bus: which messages from other hosts this host takes, once, in order, as sbus packets.

What it owns: the subject -> key cache, the import filter, the rule for
identities on the way in, the size bound, one copy per host (asking
``Subscriptions``), handing messages with an envelope to ``Origins`` (each
origin's order, refusals and losses: ``protocol.natsorigins``) and taking
back what it releases, and its own counters.  What it may touch: the
``BusWriter`` it is given (the link's thread only), the callable that takes
the messages of the link's own subscriptions (interest, snapshots, counts),
and the one that runs a function at the next turn of the link's loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sbus_relay.accel import load_compiled
from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import UsageError
from sbus_relay.protocol.keys import is_secret
from sbus_relay.protocol.limits import MATCH_CACHE_KEY_MAX, MAX_PACKET
from sbus_relay.protocol.natsmap import MappingError, SubjectMap, split_long
from sbus_relay.protocol.natsorigins import FIRST, Origins

from .engine import Envelope
from .outbound import MAPPING_CACHE, key_filter
from .subscriptions import FIRST_PATTERN_SID, LONG_SID, Subscriptions
from .tobus import BusWriter

#: What becomes of a subject's messages: the packet head to deliver them with
#: (or the reason they are dropped), the sid of the subscription whose copy is
#: taken (0: none), whether it is delivered (False: counted only, its
#: subscription in its grace), and the subscriptions that match it.
Decision = tuple[bytes | str, int, bool, Any]


class Inbound:
    """Messages from NATS to the bus.  What becomes of a subject is worked out
    once (mapping, filters, which subscription's copy) and kept, so a message
    costs one lookup."""

    __slots__ = (
        "_control", "_decided", "_identity", "_import", "_now", "_releasing", "_soon", "_subs",
        "_version", "_writer", "drops", "map", "origins", "received", "received_bytes",
    )  # fmt: skip

    def __init__(
        self,
        map_: SubjectMap,
        import_: list[bytes],
        identity: bytes | None,
        subs: Subscriptions,
        writer: BusWriter,
        control: Callable[[int, bytes, Envelope, bytes], None],
        origins: Origins,
        soon: Callable[[Callable[[], None]], Any],
    ) -> None:
        self.map = map_
        #: where the messages of the link's own subscriptions go (interest, snapshots, counts)
        self._control = control
        self._import = key_filter(import_)
        self._identity = identity
        self._subs = subs
        self._writer = writer
        #: each origin's order and losses (fleet: ``protocol.natsorigins``)
        self.origins = origins
        self._soon = soon
        self._releasing = False
        self._now = 0.0
        self._decided: dict[bytes, Decision] = {}
        self._version = subs.version
        self.received = self.received_bytes = 0
        self.drops = dict.fromkeys(
            ("not_imported", "secret", "bus_full", "bad_subject", "too_large"), 0
        )

    def message(self, sid: int, subject: bytes, envelope: Envelope, payload: bytes) -> None:
        """One message from NATS on subscription ``sid``, with its envelope."""
        if sid < FIRST_PATTERN_SID and sid != LONG_SID:
            self._control(sid, subject, envelope, payload)
            return
        holders: Any = None
        deliver = True
        if sid == LONG_SID:
            got = split_long(payload)
            if got is None:
                self.drops["bad_subject"] += 1
                return
            head = self._decide_key(got[0])
            payload = got[1]
        else:
            if self._version != self._subs.version:
                self._decided.clear()  # which copy to take may have changed
                self._version = self._subs.version
            known = self._decided.get(subject)
            decided = self._decide(subject) if known is None else known
            if decided[1] != sid:
                return  # the same message through another subscription of ours
            head, _, deliver, holders = decided
        if isinstance(head, str):
            self.drops[head] += 1
            return
        if envelope is not None:  # another host's: held, released in its origin's order
            if not self._releasing:
                self._now = time.time()  # (once a turn of the loop: they arrive together)
            held = self.origins.arrive(envelope, holders, deliver, (head, payload), self._now)
            if held == FIRST and not self._releasing:
                self._releasing = True
                self._soon(self.release)
            return
        if deliver:
            self._put(head, payload)  # a native NATS client's: nothing to check

    def count(self, envelope: Envelope, payload: bytes) -> None:
        """Another host's count of what it sent us (``natsledger``): held with
        the data and released in its place."""
        if self.origins.count(envelope, payload, time.time()) == FIRST and not self._releasing:
            self._releasing = True
            self._soon(self.release)

    def release(self) -> None:
        """Deliver what ``Origins`` held, in each origin's order (called once
        the engine has handed over what it read, at the next turn of the loop)."""
        self._releasing = False
        for head, payload in self.origins.release(time.time()):
            self._put(head, payload)

    def _put(self, head: bytes, payload: bytes) -> None:
        if len(head) + len(payload) > MAX_PACKET:
            self.drops["too_large"] += 1  # (a native NATS client's big payload)
            return
        if self._writer.put(head, payload):
            self.received += 1
            self.received_bytes += len(payload)
        else:
            self.drops["bus_full"] += 1

    def _decide(self, subject: bytes) -> Decision:
        try:
            key = self.map.key(subject)
        except MappingError:
            # counted once, by the subscription that would take it
            other = self.map.lenient_key(subject)
            taker = self._subs.decide(other) if other is not None else None
            decided: Decision = ("bad_subject", taker[0] if taker else 0, False, None)
        else:
            head = self._decide_key(key)
            taker = self._subs.decide(key)
            if taker is None:
                decided = (head, 0, False, None)  # an ended subscription's: nobody's
            else:
                decided = (head, taker[0], taker[1], taker[2])
        if len(subject) <= MATCH_CACHE_KEY_MAX:  # a long subject is worked out afresh
            if len(self._decided) >= MAPPING_CACHE:
                self._decided.clear()
            self._decided[subject] = decided
        return decided

    def _decide_key(self, key: bytes) -> bytes | str:
        """The packet head of a message from another host for this host's bus,
        or why it is dropped (once per host)."""
        if is_secret(key):
            # only to this host's own identities, and only when they cross
            if self._identity is None or not key.startswith(self._identity):
                return "secret"
        elif self._import is not None and not self._import.match(key):
            return "not_imported"
        try:
            return codec.msg_head(key)
        except UsageError:
            return "bad_subject"  # a key with a NUL: no sbus key is


load_compiled(globals(), "sbus_relay.link._c_inbound")
