"""A link's hand-over to a new link process (a live upgrade), both sides of the cut.

What it owns: the link's whole state as one record (``export``, ``restore``),
the old link's part of the cut (``Leaving``) and the new link's, holding what
NATS brings until it takes over (``Arriving``).  What it may touch: the
bridge's parts (ledger, origins, subscriptions, gossip, confirmations,
counters), its engine and its writer to the bus; the bus orchestrates the cut
(``bus/natslink.py``) and the packets are ``protocol.linkwire``'s.

Theory of operation (docs/nats.md, "A live upgrade's link").  A live upgrade
hands the old bus's end of the link's socket to the new bus with its clients'
sockets, so the link process itself goes on untouched: its NATS connection,
its sequence, its counts.  The new bus then replaces that process (old code)
by a new one, under the same incarnation, so that the other hosts see one
origin whose numbers go on:

1. the old link exports what a new one must subscribe to (``link/state``);
2. the new link (``Arriving``) subscribes to all of it, preferably on the same
   NATS server, confirms its subscriptions with a round trip, then publishes a
   *marker* (the hand-over's token, on ``<prefix>._h.<host>``) and holds every
   message that arrives, in order; it says ``link/holding``;
3. the bus stops writing to the old link and sends it ``link/cut``;
   everything the bus wrote before it, the old link publishes (``Leaving``),
   then confirms with a round trip that the server has it all, then waits for
   the marker: the server sent the marker after every message it had matched
   before the new link's subscriptions, so once the old link has handed all
   that came before the marker to its bus, the new link holds everything after;
4. the old link stops delivering, exports its whole state (``link/final``)
   after its last message to the bus, and leaves NATS without a goodbye (the
   incarnation lives on);
5. the new link takes that state up (``restore``): its sequence goes on from
   the old one's last number, its counts, the other hosts' order, their
   views; of what it held it drops what the old link took (at or below each
   origin's place in the record: ``natsorigins.positions``) and its own
   host's messages, and lets the rest through in the order it came.

Nothing needs the old bus process: it left once the sockets were handed over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from sbus_relay.protocol import linkwire, natsledger, natsorigins
from sbus_relay.protocol.natsmap import SubjectMap
from sbus_relay.protocol.natssubs import Subscriptions

from .confirm import Confirmations
from .engine import Engine, Envelope
from .gossip import Gossip
from .inbound import Inbound
from .outbound import Outbound
from .subscriptions import COUNTS_SID, FIRST_PATTERN_SID, LONG_SID
from .tobus import BusWriter

#: The layout of the record (kept from one version to the next: a new link
#: takes up what an older one exported).
RECORD_VERSION = 1
#: Seconds the old link gives its last round trip (the server has all it
#: published) and, from the cut, the marker: past them it hands over all the
#: same, and what did not make it is counted by the receivers.
CUT_CONFIRM = 2.0
CUT_MARK = 3.0
#: Seconds between two looks while the old link waits (the marker, its writer).
CUT_POLL = 0.005
#: Messages the new link holds until it takes over; beyond it the newest are
#: dropped (counted: the receivers' counts show them lost).
HOLD_MAX = 65_536


class Bridge(Protocol):
    """What a hand-over reads and writes of its link (``bridge.Bridge``; named
    here, not imported, for the bridge imports this module)."""

    hello: linkwire.Hello
    log: Any
    engine: Engine
    map: SubjectMap
    server: str
    connected: bool
    writer: BusWriter
    subs: Subscriptions
    ledger: natsledger.Ledger
    origins: natsorigins.Origins
    inbound: Inbound
    outbound: Outbound
    gossip: Gossip
    confirm: Confirmations
    on_message: Callable[[int, bytes, Envelope, bytes], None]
    arriving: Arriving | None
    reconnects: int
    refused: int
    slow: int
    counts_sent: int

    def resubscribe(self, made: list[tuple[int, bytes]]) -> None: ...

    def stop_reading(self) -> None: ...

    async def ops_done(self) -> None: ...

    async def leave_nats(self) -> None: ...

    def stop(self) -> None: ...


def export(bridge: Bridge) -> dict[str, Any]:
    """The link's whole state, as plain data (``restore`` takes it)."""
    now = time.monotonic()
    inb, outb, conf = bridge.inbound, bridge.outbound, bridge.confirm
    return {
        "version": RECORD_VERSION,
        "host": bridge.hello.host,
        "incarnation": bridge.ledger.incarnation,
        "ledger": bridge.ledger.export(),
        "origins": bridge.origins.export(),
        "subs": bridge.subs.export(now),
        "gossip": bridge.gossip.export(),
        "counters": {
            "sent": conf.sent,
            "confirmed": conf.confirmed,
            "unconfirmed_total": conf.lost,
            "sent_bytes": outb.payload_bytes,
            "received": inb.received,
            "received_bytes": inb.received_bytes,
            "reconnects": bridge.reconnects,
            "refused": bridge.refused,
            "slow": bridge.slow,
            "counts_sent": bridge.counts_sent,
            "drops_in": dict(inb.drops),
            "drops_out": dict(outb.drops),
        },
    }


def restore(bridge: Bridge, record: dict[str, Any]) -> list[tuple[int, bytes]]:
    """Become the link ``record`` describes (same host, same incarnation), on a
    bridge that has taken nothing yet; returns every subscription of the
    patterns as (sid, relaxed pattern), to make on NATS."""
    if record.get("version") != RECORD_VERSION:
        raise ValueError(f"a link record of version {record.get('version')!r}")
    # the ledger first: the views restored next find their counts there
    bridge.ledger.restore(record["ledger"])
    bridge.origins.restore(record["origins"], time.time())
    made = bridge.subs.restore(record["subs"], time.monotonic())
    bridge.gossip.restore(record["gossip"])
    c = record["counters"]
    conf, inb, outb = bridge.confirm, bridge.inbound, bridge.outbound
    conf.sent, conf.lost = int(c["sent"]), int(c["unconfirmed_total"])
    conf.confirmed = conf.sent  # the old link confirmed what it could (or counted it)
    outb.payload_bytes = int(c["sent_bytes"])
    inb.received, inb.received_bytes = int(c["received"]), int(c["received_bytes"])
    bridge.reconnects, bridge.refused = int(c["reconnects"]), int(c["refused"])
    bridge.slow, bridge.counts_sent = int(c["slow"]), int(c["counts_sent"])
    for name, n in dict(c["drops_in"]).items():
        if name in inb.drops:
            inb.drops[name] = int(n)
    for name, n in dict(c["drops_out"]).items():
        if name in outb.drops:
            outb.drops[name] = int(n)
    return made


def subscribed(record: dict[str, Any]) -> list[tuple[int, bytes]]:
    """The subscriptions an old link's ``link/state`` names, as (sid, relaxed pattern)."""
    return sorted((int(s[2]), bytes.fromhex(str(s[0]))) for s in record["subs"]["subs"])


class Leaving:
    """The old link's part: its state for the new link, then the cut."""

    def __init__(self, bridge: Bridge, token: str) -> None:
        self.bridge = bridge
        self.token = token
        self.marked = False
        self.cutting = False
        #: the state is handed over: nothing more is published, no goodbye
        self.done = False

    def state(self) -> None:
        """``link/export``: what the new link must subscribe to, at once."""
        b = self.bridge
        record = {
            "version": RECORD_VERSION,
            "host": b.hello.host,
            "incarnation": b.ledger.incarnation,
            "token": self.token,
            "server": b.server,
            "subs": b.subs.export(time.monotonic()),
        }
        b.writer.record(linkwire.encode_record(linkwire.STATE, record))

    def marker(self, payload: bytes) -> None:
        """A message on the hand-over's subject: the new link's marker, if it is ours."""
        if payload == self.token.encode("ascii", "replace"):
            self.marked = True

    async def cut(self) -> None:
        """``link/cut``: the last packet the bus wrote us.  Publish what came
        before it, confirm, wait for the marker, hand every message before it
        to the bus, then the state; leave NATS without a goodbye."""
        b = self.bridge
        if self.cutting:
            return
        self.cutting = True
        started = time.monotonic()
        b.stop_reading()
        await b.ops_done()  # what the bus wrote before the cut is the engine's now
        confirmed = b.connected and await b.engine.round_trip(CUT_CONFIRM) is not None
        while not self.marked and time.monotonic() - started < CUT_MARK:
            await asyncio.sleep(CUT_POLL)
        # nats-py hands each subscription's messages over in a task of its own:
        # those that came before the marker run before these turns are over
        for _ in range(3):
            await asyncio.sleep(0)
        b.on_message = _ignore
        b.inbound.release()  # what the origins held goes to the bus now
        record = export(b)
        record["cut"] = {"confirmed": confirmed, "marked": self.marked}
        self.done = True
        await b.leave_nats()
        while b.writer.queued and not b.writer.gone:  # every message first
            await asyncio.sleep(CUT_POLL)
        b.log.info(
            "nats.link_left",
            seq=b.ledger.seq,
            confirmed=confirmed,
            marked=self.marked,
            seconds=round(time.monotonic() - started, 3),
        )
        b.writer.record(linkwire.encode_record(linkwire.FINAL, record))
        while not b.writer.idle:
            await asyncio.sleep(CUT_POLL)
        b.stop()


def _ignore(sid: int, subject: bytes, envelope: Envelope, payload: bytes) -> None:
    """What the old link receives once its state is handed over: the new link's."""


class Arriving:
    """The new link's part: subscribed as the old link is, holding what comes,
    until the old link's final state comes and it takes over."""

    def __init__(self, bridge: Bridge, record: dict[str, Any]) -> None:
        self.bridge = bridge
        self.token = str(record["token"])
        self.subs = subscribed(record)
        self.held: list[tuple[int, bytes, Envelope, bytes]] = []
        self.dropped = 0
        self.said = False  # ``link/holding`` sent
        self.since = time.monotonic()
        self._final = linkwire.Record()

    def hold(self, sid: int, subject: bytes, envelope: Envelope, payload: bytes) -> None:
        """The engine's ``on_message`` until the take-over: kept, in order."""
        if len(self.held) < HOLD_MAX:
            self.held.append((sid, subject, envelope, payload))
        else:
            self.dropped += 1

    async def joined(self) -> None:
        """On NATS (again): once the server has our subscriptions, the marker
        (every time: the old link may have missed one), and ``link/holding`` once."""
        b = self.bridge
        while b.arriving is self and await b.engine.round_trip(CUT_CONFIRM) is None:
            if not b.connected:
                return  # on joining again
        if b.arriving is not self:
            return
        await b.engine.publish([(b.map.handover_of(b.hello.host), None, self.token.encode())])
        await b.engine.round_trip(CUT_CONFIRM)
        if not self.said:
            self.said = True
            b.writer.control(linkwire.encode_holding(b.server))

    def final(self, payload: bytes) -> dict[str, Any] | None:
        """A part of the old link's ``link/final``: its record once whole."""
        return self._final.add(payload)

    def take_over(self, record: dict[str, Any]) -> dict[str, Any]:
        """Become the old link, then let through what was held that is not its:
        what it took (at or below each origin's place), and our own host's
        messages (its own, seen by us), are dropped.  What it says of it."""
        b = self.bridge
        made = restore(b, record)
        b.resubscribe(made)
        places = natsorigins.positions(record["origins"])
        own = b.ledger.prefix
        held, self.held = self.held, []
        b.on_message = b.inbound.message
        theirs = mine = 0
        for sid, subject, value, payload in held:
            if value is not None and (sid >= FIRST_PATTERN_SID or sid in (LONG_SID, COUNTS_SID)):
                if value.startswith(own):
                    theirs += 1
                    continue
                if natsorigins.covered(places, value, sid == COUNTS_SID):
                    theirs += 1
                    continue
            mine += 1
            b.inbound.message(sid, subject, value, payload)
        cut = dict(record.get("cut", {}))
        return {
            "seq": b.ledger.seq,
            "held": len(held),
            "taken_by_the_old_link": theirs,
            "let_through": mine,
            "dropped": self.dropped,
            "confirmed": bool(cut.get("confirmed", False)),
            "marked": bool(cut.get("marked", False)),
            "seconds": round(time.monotonic() - self.since, 3),
        }
