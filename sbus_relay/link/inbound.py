"""NATS -> bus: which messages from other hosts this host takes, once, as sbus packets.

What it owns: the subject -> key cache, the import filter, the rule for
identities on the way in, the size bound, one copy per host (asking
``Subscriptions``), and its own counters.  What it may touch: the
``BusWriter`` it is given (the link's thread only).
"""

from __future__ import annotations

from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import UsageError
from sbus_relay.protocol.keys import is_secret
from sbus_relay.protocol.limits import MATCH_CACHE_KEY_MAX, MAX_PACKET
from sbus_relay.protocol.natsmap import MappingError, SubjectMap, split_long

from .engine import Headers
from .outbound import MAPPING_CACHE, key_filter
from .subscriptions import LONG_SID, Subscriptions
from .tobus import BusWriter

#: Bytes of an sbus packet beyond its key and payload: "MSG " and the NUL.
PACKET_OVERHEAD = 5


class Inbound:
    """Messages from NATS to the bus."""

    def __init__(
        self,
        map_: SubjectMap,
        import_: list[bytes],
        identity: bytes | None,
        subs: Subscriptions,
        writer: BusWriter,
    ) -> None:
        self.map = map_
        self._import = key_filter(import_)
        self._identity = identity
        self._subs = subs
        self._writer = writer
        self._keys: dict[bytes, bytes] = {}
        self.received = self.received_bytes = 0
        self.not_imported = self.secret = self.bus_full = self.bad_subject = self.too_large = 0

    def message(self, sid: int, subject: bytes, headers: Headers, payload: bytes) -> None:
        """One message from NATS on subscription ``sid``."""
        if sid == LONG_SID:
            got = split_long(payload)
            if got is None:
                self.bad_subject += 1
                return
            self._deliver(got[0], got[1])
            return
        keys = self._keys
        key = keys.get(subject)
        if key is None:
            try:
                key = self.map.key(subject)
            except MappingError:
                self.bad_subject += 1
                return
            if len(key) <= MATCH_CACHE_KEY_MAX:
                if len(keys) >= MAPPING_CACHE:
                    keys.clear()
                keys[subject] = key
        if self._subs.takes(key, sid):
            self._deliver(key, payload)

    def _deliver(self, key: bytes, data: bytes) -> None:
        """A message from another host, for this host's bus (once per host)."""
        if is_secret(key):
            # only to this host's own identities, and only when they cross
            if self._identity is None or not key.startswith(self._identity):
                self.secret += 1
                return
        elif self._import is not None and not self._import.match(key):
            self.not_imported += 1
            return
        if len(key) + len(data) + PACKET_OVERHEAD > MAX_PACKET:
            self.too_large += 1  # (a native NATS client's big payload)
            return
        try:
            packet = codec.encode_msg(key, data)
        except UsageError:
            self.bad_subject += 1  # a key with a NUL (%00): no sbus key is
            return
        if self._writer.put(packet):
            self.received += 1
            self.received_bytes += len(data)
        else:
            self.bus_full += 1
