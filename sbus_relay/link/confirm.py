"""What the NATS server confirmed of what the link published (``unconfirmed``).

What it owns: the round trips that confirm, the count of what was sent and
what confirmed, the round-trip time, and counting what a server that went
away never confirmed.  What it may touch: the engine's ``round_trip``, and
the log (one warning per loss).

A NATS server answers a PING only after reading all that came before it on
the connection, so a PONG confirms every message published before its PING;
what a server that went away never confirmed is counted (at most lost).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sbus_relay.protocol.natsinterest import HEARTBEAT

from .engine import Engine

#: Seconds between round trips that confirm what was published, while any of
#: it is unconfirmed (and every HEARTBEAT anyway, for the round-trip time):
#: this keeps the count close to what was really lost, for a PING and a PONG
#: every 0.1 s while traffic flows.
CONFIRM_SECONDS = 0.1
#: Seconds one confirming round trip may take: longer than the client needs to
#: leave a silent server (PING_INTERVAL * (PINGS + 1)), so a round trip is
#: given up only with its connection, never while a late PONG may still come
#: (nats-py fails on a PONG for a PING whose wait was given up).
CONFIRM_TIMEOUT = 30.0


class Confirmations:
    """Round trips, one at a time on a connection, and what they confirmed."""

    def __init__(self, engine: Engine, log: Any) -> None:
        self._engine = engine
        self.log = log
        self.sent = 0  # messages the engine took (the bridge adds)
        #: ``sent`` when the server last confirmed all it had been handed
        self.confirmed = 0
        self.lost = 0  # counted as ``unconfirmed`` drops
        self.rtt = 0.0
        self._trip: asyncio.Future[None] | None = None
        self._trip_done = 0.0

    @property
    def unconfirmed(self) -> int:
        return max(0, self.sent - self.confirmed)

    def due(self) -> bool:
        """A round trip should start now (none in flight)."""
        if self._trip is not None:
            return False
        return self.sent > self.confirmed or time.monotonic() - self._trip_done >= HEARTBEAT

    def start(self) -> None:
        """Begin one round trip."""
        self._trip = asyncio.ensure_future(self._round_trip())
        self._trip.add_done_callback(self._ended)

    def _ended(self, trip: asyncio.Future[None]) -> None:
        if self._trip is trip:
            self._trip = None
            self._trip_done = time.monotonic()

    async def _round_trip(self) -> None:
        upto = self.sent
        rtt = await self._engine.round_trip(CONFIRM_TIMEOUT)
        if rtt is None:
            return  # nothing confirmed; the connection's loss counts it, if lost
        self.rtt = rtt
        self.confirmed = max(self.confirmed, upto)

    def connection_lost(self, server: str, closing: bool) -> None:
        """What the lost connection's server did not confirm is counted (at most
        lost: some of it may have been taken, or may still wait in the client
        for the next server)."""
        if self._trip is not None:
            # its PONG will never come: the next connection's trips need not wait for it
            self._trip.cancel()
            self._trip = None
        lost = self.sent - self.confirmed
        self.confirmed = self.sent
        if lost > 0 and not closing:
            self.lost += lost
            self.log.warning(
                "nats.unconfirmed",
                server=server,
                messages=lost,
                total=self.lost,
                hint="handed to a server that went away before confirming them: at most lost",
            )

    def stop(self) -> None:
        if self._trip is not None:
            self._trip.cancel()
            self._trip = None
