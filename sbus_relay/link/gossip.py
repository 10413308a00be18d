"""The hosts' interest on NATS, as this link takes part in it (``protocol.natsinterest``).

What it owns: this host's announcements (deltas, snapshots, heartbeats,
goodbye) and its view of the other hosts' patterns, the snapshot requests,
the hosts heard under our own name.  What it may touch: the ``BusWriter``
(the union's changes become the link's holds in the bus's index) and the
engine's ``publish``, through the callable it is given.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from sbus_relay.protocol import natsinterest
from sbus_relay.protocol.natsmap import MappingError, SubjectMap, decode_token

from .engine import Outgoing
from .tobus import BusWriter

#: Incarnations under our own host name said in the log (the rest are not).
TWINS_LOGGED = 16

Publish = Callable[[list[Outgoing]], Awaitable[int]]


class Gossip:
    """This host's side of the interest announcements."""

    def __init__(
        self,
        map_: SubjectMap,
        host: str,
        identities: bool,
        publish: Publish,
        writer: BusWriter,
        log: Any,
    ) -> None:
        self.map = map_
        self.host = host
        self._publish = publish
        self._writer = writer
        self.log = log
        self.local = natsinterest.LocalInterest()
        self.remote = natsinterest.RemoteInterest(secrets=identities)
        self._subject = map_.interest_of(host)
        self._twins: set[int] = set()  # other incarnations heard under our name

    async def _announce(self, announcements: list[natsinterest.Announcement]) -> None:
        subject = self._subject
        await self._publish([(subject, None, natsinterest.encode(a)) for a in announcements])

    async def delta(self) -> None:
        await self._announce(self.local.delta())

    async def joined(self) -> None:
        """Connected (again): our snapshot, and a request for everyone's."""
        await self._announce(self.local.snapshot())
        await self._publish([(self.map.snapshot, None, b"")])

    async def heartbeat(self) -> None:
        await self._announce([self.local.heartbeat()])

    async def goodbye(self) -> None:
        await self._announce([self.local.goodbye()])

    def expire(self) -> None:
        """Forget the hosts not heard from for a while."""
        self._tell(self.remote.expire(time.monotonic()))

    def _tell(self, changes: list[natsinterest.Change]) -> None:
        for present, pattern in changes:
            self._writer.tell(pattern, present)

    async def on_interest(self, subject: bytes, payload: bytes) -> None:
        """An announcement on ``<prefix>._i.<host>``."""
        try:
            host = decode_token(subject.rpartition(b".")[2])
        except MappingError:
            self.remote.refused += 1
            return
        name = host.decode("utf-8", "replace")
        a = natsinterest.decode(payload)
        if name == self.host:
            if a is not None and a.incarnation not in self._twins | {self.local.incarnation}:
                # a live upgrade's other process, for a moment; or a host with our name
                self._twins.add(a.incarnation)
                if len(self._twins) <= TWINS_LOGGED:
                    self.log.warning("nats.host_name_shared", host=name, hint="set nats.host")
            return
        if a is None:
            self.remote.refused += 1
            return
        changes, ask = self.remote.receive(name, a, time.monotonic())
        self._tell(changes)
        if ask:
            await self._publish([(self.map.snapshot, None, host)])

    async def on_snapshot_asked(self, payload: bytes) -> None:
        """A request on ``<prefix>._q``: for every host (empty), or for one by name."""
        if payload and payload.decode("utf-8", "replace") != self.host:
            return
        await self._announce(self.local.snapshot())
