"""The hosts' interest on NATS, as this link takes part in it (``protocol.natsinterest``).

What it owns: this host's announcements (deltas, snapshots, heartbeats,
goodbye) and its view of the other hosts' patterns, the snapshot requests
(answered at most once per ``natsinterest.ANSWER_INTERVAL``), the hosts
heard under our own name.  What it may touch: the ``BusWriter`` (the union's
changes become the link's holds in the bus's index), the engine's
``publish``, through the callable it is given, the watchers of the other
hosts' views (``natsledger.Ledger``, ``natsorigins.Origins``), the
subscriptions its announcements name (``natssubs``), and the callable that
sends the counts a change of view owes at once (fleet: docs/nats.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sbus_relay.protocol import natsinterest
from sbus_relay.protocol.natsledger import Ledger
from sbus_relay.protocol.natsmap import MappingError, SubjectMap, decode_token
from sbus_relay.protocol.natssubs import Subscriptions

from .engine import Outgoing
from .tobus import BusWriter

#: Incarnations under our own host name remembered (the first is said in the log).
TWINS_LOGGED = 16
#: Seconds another incarnation must go on talking under our name before it is
#: said: a restarted link's last words, or a live upgrade that could not cut
#: over, stop within seconds; a second host with our name talks on (heartbeats
#: every ``natsinterest.HEARTBEAT``).
TWIN_SECONDS = natsinterest.HOST_SILENT

Publish = Callable[[list[Outgoing]], Awaitable[int]]
#: Sends counts (``Ledger.cuts``) after the data stamped before them.
Counts = Callable[[list[tuple[str, str, bytes]]], None]


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
        *,
        incarnation: int,
        always: tuple[bytes, ...],
        ledger: Ledger,
        watchers: tuple[natsinterest.HostWatcher, ...],
        subs: Subscriptions,
        counts: Counts,
        tell_initial: bool = True,
    ) -> None:
        self.map = map_
        self.host = host
        self._publish = publish
        self._writer = writer
        self.log = log
        self.local = natsinterest.LocalInterest(incarnation)
        self.remote = natsinterest.RemoteInterest(
            secrets=identities, always=always, watchers=(ledger, *watchers)
        )
        self._ledger = ledger
        self._subs = subs
        self._counts = counts
        self._subject = map_.interest_of(host)
        #: other incarnations heard under our name: when first, and those said
        self._twins: dict[int, float] = {}
        self._said: set[int] = set()
        self._answering = False  # a snapshot answering the requests meanwhile is due
        if tell_initial:  # (a hand-over's new link: the bus holds them already)
            self._tell(self.remote.initial())  # the patterns published whoever wants them

    async def _announce(self, announcements: list[natsinterest.Announcement]) -> None:
        self._subs.announced(announcements)  # fleet: which subscriptions each names
        subject = self._subject
        await self._publish([(subject, None, natsinterest.encode(a)) for a in announcements])

    async def delta(self) -> None:
        await self._announce(self.local.delta())

    async def joined(self) -> None:
        """Connected (again): our snapshot, a request for everyone's, the
        counts owed while away."""
        await self._announce(self.local.snapshot())
        await self._publish([(self.map.snapshot, None, b"")])
        self._counts(self._ledger.cuts())

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
            if a is not None:
                self._twin(a)
            return
        if a is None:
            self.remote.refused += 1
            return
        changes, ask = self.remote.receive(name, a, time.monotonic())
        self._tell(changes)
        self._counts(self._ledger.cuts())  # fleet: where that host's view changed
        if ask:
            await self._publish([(self.map.snapshot, None, host)])

    def export(self) -> dict[str, Any]:
        """This host's announcements and its view of the others, as plain data."""
        return {
            "local": self.local.export(),
            "remote": self.remote.export(),
            "twins": [[inc, first] for inc, first in self._twins.items()],
            "twins_said": sorted(self._said),
        }

    def restore(self, record: dict[str, Any]) -> None:
        """Go on from an earlier link's ``export`` (a hand-over, same incarnation):
        the bus holds that link's union already, so only what differs is told."""
        self.local.restore(record["local"])
        self._tell(self.remote.restore(record["remote"]))
        self._twins = {int(inc): float(first) for inc, first in record.get("twins", ())}
        self._said = {int(inc) for inc in record.get("twins_said", ())}

    def _twin(self, a: natsinterest.Announcement) -> None:
        """An announcement under our own host name, of another incarnation:
        said once it has gone on for ``TWIN_SECONDS`` (a second host with our
        name; more of them are likely one flood of forgeries)."""
        inc = a.incarnation
        if inc == self.local.incarnation:
            return
        if a.kind == "B":
            self._twins.pop(inc, None)  # it left
            return
        now = time.monotonic()
        first = self._twins.get(inc)
        if first is None:
            if len(self._twins) < TWINS_LOGGED:
                self._twins[inc] = now
            return
        if now - first < TWIN_SECONDS or inc in self._said:
            return
        say = self.log.debug if self._said else self.log.warning
        self._said.add(inc)
        say("nats.host_name_shared", host=self.host, seconds=round(now - first, 1),
            hint="another process speaks for this host name: set nats.host")  # fmt: skip

    async def on_snapshot_asked(self, payload: bytes) -> None:
        """A request on ``<prefix>._q``: for every host (empty), or for one by
        name; one snapshot per interval however many ask (a flood costs one)."""
        if payload and payload.decode("utf-8", "replace") != self.host:
            return
        wait = self.local.answer(time.monotonic())
        if not wait:
            await self._announce(self.local.snapshot())
        elif not self._answering:
            self._answering = True
            await asyncio.sleep(wait)
            self._answering = False
            self.local.answer(time.monotonic())
            await self._announce(self.local.snapshot())
