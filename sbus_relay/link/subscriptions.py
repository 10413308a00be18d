"""The link's NATS subscriptions: the sids of its own, and those of this host's patterns.

What it owns: the sids of the link's own subscriptions (interest, snapshot
requests, long keys, the counts other hosts send this one, a hand-over's
marker) and where the
patterns' sids begin.  What it may touch: nothing.

The patterns' subscriptions themselves, one per relaxed pattern, which of
them takes a message (NATS delivers one copy to each that matches), and the
grace a subscription is kept after its last pattern went, are
``protocol.natssubs.Subscriptions``' (sans-I/O); its subscriptions' order is
their sid.
"""

from __future__ import annotations

from sbus_relay.protocol.natssubs import Subscriptions

#: The link's own subscriptions' sids (interest, snapshot requests, long
#: keys, counts of what other hosts sent this one, the marker of a hand-over
#: to a new link process); a pattern's sid is above them.
INTEREST_SID = 1
SNAPSHOT_SID = 2
LONG_SID = 3
COUNTS_SID = 4
HANDOVER_SID = 5
FIRST_PATTERN_SID = 16


def subscriptions() -> Subscriptions:
    """This host's patterns' subscriptions, numbered from ``FIRST_PATTERN_SID``."""
    return Subscriptions(FIRST_PATTERN_SID)


__all__ = [
    "COUNTS_SID",
    "FIRST_PATTERN_SID",
    "HANDOVER_SID",
    "INTEREST_SID",
    "LONG_SID",
    "SNAPSHOT_SID",
    "Subscriptions",
    "subscriptions",
]
