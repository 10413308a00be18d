"""NATS -> bus: which messages from other hosts this host takes, once, as sbus packets.

What it owns: the subject -> key cache, the import filter, the rule for
identities on the way in, the size bound, one copy per host (asking
``Subscriptions``), and its own counters.  What it may touch: the
``BusWriter`` it is given (the link's thread only), and the callable that
takes the messages of the link's own subscriptions (interest, snapshots).
"""

from __future__ import annotations

from collections.abc import Callable

from sbus_relay.accel import load_compiled
from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import UsageError
from sbus_relay.protocol.keys import is_secret
from sbus_relay.protocol.limits import MATCH_CACHE_KEY_MAX, MAX_PACKET
from sbus_relay.protocol.natsmap import MappingError, SubjectMap, split_long

from .engine import Headers
from .outbound import MAPPING_CACHE, key_filter
from .subscriptions import FIRST_PATTERN_SID, LONG_SID, Subscriptions
from .tobus import BusWriter

#: What becomes of a subject's messages: the packet head to deliver them
#: with and the subscription whose copy is taken, or the reason they are dropped.
Decision = tuple[bytes, int] | str


class Inbound:
    """Messages from NATS to the bus.  What becomes of a subject is worked out
    once (mapping, filters, which subscription's copy) and kept, so a message
    costs one lookup."""

    __slots__ = (
        "_control", "_decided", "_identity", "_import", "_subs", "_version", "_writer", "drops",
        "map",
        "received", "received_bytes",
    )  # fmt: skip

    def __init__(
        self,
        map_: SubjectMap,
        import_: list[bytes],
        identity: bytes | None,
        subs: Subscriptions,
        writer: BusWriter,
        control: Callable[[int, bytes, bytes], None],
    ) -> None:
        self.map = map_
        #: where the messages of the link's own subscriptions go (interest, snapshots)
        self._control = control
        self._import = key_filter(import_)
        self._identity = identity
        self._subs = subs
        self._writer = writer
        self._decided: dict[bytes, Decision] = {}
        self._version = subs.version
        self.received = self.received_bytes = 0
        self.drops = dict.fromkeys(
            ("not_imported", "secret", "bus_full", "bad_subject", "too_large"), 0
        )

    def message(self, sid: int, subject: bytes, headers: Headers, payload: bytes) -> None:
        """One message from NATS on subscription ``sid``."""
        if sid < FIRST_PATTERN_SID and sid != LONG_SID:
            self._control(sid, subject, payload)
            return
        if sid == LONG_SID:
            got = split_long(payload)
            if got is None:
                self.drops["bad_subject"] += 1
                return
            decided = self._decide_key(got[0])
            payload = got[1]
            if isinstance(decided, str):
                self.drops[decided] += 1
                return
        else:
            if self._version != self._subs.version:
                self._decided.clear()  # which copy to take may have changed
                self._version = self._subs.version
            known = self._decided.get(subject)
            decided = self._decide(subject) if known is None else known
            if isinstance(decided, str):
                self.drops[decided] += 1
                return
            if decided[1] != sid:
                return  # the same message through another subscription of ours
        if len(decided[0]) + len(payload) > MAX_PACKET:
            self.drops["too_large"] += 1  # (a native NATS client's big payload)
            return
        if self._writer.put(decided[0], payload):
            self.received += 1
            self.received_bytes += len(payload)
        else:
            self.drops["bus_full"] += 1

    def _decide(self, subject: bytes) -> Decision:
        try:
            key = self.map.key(subject)
        except MappingError:
            decided: Decision = "bad_subject"
        else:
            decided = self._decide_key(key)
            if not isinstance(decided, str):
                decided = (decided[0], self._subs.taker(key))
        if len(subject) <= MATCH_CACHE_KEY_MAX:  # a long subject is worked out afresh
            if len(self._decided) >= MAPPING_CACHE:
                self._decided.clear()
            self._decided[subject] = decided
        return decided

    def _decide_key(self, key: bytes) -> Decision:
        """A message from another host for this host's bus (once per host)?"""
        if is_secret(key):
            # only to this host's own identities, and only when they cross
            if self._identity is None or not key.startswith(self._identity):
                return "secret"
        elif self._import is not None and not self._import.match(key):
            return "not_imported"
        try:
            return codec.msg_head(key), 0
        except UsageError:
            return "bad_subject"  # a key with a NUL: no sbus key is


load_compiled(globals(), "sbus_relay.link._c_inbound")
