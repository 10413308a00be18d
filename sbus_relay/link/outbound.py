"""Bus -> NATS: which of the bus's messages leave this host, and on which subject.

What it owns: the export filter, the rule for identities on the way out, the
key -> subject cache and the long-key subject; its own counters.  What it may
touch: the ``Ledger`` it is given (each message's number and envelope,
counted for the hosts that want it: ``protocol.natsledger``); nothing else (it
returns what to publish; the bridge hands it to the engine).  On every
message's way: compiled where a compiler is (``sbus_relay.accel``,
``_c_outbound.pxd``), the pure-Python path kept.
"""

from __future__ import annotations

from sbus_relay.accel import load_compiled
from sbus_relay.protocol import linkwire
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.keys import is_secret
from sbus_relay.protocol.limits import MATCH_CACHE_KEY_MAX
from sbus_relay.protocol.natsledger import Ledger
from sbus_relay.protocol.natsmap import SubjectMap, long_payload

from .engine import Outgoing

#: Longest subject published: NATS's default max_control_line is 4096 bytes
#: and the PUB line holds the subject, the size and a few bytes more.  A key
#: whose subject is longer goes on ``<prefix>._l`` with the key in the payload.
SUBJECT_MAX = 4000
#: Keys (and subjects) whose mapping is kept: most traffic repeats a few keys,
#: and mapping one costs a pass over its bytes in Python.
MAPPING_CACHE = 4096


def key_filter(patterns: tuple[bytes, ...] | list[bytes]) -> SubscriptionIndex | None:
    """An index of ``patterns`` to match keys against (None: every public key)."""
    if tuple(patterns) == (b"",):
        return None
    index: SubscriptionIndex = SubscriptionIndex()
    for p in patterns:
        index.add(0, p)
    return index


class Outbound:
    """Messages from the bus as (subject, envelope, payload) for NATS.  What
    becomes of a key is worked out once and kept (a subject, or the reason it
    stays home), so a message costs one lookup."""

    def __init__(
        self, map_: SubjectMap, export: list[bytes], identity: bytes | None, ledger: Ledger
    ) -> None:
        self.map = map_
        self.ledger = ledger
        self._export = key_filter(export)
        #: the prefix of this host's identities when they cross (None: they stay home)
        self._identity = identity
        self._decided: dict[bytes, bytes | str] = {}
        self._long = map_.long
        self.drops = {"not_exported": 0, "secret": 0}
        #: bytes of the payloads handed over to be published
        self.payload_bytes = 0

    def take(self, out: list[Outgoing], packet: bytes) -> bool:
        """Each message of ``packet`` (a ``MSG`` or a packed batch) as ``add``
        does; False (nothing done) for any other packet.  ``PeerError`` if it
        is malformed (nothing of it is taken)."""
        got = linkwire.messages(packet)
        if got is None:
            return False
        keys, payloads = got
        for i in range(len(keys)):
            self.add(out, keys[i], payloads[i])
        return True

    def add(self, out: list[Outgoing], key: bytes, payload: bytes) -> None:
        """Append ``key``'s message to ``out`` if it may leave this host, with
        its envelope (its number, counted for every host that wants it; none:
        only silent hosts want it, counted for them and not published)."""
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decide(key)
        if isinstance(decided, str):
            self.drops[decided] += 1
        elif len(decided) <= SUBJECT_MAX:
            seq = self.ledger.stamp(key)
            if seq:
                out.append((decided, self.ledger.value(seq), payload))
                self.payload_bytes += len(payload)
        else:  # every host takes these and its bus keeps what it wants
            seq = self.ledger.stamp_long()
            if seq:
                payload = long_payload(key, payload)
                out.append((self._long, self.ledger.value(seq), payload))
                self.payload_bytes += len(payload)

    def _decide(self, key: bytes) -> bytes | str:
        decided: bytes | str
        if is_secret(key) and (self._identity is None or key.startswith(self._identity)):
            # to another host's identity (held here only for its owner), or never
            decided = "secret"
        elif not is_secret(key) and self._export is not None and not self._export.match(key):
            decided = "not_exported"
        else:
            decided = self.map.subject(key)
        if len(key) <= MATCH_CACHE_KEY_MAX:  # a long key is worked out afresh, not kept
            if len(self._decided) >= MAPPING_CACHE:
                self._decided.clear()
            self._decided[key] = decided
        return decided


load_compiled(globals(), "sbus_relay.link._c_outbound")
