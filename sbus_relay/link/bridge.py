"""One host's presence on NATS: the link process's main object.

What it owns: the link's lifecycle (joining, reading the bus's packets while
NATS is there, timers, stopping on the bus's EOF or SIGTERM), its state and
the stats it reports.  What it may touch: its end of the socket pair (read
here, written through ``BusWriter``), the engine, and its parts:
``Outbound`` (bus -> NATS), ``Inbound`` (NATS -> bus), ``Subscriptions``,
``Gossip`` (interest), ``Confirmations``, and what makes every loss across
hosts seen (docs/nats.md): the ``Ledger`` (each message's number, what this
host sent each other host, and the counts saying so) and ``Origins`` (each
other host's order, refusals and losses).  Everything runs on one asyncio
loop in one thread: the engine hands its threads' work to it (``Sink``).

While NATS is away the link stops reading its end: what the bus publishes
meanwhile waits in the bus's bounded queue for the link, in order, and what
overflows is dropped there and counted (the link's drop episode).  Once
connected again the link resubscribes, re-announces its snapshot, asks for
everyone's, and reads on (``RESUME_GRACE`` later).
"""

from __future__ import annotations

import asyncio
import select
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from sbus_relay.protocol import codec, linkwire, natsinterest, natsledger, natsorigins
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.limits import LINK_READ_BATCH, MAX_PACKET
from sbus_relay.protocol.natsmap import SubjectMap

from .confirm import CONFIRM_SECONDS, Confirmations
from .engine import Engine, Envelope, Outgoing
from .gossip import Gossip
from .handover import Arriving, Leaving
from .inbound import Inbound
from .outbound import SUBJECT_MAX, Outbound
from .subscriptions import (
    COUNTS_SID,
    HANDOVER_SID,
    INTEREST_SID,
    LONG_SID,
    SNAPSHOT_SID,
    subscriptions,
)
from .tobus import BusWriter

#: Seconds after first joining NATS until the other hosts' interest is taken
#: as known (they answer the snapshot request within a round trip); until
#: then the bus holds every public key for the link.
INTEREST_SETTLE = 1.0
#: Seconds a link that reconnected holds what waited meanwhile before it sends
#: it: the other hosts of a restarted server reconnect (every RECONNECT_WAIT)
#: and resubscribe within it, so the held messages reach them.
RESUME_GRACE = 0.5
#: Seconds between two stats packets to the bus (and at once on a change of state).
STATS_SECONDS = 0.5
#: Seconds the goodbye and what is held may take to leave at a stop.
CLOSE_TIMEOUT = 1.0
#: Seconds the round trip that answers the bus's ``interest/ready`` may take
#: before it is tried again (``link/synced`` only ever follows one that succeeded).
SYNC_TIMEOUT = 5.0


class Bridge:
    """The link: the bus's packets to NATS and back (see the module's doc)."""

    def __init__(
        self,
        sock: socket.socket,
        hello: linkwire.Hello,
        engine: Engine,
        log: Any,
        adopt: dict[str, Any] | None = None,
    ) -> None:
        self.hello = hello
        self.log = log
        self.engine = engine
        self._sock = sock
        sock.setblocking(False)
        self._fd = sock.fileno()
        self.map = SubjectMap(hello.subject_prefix)
        #: the prefix of this host's identities when they cross (None: they stay home)
        self.identity = natsinterest.host_identity(hello.host) if hello.identities else None
        self.state = "starting"
        self.connected = False
        self.server = ""
        self.reconnects = 0
        self.refused = 0  # nats_refused
        self.slow = 0  # what the engine dropped of slow subscriptions
        self.counts_sent = 0  # fleet: counts published for other hosts
        self.settled = False
        self._ever = False  # connected once
        self._closing = False
        self._erred = False  # an error was said since the link was last up
        self._watching = False
        self._sync_owed = False
        self._syncing = False
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.writer = BusWriter(sock, self._loop)
        self.subs = subscriptions()
        # fleet: this link's incarnation, what it sends whom, what it gets from whom
        # (a live upgrade's new link goes on under the old one's: ``handover``)
        incarnation = time.time_ns() if adopt is None else int(adopt["incarnation"])
        self.ledger = natsledger.Ledger(hello.host, incarnation, tuple(hello.publish))
        self.origins = natsorigins.Origins(hello.host, incarnation, self.subs)
        self.outbound = Outbound(self.map, hello.export, self.identity, self.ledger)
        self.inbound = Inbound(
            self.map,
            hello.import_,
            self.identity,
            self.subs,
            self.writer,
            self._control,
            self.origins,
            self._loop.call_soon,
        )
        #: the engine's messages go straight to ``inbound`` (one call a message);
        #: it hands back those of the link's own subscriptions (``_control``)
        self.on_message: Callable[[int, bytes, Envelope, bytes], None] = self.inbound.message
        self.gossip = Gossip(
            self.map,
            hello.host,
            hello.identities,
            self._publish,
            self.writer,
            log,
            incarnation=incarnation,
            always=tuple(hello.publish),
            ledger=self.ledger,
            watchers=(self.origins,),
            subs=self.subs,
            counts=self._counts,
            tell_initial=adopt is None,
        )
        self._counts_queued = 0  # count messages in the outbox (not traffic)
        self.confirm = Confirmations(engine, log)
        self._announce_soon = False
        #: the engine's calls, made one after the other in this order: a
        #: subscription never overtakes its own removal, nor a message another
        self._ops: deque[Callable[[], Awaitable[Any]]] = deque()
        self._outbox: list[Outgoing] = []
        self._running = False
        self._tasks: set[asyncio.Future[Any]] = set()  # held until done (the loop holds weakly)
        #: the patterns' subscriptions made on the engine (their sids)
        self._engine_sids: set[int] = set()
        #: a live upgrade: this link hands itself over to a new one (``Leaving``),
        #: or is the new one, holding what comes until it takes over (``Arriving``)
        self.leaving: Leaving | None = None
        self.arriving: Arriving | None = None
        #: after a take-over, until the bus's ``interest/ready``: the local
        #: patterns the bus told again (those it no longer tells went meanwhile)
        self._resync: set[bytes] | None = None
        if adopt is not None:
            self.arriving = Arriving(self, adopt)
            self.on_message = self.arriving.hold

    # --- the process's life ----------------------------------------------------------

    async def run(self) -> None:
        """Join NATS and serve until the bus closes its end (or SIGTERM)."""
        loop = self._loop
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        loop.set_exception_handler(self._unexpected)
        # the link lives as long as its bus holds the other end (whichever bus:
        # a live upgrade hands it on), seen at once whether it reads it or not
        hangup = select.epoll()
        hangup.register(self._fd, select.EPOLLRDHUP)
        loop.add_reader(hangup.fileno(), self._hung_up, hangup)
        engine = self.engine
        await engine.subscribe(INTEREST_SID, self.map.interest_all, False)
        await engine.subscribe(SNAPSHOT_SID, self.map.snapshot, True)
        await engine.subscribe(LONG_SID, self.map.long, True)
        await engine.subscribe(COUNTS_SID, self.map.ledger_of(self.hello.host), True)
        await engine.subscribe(HANDOVER_SID, self.map.handover_of(self.hello.host), True)
        if self.arriving is not None:  # as the old link is subscribed, at once
            self.resubscribe(self.arriving.subs)
            self._reading(True)  # the old link's final state comes from the bus
        self.state = "connecting"
        self._report()
        tasks = [
            self._task(self._every(natsinterest.HEARTBEAT, self._tick)),
            self._task(self._every(CONFIRM_SECONDS, self._confirm)),
            self._task(self._every(STATS_SECONDS, self._report)),
            self._task(self._every(natsledger.LEDGER_INTERVAL, self._count)),
        ]
        await engine.start(self)
        try:
            await self._stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            self.confirm.stop()
            self._reading(False)
            await self._close()
            # a SIGTERM from now on ends the process as by default: one that came
            # while the loop closes its wakeup pipe was a traceback on the bus's stderr
            loop.remove_signal_handler(signal.SIGTERM)
            loop.remove_reader(hangup.fileno())
            hangup.close()

    def _hung_up(self, hangup: select.epoll) -> None:
        """The bus's end of the socket pair closed (the bus stopped, or died)."""
        if hangup.poll(0):
            self._loop.remove_reader(hangup.fileno())
            self._stop.set()

    def _unexpected(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What a callback or task raised (a bug): one log line with its
        traceback, which the bus writes; the link goes on."""
        error = context.get("exception")
        self.log.error(
            "nats.link_error",
            message=str(context.get("message", "")),
            exc_info=error if isinstance(error, BaseException) else None,
        )

    def _task(self, coro: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _every(self, seconds: float, what: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            result = what()
            if asyncio.iscoroutine(result):
                await result

    async def _close(self) -> None:
        self._closing = True
        if self.leaving is not None and self.leaving.done:
            pass  # handed over: the incarnation lives on, nothing is said (``leave_nats``)
        elif self.arriving is not None:
            await self.engine.close(0)  # never took over: nothing of ours was said
        else:
            if self.connected:
                await self.gossip.goodbye()
            # (away from NATS, nothing is held for it: no flush to wait for)
            await self.engine.close(CLOSE_TIMEOUT if self.connected else 0)
        self.connected = False
        self.state = "closed"
        self.log.info("nats.closed", sent=self.confirm.sent, received=self.inbound.received)
        self._report()
        self.writer.stop()

    # --- the engine's word (``engine.Sink``) ----------------------------------------------

    def on_connected(self, server: str, again: bool) -> None:
        self.server = server.partition("://")[2] or server  # host:port, whoever names it
        if again:
            self.reconnects += 1
        first = not self._ever
        self._ever = True
        if self.arriving is not None:  # taking over: settled then (the old link's view)
            self.connected = True
            self.state = "connected"
            self._report()
            self._task(self.arriving.joined())
            return
        if first:
            self._loop.call_later(INTEREST_SETTLE, self._settle)
        self._task(self._joined(first))

    async def _joined(self, first: bool) -> None:
        await self.gossip.joined()
        self.connected = True
        self.state = "connected"
        self._erred = False
        self.log.info(
            "nats.connected",
            server=self.server,
            patterns=len(self.gossip.local.patterns),
            engine=self.engine.name,
        )
        self._report()
        if self.leaving is not None and self.leaving.cutting:
            return  # (the cut reads nothing more from the bus)
        if first:
            self._reading(True)
        else:
            # what was held while away waits a moment more: the other hosts of a
            # restarted server reconnect and resubscribe meanwhile, and then it reaches them
            self._loop.call_later(RESUME_GRACE, self._resume)

    def on_disconnected(self) -> None:
        if self.connected and not self._closing:
            self.log.warning("nats.lost", server=self.server)
        self.confirm.connection_lost(self.server, self._closing)
        self.origins.link_down()  # fleet: a loss counted from now on is this link's
        self.connected = False
        self.state = "reconnecting" if self._ever else "connecting"
        self._reading(False)
        self._report()

    def on_error(self, text: str) -> None:
        # the first error while away is news (a refused sign-in, say); its repeats are not
        say = self.log.debug if self._erred else self.log.warning
        self._erred = not self.connected
        say("nats.error", error=text)

    def on_slow_consumer(self, dropped: int) -> None:
        self.slow += dropped
        self.origins.slow_consumer()  # fleet: the losses it causes are counted there

    def _control(self, sid: int, subject: bytes, envelope: str | None, payload: bytes) -> None:
        """A message on the interest, the snapshot, the counts or the hand-over subject."""
        if sid == HANDOVER_SID:
            if self.leaving is not None:
                self.leaving.marker(payload)
        elif sid == INTEREST_SID:
            self._task(self.gossip.on_interest(subject, payload))
        elif sid == SNAPSHOT_SID and self.connected:
            self._task(self.gossip.on_snapshot_asked(payload))
        elif sid == COUNTS_SID:
            self.inbound.count(envelope, payload)

    def _settle(self) -> None:
        """The other hosts have had time to answer: what they want is known."""
        self.settled = True
        self.writer.control(linkwire.SETTLED_PACKET)

    def _resume(self) -> None:
        if self.connected and not (self.leaving is not None and self.leaving.cutting):
            self._reading(True)

    # --- bus -> NATS ------------------------------------------------------------------------

    def _reading(self, on: bool) -> None:
        """Watch the bus's end for packets (while NATS is there), or stop."""
        if not on and self.arriving is not None:
            return  # the old link's final state is to be read whether NATS is there or not
        if on and not self._watching:
            self._loop.add_reader(self._fd, self._readable)
            self._readable()  # read what waited meanwhile
        elif not on and self._watching:
            self._loop.remove_reader(self._fd)
        self._watching = on

    def _readable(self) -> None:
        out = self._outbox
        queued = len(out)
        changed = False
        for _ in range(LINK_READ_BATCH):
            try:
                packet = self._sock.recv(MAX_PACKET)
            except BlockingIOError:
                break
            except OSError:
                packet = b""
            if not packet:
                self._stop.set()  # the bus has gone, or stops us
                self._reading(False)
                break
            changed = self._from_bus(packet, out) or changed
        if not queued and out:
            self._do(self._send)
        if changed:
            self._schedule_announce()
        if self._sync_owed and not self._syncing:
            self._task(self._sync())

    def _from_bus(self, packet: bytes, out: list[Outgoing]) -> bool:
        """Act on one packet from the bus; True if it changed our interest."""
        try:
            if self.outbound.take(out, packet):
                return False
            event = codec.decode(packet)
        except PeerError as e:  # a bug of the bus's: said, and the packet left
            self.log.error("nats.bad_packet", error=e.detail, head=packet[:32].hex())
            return False
        if isinstance(event, codec.Subscribe | codec.Unsubscribe):
            return self._local(event.pattern, isinstance(event, codec.Subscribe))
        if isinstance(event, codec.Control):
            return self._bus_control(event.key, event.payload or b"")
        return False

    def _bus_control(self, key: bytes, payload: bytes) -> bool:
        """A control packet from the bus; True if it changed our interest."""
        if key == linkwire.READY:
            self._sync_owed = True
            if self._resync is not None:  # the bus told every local pattern again
                gone = self.gossip.local.patterns - self._resync
                self._resync = None
                for pattern in sorted(gone):
                    self._local(pattern, False)
                return bool(gone)
        elif key == linkwire.EXPORT:
            if self.leaving is None or not self.leaving.cutting:
                self.leaving = Leaving(self, payload.decode("ascii", "replace"))
                self.leaving.state()
        elif key == linkwire.CUT:
            if self.leaving is not None:
                self._task(self.leaving.cut())
        elif key == linkwire.FINAL and self.arriving is not None:
            try:
                record = self.arriving.final(payload)
            except PeerError as e:
                self.log.error("nats.bad_packet", error=e.detail)
                return False
            if record is not None:
                self._take_over(record)
        return False

    def _take_over(self, record: dict[str, Any]) -> None:
        """The old link's final state: become it, let through what is ours of
        what was held, and serve (``handover.Arriving``)."""
        arriving = self.arriving
        assert arriving is not None
        try:
            figures = arriving.take_over(record)
        except (KeyError, TypeError, ValueError) as e:  # an old link's record we cannot read
            self.log.error("nats.bad_packet", error=f"link/final: {e!r}")
            self.stop()
            return
        self.arriving = None
        self._resync = set()
        if self.connected:  # heard at once: the old link's heartbeats stopped with it
            self._task(self.gossip.heartbeat())
        self.settled = True
        self.writer.control(linkwire.SETTLED_PACKET)
        self.writer.control(linkwire.encode_took_over(figures))
        if not self.connected:
            self._reading(False)  # read again once NATS is there
        self._report()

    def _do(self, op: Callable[[], Awaitable[Any]]) -> None:
        """Call the engine after the calls asked for before."""
        self._ops.append(op)
        if not self._running:
            self._running = True
            self._task(self._run_ops())

    async def _run_ops(self) -> None:
        try:
            while self._ops:
                await self._ops.popleft()()
        finally:
            self._running = False

    async def _send(self) -> None:
        out, self._outbox = self._outbox, []
        counts, self._counts_queued = self._counts_queued, 0
        refused = await self.engine.publish(out)
        self.refused += refused
        # (the counts for other hosts are not traffic: neither sent nor unconfirmed)
        self.confirm.sent += max(0, len(out) - refused - counts)
        self.counts_sent += counts

    def _counts(self, counts: list[tuple[str, str, bytes]]) -> None:
        """fleet: counts for other hosts (``natsledger``), after the data stamped
        before them, in the same batch for the engine: one connection keeps
        their order towards each other host."""
        if not counts or not self.connected:
            return
        ledger_of = self.map.ledger_of
        out = [(ledger_of(host), value, payload) for host, value, payload in counts]
        if not self._outbox:
            self._do(self._send)
        self._outbox.extend(out)
        self._counts_queued += len(out)

    def _local(self, pattern: bytes, present: bool) -> bool:
        """One of this host's patterns came or went; True if that is news."""
        if self._resync is not None and present:
            self._resync.add(pattern)
            if pattern in self.gossip.local.patterns:
                return False  # told again after a take-over: the old link had it
        if not natsinterest.acceptable(pattern, owner=self.identity):
            return False  # identities stay on their host, unless they cross
        self.gossip.local.change(pattern, present)
        # fleet: a new subscription now; one whose last pattern went ends later (``_count``)
        r = self.subs.change(pattern, present, time.monotonic())
        if r is not None:
            self._subscribe(self.subs.sid(r), r)
        return True

    def _subscribe(self, sid: int, r: bytes) -> None:
        subject = self.map.subscription(r)
        if subject is not None and len(subject) <= SUBJECT_MAX and sid not in self._engine_sids:
            self._engine_sids.add(sid)
            self._do(lambda: self.engine.subscribe(sid, subject, True))

    def resubscribe(self, made: list[tuple[int, bytes]]) -> None:
        """Exactly these pattern subscriptions on the engine (a hand-over's)."""
        wanted = dict(made)
        for sid in sorted(self._engine_sids - set(wanted)):
            self._engine_sids.discard(sid)
            self._do(lambda sid=sid: self.engine.unsubscribe(sid))  # type: ignore[misc]
        for sid, r in made:
            self._subscribe(sid, r)

    # --- the hand-over's needs (``handover``) -----------------------------------------

    def stop_reading(self) -> None:
        """Read nothing more from the bus (the cut was its last packet)."""
        self._reading(False)

    async def ops_done(self) -> None:
        """Until every engine call asked for so far has been made."""
        while self._running or self._ops:
            await asyncio.sleep(0.001)

    async def leave_nats(self) -> None:
        """Leave NATS without a goodbye (the state went to a new link)."""
        self._closing = True
        await self.engine.close(0)
        self.connected = False

    def stop(self) -> None:
        """End the process (its ``run`` returns)."""
        self._stop.set()

    def _schedule_announce(self) -> None:
        if not self._announce_soon:
            self._announce_soon = True
            self._loop.call_soon(lambda: self._task(self._send_delta()))

    def _count(self) -> None:
        """fleet, every ``LEDGER_INTERVAL``: subscriptions whose grace is over
        end, the counts due go out, loss episodes go on or end."""
        if self.arriving is not None or (self.leaving is not None and self.leaving.done):
            return  # the old link counts until the cut, the new one from it
        for sid, _ in self.subs.due(time.monotonic()):
            self._engine_sids.discard(sid)
            self._do(lambda sid=sid: self.engine.unsubscribe(sid))  # type: ignore[misc]
        if self.connected:
            self._counts(self.ledger.due(time.monotonic()))
        self.origins.tick(time.time())
        for event, fields in self.origins.reports():
            self.log.warning(event, **fields)

    async def _send_delta(self) -> None:
        self._announce_soon = False
        if self.connected:
            await self.gossip.delta()

    async def _sync(self) -> None:
        """The bus asked (``interest/ready``): say ``synced`` once the server has
        every subscription made so far; never after a round trip that failed."""
        self._syncing = True
        try:
            while self._sync_owed and not self._closing:
                self._sync_owed = False
                if await self.engine.round_trip(SYNC_TIMEOUT) is None:
                    self._sync_owed = True  # asked again after the next round trip
                    await asyncio.sleep(CONFIRM_SECONDS)
                    continue
                self.writer.control(linkwire.SYNCED_PACKET)
        finally:
            self._syncing = False

    async def _publish(self, batch: list[Outgoing]) -> int:
        """The gossip's announcements (not counted as traffic)."""
        return await self.engine.publish(batch)

    # --- timers -------------------------------------------------------------------------------

    async def _tick(self) -> None:
        """Heartbeats, forgetting silent hosts; while NATS is away, the bus's EOF."""
        if self.arriving is not None or (self.leaving is not None and self.leaving.done):
            return  # the old link announces until the cut, the new one from it
        self.gossip.expire()
        if self.connected:
            await self.gossip.heartbeat()
        elif not self._watching:
            try:
                if self._sock.recv(1, socket.MSG_PEEK) == b"":
                    self._stop.set()  # the bus stopped while NATS was away
            except BlockingIOError:
                pass
            except OSError:
                self._stop.set()

    def _confirm(self) -> None:
        if self.connected and self.confirm.due():
            self.confirm.start()

    def stats(self) -> linkwire.Stats:
        inb, outb = self.inbound, self.outbound
        return linkwire.Stats(
            state=self.state,
            connected=self.connected,
            server=self.server,
            engine=self.engine.name,
            sent=self.confirm.sent,
            sent_bytes=outb.payload_bytes,  # (what was refused is rare: not taken off)
            received=inb.received,
            received_bytes=inb.received_bytes,
            reconnects=self.reconnects,
            unconfirmed=self.confirm.unconfirmed,
            to_bus_queued=self.writer.queued,
            subscriptions=len(self.subs),
            remote_hosts=self.gossip.remote.live,
            remote_patterns=len(self.gossip.remote.union),
            rtt_us=int(self.confirm.rtt * 1e6),
            settled=self.settled,
            drops={
                **inb.drops,
                "not_exported": outb.drops["not_exported"],
                "secret": outb.drops["secret"] + inb.drops["secret"],
                "nats_refused": self.refused,
            },
            fleet=self._fleet(),
        )

    def _fleet(self) -> dict[str, Any]:
        """What the link counted of the fleet (docs/nats.md, "Every loss seen")."""
        o, remote = self.origins, self.gossip.remote
        return {
            "seq": self.ledger.seq,
            "unconfirmed_total": self.confirm.lost,
            "slow_consumer": self.slow,
            "silent_hosts": len(remote.hosts) - remote.live,
            "malformed": o.malformed,
            "refused_announcements": remote.refused,
            "own": o.own,
            "counts_sent": self.counts_sent,
            "origin_rows": o.rows(),
        }

    def _report(self) -> None:
        self.writer.stats(linkwire.encode_stats(self.stats()))


async def serve(
    sock: socket.socket,
    hello: linkwire.Hello,
    engine: Engine,
    log: Any,
    adopt: dict[str, Any] | None = None,
) -> None:
    """The link process's work, from its hello to its end (``adopt``: a live
    upgrade's new link, with the old one's ``link/state``)."""
    await Bridge(sock, hello, engine, log, adopt).run()
