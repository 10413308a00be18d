"""The NATS side of a bus's NATS link: one thread, its own asyncio loop, one nats-py client.

Theory of operation (docs/nats.md, docs/decisions.md "NATS beside gevent").
The bus and this bridge share nothing but one ``SOCK_SEQPACKET`` socket
pair: the bus's end is a ``Connection`` like any client's (``bus.natslink``),
this end is read and written by the bridge's asyncio loop, in its own
thread.  So the gevent hub never waits on NATS, nats-py never sees gevent,
and what crosses between the two is sbus packets, with the kernel's socket
buffer and the bus's own bounded queue between them:

* bus -> bridge: ``MSG`` (and packed batches of them) that some other host
  wants: published on the key's subject (``protocol.natsmap``); ``SUB`` /
  ``UNSUB`` of this host's first and last subscriptions: a NATS subscription
  per pattern, and an interest announcement (``protocol.natsinterest``).
* bridge -> bus: ``MSG`` from other hosts, packed in batches; ``SUB`` /
  ``UNSUB`` when the union of the other hosts' patterns changes: the link's
  holds in the bus's index, so that a local publish is offered to the link
  only when another host wants it.

While NATS is away the bridge stops reading its end: what the bus publishes
meanwhile waits in the link's bounded queue, in order, and what overflows is
dropped there and counted (the link's drop episode).  Once connected again
the bridge resubscribes (nats-py does), re-announces its snapshot, asks for
everyone's, and reads on.

Overlapping subscriptions: NATS delivers a message once per matching
subscription of a connection, so the bridge takes it from one of them only
(``protocol.natssubs``, which also keeps a subscription a while after its
last pattern went).

Every loss seen (docs/nats.md): what the bridge publishes carries an
envelope with its sequence number, and it tells each other host how many of
its messages it should have received (``protocol.natsledger``); what comes
from other hosts is held and released in each origin's order, refused if
older than what was delivered, and compared with those counts
(``protocol.natsorigins``).  Each of the three is called from a few marked
places below ("fleet:"), and owns its state.

Every counter here is written by the bridge's thread alone and read by the
bus's (plain ints and floats: the GIL makes each read whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from typing import Any

from sbus_relay.ops.natsconfig import NatsConfig
from sbus_relay.protocol import codec, natsenvelope, natsinterest, natsledger, natsorigins, natssubs
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.keys import is_secret
from sbus_relay.protocol.limits import MATCH_CACHE_KEY_MAX, MAX_PACKET
from sbus_relay.protocol.natsmap import MappingError, SubjectMap, decode_token, relaxed
from sbus_relay.protocol.scan import read_u32

from .natstobus import BusWriter

#: Longest subject published: NATS's default max_control_line is 4096 bytes
#: and the PUB line holds the subject, the size and a few bytes more.  A key
#: whose subject is longer goes on ``<prefix>._l`` with the key in the payload.
SUBJECT_MAX = 4000
#: Seconds after first joining NATS until the other hosts' interest is taken
#: as known (they answer the snapshot request within a round trip); until
#: then the link holds every public key, so nothing published meanwhile is
#: lost for want of knowing who wants it.
INTEREST_SETTLE = 1.0
#: Incarnations under our own host name remembered (the first is said in the log).
TWINS_LOGGED = 16
#: Keys (and subjects) whose mapping is kept: most traffic repeats a few keys,
#: and mapping one costs a pass over its bytes in Python.
MAPPING_CACHE = 4096
#: Packets read from the bus per wake-up before NATS's own work gets a turn.
READ_BATCH = 256
#: Seconds a link that reconnected holds what waited meanwhile before it sends
#: it: the other hosts of a restarted server reconnect (every RECONNECT_WAIT)
#: and resubscribe within it, so the held messages reach them.
RESUME_GRACE = 0.5
#: Seconds between NATS PINGs and how many may go unanswered: a paused or
#: silent server is left for another within about PING_INTERVAL * (PINGS + 1).
PING_INTERVAL = 1
PINGS = 2
#: Seconds between reconnect attempts (each server of the list in turn), and
#: the cap of the back-off while no server at all can be reached at start.
RECONNECT_WAIT = 0.25
CONNECT_BACKOFF_MAX = 2.0
#: Seconds to wait for one server to answer a connect.
CONNECT_TIMEOUT = 2
#: Seconds between round trips that confirm what was published, while any of
#: it is unconfirmed: a NATS server answers a PING only after reading all that
#: came before it on the connection, so a PONG confirms every message published
#: before its PING; what a server that went away never confirmed is counted
#: (``unconfirmed``), and this keeps that count close to what was really lost,
#: for a PING and a PONG every 0.1 s while traffic flows.
CONFIRM_SECONDS = 0.1
#: Seconds one confirming round trip may take: longer than nats-py needs to
#: leave a silent server (PING_INTERVAL * (PINGS + 1)), so a round trip is
#: given up only with its connection, never while a late PONG may still come
#: (nats-py fails on a PONG for a PING whose wait was given up).
CONFIRM_TIMEOUT = 30
#: nats-py's own buffer for what is published while it reconnects (bytes).
PENDING_BYTES = 8 * 1024 * 1024
#: Messages and bytes one NATS subscription may hold undelivered before
#: nats-py drops (a slow consumer, counted).
SUB_PENDING_MESSAGES = 65_536
SUB_PENDING_BYTES = 64 * 1024 * 1024

DROP_REASONS = (
    "not_exported",  # the key matches no ``export`` pattern
    "not_imported",  # a key from another host matches no ``import`` pattern
    "secret",  # an identity (!/cred/) key: never crosses
    "bus_full",  # the bus did not read what came from NATS fast enough
    "nats_refused",  # nats-py refused a publish (its reconnect buffer full, too large)
    "bad_subject",  # a message on a subject no key maps to
    "too_large",  # a message from NATS too large for an sbus packet (MAX_PACKET)
)
# Not drops, counted apart (docs/nats.md, "Who counts what"): what NATS lost
# on the way here (natsorigins: per origin, by cause; nats-py's slow-consumer
# drops among them), and what a server that went away never confirmed
# (``unconfirmed_total``: at most lost, an upper bound the receivers' counts settle).
#: Bytes of an sbus packet beyond its key and payload: "MSG " and the NUL.
PACKET_OVERHEAD = 5


async def write_held(nc: Any, timeout: float) -> None:
    """Have nats-py write out what it holds (SUB, PUB...) before a round trip:
    its ``flush()`` writes the PING straight to the socket, ahead of what it
    still holds, so a PONG alone does not say the server read those.  (A forced
    flush of nats-py 2.x, which ``pyproject.toml`` keeps to; it waits for ever
    on a connection that goes away meanwhile, hence ``timeout``.)"""
    await asyncio.wait_for(nc._flush_pending(force_flush=True), timeout)


_envelope_client: Any = None


def envelope_client() -> Any:
    """nats-py's client, writing and reading the envelope header itself.

    fleet: nats-py builds a header section per message with a regular
    expression and parses each it receives into a dict, the larger part of
    what the envelope costs (docs/decisions.md); this one writes the one
    header it sends whole (``natsenvelope.hpub``) and reads a section that
    holds nothing else with one comparison (``natsenvelope.from_block``),
    anything else as nats-py does.  Made on first use: a bus without NATS
    never imports nats-py."""
    global _envelope_client
    if _envelope_client is None:
        import nats.errors
        from nats.aio.client import Client

        class _EnvelopeClient(Client):
            async def publish_enveloped(self, subject: bytes, payload: bytes, value: str) -> None:
                """``publish(subject, payload, headers={HEADER: value})``, as
                nats-py does it (its checks, counters and buffering)."""
                if self.is_closed:
                    raise nats.errors.ConnectionClosedError
                if self.is_draining_pubs:
                    raise nats.errors.ConnectionDrainingError
                size = len(payload)
                if not self.is_connected and (
                    self._max_pending_size <= 0
                    or size + self._pending_data_size > self._max_pending_size
                ):
                    raise nats.errors.OutboundBufferLimitError
                if size > self._max_payload:
                    raise nats.errors.MaxPayloadError
                self.stats["out_msgs"] += 1
                self.stats["out_bytes"] += size
                await self._send_command(natsenvelope.hpub(subject, value, payload))
                if self._flush_queue is not None and self._flush_queue.empty():
                    await self._flush_pending()

            async def _process_headers(self, headers: Any) -> Any:
                value = natsenvelope.from_block(headers) if headers else None
                if value is not None:
                    return {natsenvelope.HEADER: value}
                return await super()._process_headers(headers)

        _envelope_client = _EnvelopeClient
    return _envelope_client()


class NatsBridge:
    """One host's presence on NATS (see the module's theory of operation)."""

    def __init__(self, sock: socket.socket, config: NatsConfig, host: str, log: Any) -> None:
        self.config = config
        self.host = host
        self.log = log.bind(nats_host=host)
        self.map = SubjectMap(config.subject_prefix)
        self._sock = sock
        self._sock.setblocking(False)
        self._fd = sock.fileno()
        # --- state, written by the bridge's thread only ---
        self.state = "starting"  # starting, connecting, connected, reconnecting, closed
        self.connected = False
        self.server = ""  # the URL of the server connected to
        self.sent = self.sent_bytes = self.received = self.received_bytes = 0
        self.drops: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        #: messages handed to a server that went away before confirming them
        self.unconfirmed_total = 0
        #: messages nats-py dropped because a subscription fell behind
        self.slow_consumer = 0
        self.reconnects = 0
        self.rtt = 0.0
        #: ``sent`` when the server last confirmed all it had been handed
        self.confirmed = 0
        self._trip: asyncio.Future[None] | None = None  # the round trip in flight
        self._trip_done = 0.0  # when the last round trip ended (monotonic)
        #: when the bridge last had applied at the server all it read from the bus
        self.synced = 0.0
        self.local = natsinterest.LocalInterest()
        # fleet: our subscriptions, what we send whom, what we get from whom
        self.subs = natssubs.Subscriptions()
        self.ledger = natsledger.Ledger(host, self.local.incarnation, config.publish)
        self.origins = natsorigins.Origins(host, self.local.incarnation, self.subs)
        self.remote = natsinterest.RemoteInterest(
            secrets=config.identities,
            always=config.publish,
            watchers=(self.ledger, self.origins),
        )
        #: the prefix of this host's identities when they cross (None: they stay home)
        self.identity = natsinterest.host_identity(host) if config.identities else None
        self._subs: dict[bytes, Any] = {}  # relaxed pattern -> nats-py Subscription or None
        self._releasing = False  # a release of what came from other hosts is scheduled
        self._answering = False  # a snapshot answering the requests meanwhile is scheduled
        #: key -> subject and subject -> key, bounded (cleared whole when full)
        self._subjects: dict[bytes, bytes] = {}
        self._keys: dict[str, bytes] = {}
        self._export = self._filter(config.export)
        self._import = self._filter(config.import_)
        self._watching = False
        self._closing = False
        self._erred = False  # an error was said since the link was last up
        self._twins: set[int] = set()  # other incarnations heard under our name
        self._announce_soon = False
        self._nc: Any = None
        self._long = self.map.long.decode("ascii")
        self._long_b = self.map.long
        self._writer: BusWriter | None = None  # made in the bridge's loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._readable: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    @staticmethod
    def _filter(patterns: tuple[bytes, ...]) -> SubscriptionIndex | None:
        if patterns == (b"",):
            return None  # every public key: no lookup
        index: SubscriptionIndex = SubscriptionIndex()
        for p in patterns:
            index.add(0, p)
        return index

    # --- the bus's thread ------------------------------------------------------

    def start(self) -> None:
        """Run the bridge in a thread of its own (returns at once)."""
        self._thread = threading.Thread(target=self._main, name="nats-link", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Say goodbye to the other hosts, close the NATS connection, end the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._done.wait(timeout)

    @property
    def remote_hosts(self) -> int:
        return self.remote.live

    @property
    def silent_hosts(self) -> int:
        return len(self.remote.hosts) - self.remote.live

    @property
    def remote_patterns(self) -> int:
        return len(self.remote.union)

    @property
    def subscriptions(self) -> int:
        return len(self._subs)

    @property
    def unconfirmed(self) -> int:
        """Messages handed to the server that it has not confirmed yet."""
        confirmed = self.confirmed  # first: ``sent`` only grows
        return max(0, self.sent - confirmed)

    @property
    def to_bus_queued(self) -> int:
        return self._writer.queued if self._writer is not None else 0

    @property
    def settled(self) -> bool:
        """The bus has been told the other hosts' interest is known."""
        return self._writer is not None and self._writer.settled

    # --- the bridge's thread ---------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception:  # a bug of ours: said once; the bus serves on without NATS
            self.log.exception("nats.bridge_failed")
        finally:
            self.state = "closed"
            self.connected = False
            self._done.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(self._unexpected)
        self._stop = asyncio.Event()
        self._readable = asyncio.Event()
        self._writer = BusWriter(self._sock, self._loop)
        self._tell_bus(self.remote.initial())  # the patterns published whoever wants them
        reader = asyncio.create_task(self._read_bus())
        ticker = asyncio.create_task(self._tick())
        counting = asyncio.create_task(self._count())
        confirming = asyncio.create_task(self._confirm())
        connecting = asyncio.create_task(self._connect())
        try:
            await self._stop.wait()
        finally:
            connecting.cancel()  # a server that never lets us in must not hold up a stop
            with contextlib.suppress(BaseException):
                await connecting
            reader.cancel()
            ticker.cancel()
            counting.cancel()
            confirming.cancel()
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
                self._writer.stop()
            await self._close()

    def _unexpected(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What a callback or task of the loop raised: one log line, never a
        traceback on the bus's stderr; the link goes on."""
        error = context.get("exception")
        self.log.error(
            "nats.bridge_error",
            message=str(context.get("message", "")),
            error=repr(error) if error is not None else "",
        )

    async def _close(self) -> None:
        nc = self._nc
        if nc is None:
            return
        self._closing = True
        if nc.is_connected:
            with contextlib.suppress(Exception):
                await self._announce([self.local.goodbye()])
                await write_held(nc, 1)
                await nc.flush(timeout=1)
        with contextlib.suppress(Exception):
            await nc.close()
        self.log.info("nats.closed", sent=self.sent, received=self.received)

    def _connect_options(self) -> dict[str, Any]:
        c = self.config
        options: dict[str, Any] = {
            "servers": list(c.servers),
            "name": "sbus-relay " + self.host,
            "no_echo": True,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": RECONNECT_WAIT,
            "connect_timeout": CONNECT_TIMEOUT,
            "ping_interval": PING_INTERVAL,
            "max_outstanding_pings": PINGS,
            "pending_size": PENDING_BYTES,
            "skip_subject_validation": True,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
        }
        if c.user is not None:
            options["user"], options["password"] = c.user, c.password
        if c.token is not None:
            options["token"] = c.token
        if c.creds is not None:
            options["user_credentials"] = c.creds
        if c.nkey is not None:
            options["nkeys_seed"] = c.nkey
        if c.tls_ca is not None or any(s.startswith("tls://") for s in c.servers):
            options["tls"] = ssl.create_default_context(cafile=c.tls_ca)
        return options

    async def _connect(self) -> None:
        """Connect, retrying with back-off while no server can be reached (the
        bus serves its own clients meanwhile; what it publishes for NATS waits)."""
        assert self._stop is not None
        delay = RECONNECT_WAIT
        failures = 0
        self.state = "connecting"
        while not self._stop.is_set():
            try:
                nc = envelope_client()
                await nc.connect(**self._connect_options())
                self._nc = nc
            except Exception as e:
                failures += 1
                say = self.log.warning if failures == 1 else self.log.info
                say("nats.connect_failed", error=str(e) or type(e).__name__, retry_in=delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                delay = min(delay * 2, CONNECT_BACKOFF_MAX)
                continue
            await self._joined(first=True)
            return

    async def _joined(self, *, first: bool) -> None:
        """Connected (the first time or again): subscribe, announce, ask, read on."""
        nc = self._nc
        self.server = str(nc.connected_url.netloc) if nc.connected_url else ""
        if first and self._loop is not None:
            self._loop.call_later(INTEREST_SETTLE, self._settle)
        if first:
            await nc.subscribe(
                self.map.interest_all.decode(), cb=self._on_interest, pending_msgs_limit=-1
            )
            await nc.subscribe(self.map.snapshot.decode(), cb=self._on_snapshot_asked)
            await nc.subscribe(
                self._long,
                cb=self._on_long,
                pending_msgs_limit=SUB_PENDING_MESSAGES,
                pending_bytes_limit=SUB_PENDING_BYTES,
            )
            await nc.subscribe(self.map.ledger_of(self.host).decode(), cb=self._on_count)
        for r in list(self._subs):
            if self._subs[r] is None:
                await self._subscribe(r)
        await self._announce(self.local.snapshot())
        await nc.publish(self.map.snapshot.decode(), b"")
        self.connected = True
        await self._send_counts(self.ledger.cuts())  # fleet: owed while away
        self.state = "connected"
        self._erred = False
        self.log.info("nats.connected", server=self.server, patterns=len(self.local.patterns))
        if first or self._loop is None:
            self._reading(True)
        else:
            # what was held while away waits a moment more: the other hosts of a
            # restarted server reconnect and resubscribe meanwhile, and then it reaches them
            self._loop.call_later(RESUME_GRACE, self._resume)

    def _settle(self) -> None:
        """The other hosts have had time to answer: what they want is known."""
        assert self._writer is not None
        self._writer.settle()

    def _resume(self) -> None:
        if self.connected:
            self._reading(True)

    def _reading(self, on: bool) -> None:
        """Watch the bus's end for packets (while NATS is there), or stop."""
        loop, readable = self._loop, self._readable
        assert loop is not None and readable is not None
        if on and not self._watching:
            loop.add_reader(self._fd, readable.set)
            readable.set()  # read what waited meanwhile
        elif not on and self._watching:
            loop.remove_reader(self._fd)
        self._watching = on

    async def _on_disconnected(self) -> None:
        if self.connected and not self._closing:
            self.log.warning("nats.lost", server=self.server)
        self._unconfirmed_lost()
        self.origins.link_down()  # fleet: a loss counted from now on is this link's
        self.connected = False
        self.state = "reconnecting"
        self._reading(False)

    async def _on_reconnected(self) -> None:
        self.reconnects += 1
        await self._joined(first=False)

    async def _on_error(self, e: Exception) -> None:
        import nats.errors

        if isinstance(e, nats.errors.SlowConsumerError):
            self.slow_consumer += 1
            self.origins.slow_consumer()  # fleet: the losses it causes are counted there
            return
        # the first error while away is news (a refused sign-in, say); its repeats are not
        say = self.log.debug if self._erred else self.log.warning
        self._erred = not self.connected
        say("nats.error", error=str(e) or type(e).__name__)

    # --- bus -> NATS -------------------------------------------------------------------

    async def _read_bus(self) -> None:
        assert self._readable is not None
        while True:
            await self._readable.wait()
            self._readable.clear()
            if not self.connected:
                # NATS is away: what the bus sends waits in its queue, unread
                # (the reader is level-triggered: it would wake us in a loop)
                self._reading(False)
                continue
            changed = False
            for _ in range(READ_BATCH):
                try:
                    packet = self._sock.recv(MAX_PACKET)
                except BlockingIOError:
                    break
                except OSError:
                    return
                if not packet:
                    await self._stop_now()
                    return
                changed = await self._from_bus(packet) or changed
                if not self.connected:
                    break
            else:
                self._readable.set()  # more may wait: after NATS's own work
                await asyncio.sleep(0)
            self._schedule_announce()
            if changed and self.connected:
                with contextlib.suppress(Exception):
                    # the server has our SUBs.  Never a shorter wait than a
                    # confirmation's: a PONG that comes after its wait was given up
                    # stops nats-py's reader for good (InvalidStateError), and a
                    # bus busy with a flood of announcements is slow to read it
                    await write_held(self._nc, CONFIRM_TIMEOUT)
                    await self._nc.flush(timeout=CONFIRM_TIMEOUT)
            self.synced = time.monotonic()

    async def _stop_now(self) -> None:
        assert self._stop is not None
        self._stop.set()

    async def _from_bus(self, packet: bytes) -> bool:
        """Act on one packet from the bus; True if it changed our interest."""
        if packet.startswith(codec.MSG):
            nul = packet.find(b"\0", 4)
            await self._publish(packet[4:nul], packet[nul + 1 :])
        elif packet.startswith(codec.BATCH_HEAD):
            offset = len(codec.BATCH_HEAD)
            while offset + 4 <= len(packet):
                size = read_u32(packet, offset)
                msg = packet[offset + 4 : offset + 4 + size]
                offset += 4 + size
                nul = msg.find(b"\0", 4)
                await self._publish(msg[4:nul], msg[nul + 1 :])
        elif packet.startswith(codec.SUB):
            await self._local(packet[len(codec.SUB) :], True)
            return True
        elif packet.startswith(codec.UNSUB):
            await self._local(packet[len(codec.UNSUB) :], False)
            return True
        return False

    async def _publish(self, key: bytes, payload: bytes) -> None:
        if is_secret(key):
            # to another host's identity (held here only for its owner), or never
            if self.identity is None or key.startswith(self.identity):
                self.drops["secret"] += 1
                return
        elif self._export is not None and not self._export.match(key):
            self.drops["not_exported"] += 1
            return
        subjects = self._subjects
        subject = subjects.get(key)
        if subject is None:
            subject = self.map.subject(key)
            if len(key) <= MATCH_CACHE_KEY_MAX:  # a long key is mapped afresh, not kept
                if len(subjects) >= MAPPING_CACHE:
                    subjects.clear()
                subjects[key] = subject
        long = len(subject) > SUBJECT_MAX
        # fleet: its number, counted for every host that wants it (0: only
        # silent ones do, counted for them, not sent)
        seq = self.ledger.stamp_long() if long else self.ledger.stamp(key)
        if not seq:
            return
        value = self.ledger.value(seq)
        try:
            if not long:
                await self._nc.publish_enveloped(subject, payload, value)
            else:  # every host takes these and its bus keeps what it wants
                await self._nc.publish_enveloped(self._long_b, key + b"\0" + payload, value)
        except Exception:
            self.ledger.unstamp(key, long)  # fleet: counted here, not as a loss there
            self.drops["nats_refused"] += 1
            return
        self.sent += 1
        self.sent_bytes += len(payload)

    async def _local(self, pattern: bytes, present: bool) -> None:
        """One of this host's patterns came or went."""
        if not natsinterest.acceptable(pattern, owner=self.identity):
            return  # identities stay on their host, unless they cross
        if relaxed(pattern) is None:
            return  # it matches nothing: nobody needs to hear of it
        self.local.change(pattern, present)
        # fleet: a new subscription now; one whose last pattern went ends later (``_count``)
        r = self.subs.change(pattern, present, time.monotonic())
        if r is not None:
            self._subs[r] = None
            await self._subscribe(r)

    async def _unsubscribe(self, r: bytes) -> None:
        """A subscription's grace is over (``natssubs.UNSUB_GRACE``)."""
        sub = self._subs.pop(r, None)
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _subscribe(self, r: bytes) -> None:
        subject = self.map.subscription(r)
        if subject is None or len(subject) > SUBJECT_MAX or not self._nc:
            return
        try:
            self._subs[r] = await self._nc.subscribe(
                subject.decode("ascii"),
                cb=self._receiver(r),
                pending_msgs_limit=SUB_PENDING_MESSAGES,
                pending_bytes_limit=SUB_PENDING_BYTES,
            )
        except Exception as e:  # not connected now: subscribed on connect
            self.log.info("nats.subscribe_later", error=str(e) or type(e).__name__)

    def _schedule_announce(self) -> None:
        if not self._announce_soon and self._loop is not None:
            self._announce_soon = True
            self._loop.call_soon(lambda: asyncio.ensure_future(self._send_delta()))

    async def _send_delta(self) -> None:
        self._announce_soon = False
        if self.connected:
            await self._announce(self.local.delta())

    async def _announce(self, announcements: list[natsinterest.Announcement]) -> None:
        self.subs.announced(announcements)  # fleet: which subscriptions each names
        subject = self.map.interest_of(self.host).decode("ascii")
        for a in announcements:
            await self._nc.publish(subject, natsinterest.encode(a))

    # --- NATS -> bus ----------------------------------------------------------------------

    def _receiver(self, r: bytes) -> Any:
        async def receive(msg: Any) -> None:
            keys = self._keys
            key = keys.get(msg.subject)
            if key is None:
                subject = msg.subject.encode("ascii", "replace")
                try:
                    key = self.map.key(subject)
                except MappingError:
                    # counted once, by the subscription that would take it
                    other = self.map.lenient_key(subject)
                    if other is not None and self.subs.taker(r, other) is not None:
                        self.drops["bad_subject"] += 1
                    return
                if len(key) <= MATCH_CACHE_KEY_MAX:
                    if len(keys) >= MAPPING_CACHE:
                        keys.clear()
                    keys[msg.subject] = key
            # fleet: one of our subscriptions takes it (the others are given it too)
            took = self.subs.taker(r, key)
            if took is None:
                return
            headers = msg.headers
            if headers is None or natsenvelope.HEADER not in headers:
                if took[0]:
                    self._deliver(key, msg.data)  # a native NATS client's: nothing to check
                return
            self._arrived(headers[natsenvelope.HEADER], took[1], took[0], key, msg.data)

        return receive

    async def _on_long(self, msg: Any) -> None:
        """A key too long for a subject: the key, a NUL, the payload."""
        key, nul, data = msg.data.partition(b"\0")
        if not nul or not key:
            self.drops["bad_subject"] += 1
            return
        headers = msg.headers
        if headers is None or natsenvelope.HEADER not in headers:
            self._deliver(key, data)
        else:
            self._arrived(headers[natsenvelope.HEADER], None, True, key, data)

    async def _on_count(self, msg: Any) -> None:
        """Another host's count of what it sent us (``natsledger``)."""
        headers = msg.headers or {}
        got = self.origins.count(headers.get(natsenvelope.HEADER), msg.data, time.time())
        if got == natsorigins.FIRST:
            self._release_soon()

    def _arrived(
        self, value: str, holders: tuple[bytes, ...] | None, deliver: bool, key: bytes, data: bytes
    ) -> None:
        """fleet: a message of another host, held until ``_release`` puts its
        origin's messages in order (nats-py hands each subscription's over apart)."""
        got = self.origins.arrive(value, holders, deliver, (key, data), time.time())
        if got == natsorigins.FIRST:
            self._release_soon()

    def _release_soon(self) -> None:
        # after nats-py's tasks have handed over what it read in this turn
        if not self._releasing and self._loop is not None:
            self._releasing = True
            self._loop.call_soon(self._release)

    def _release(self) -> None:
        self._releasing = False
        for key, data in self.origins.release(time.time()):
            self._deliver(key, data)

    def _deliver(self, key: bytes, data: bytes) -> None:
        """A message from another host, for this host's bus (once per host)."""
        if is_secret(key):
            # only to this host's own identities, and only when they cross
            if self.identity is None or not key.startswith(self.identity):
                self.drops["secret"] += 1
                return
        elif self._import is not None and not self._import.match(key):
            self.drops["not_imported"] += 1
            return
        if len(key) + len(data) + PACKET_OVERHEAD > MAX_PACKET:
            self.drops["too_large"] += 1  # (a native NATS client's big payload)
            return
        assert self._writer is not None
        if self._writer.put(b"MSG " + key + b"\0" + data):
            self.received += 1
            self.received_bytes += len(data)
        else:
            self.drops["bus_full"] += 1

    async def _on_interest(self, msg: Any) -> None:
        try:
            host = decode_token(msg.subject.encode("ascii", "replace").rpartition(b".")[2])
        except MappingError:
            self.remote.refused += 1
            return
        name = host.decode("utf-8", "replace")
        if name == self.host:
            a = natsinterest.decode(msg.data)
            twins = self._twins
            # a live upgrade's other process, for a moment; or a host with our
            # name (said once; more of them are likely one flood of forgeries)
            if (
                a is not None
                and a.incarnation not in twins | {self.local.incarnation}
                and len(twins) < TWINS_LOGGED
            ):
                say = self.log.debug if twins else self.log.warning
                twins.add(a.incarnation)
                say("nats.host_name_shared", host=name, hint="set nats.host")
            return
        a = natsinterest.decode(msg.data)
        if a is None:
            self.remote.refused += 1
            return
        changes, ask = self.remote.receive(name, a, time.monotonic())
        self._tell_bus(changes)
        if self.connected:  # fleet: where that host's view changed (else once connected)
            await self._send_counts(self.ledger.cuts())
        if ask and self.connected:
            await self._nc.publish(self.map.snapshot.decode(), host)

    async def _on_snapshot_asked(self, msg: Any) -> None:
        if msg.data and msg.data.decode("utf-8", "replace") != self.host:
            return
        # one snapshot per interval however many ask (a flood costs one)
        wait = self.local.answer(time.monotonic())
        if wait:
            if not self._answering and self._loop is not None:
                self._answering = True
                self._loop.call_later(wait, lambda: asyncio.ensure_future(self._answer()))
            return
        if self.connected:
            await self._announce(self.local.snapshot())

    async def _answer(self) -> None:
        self._answering = False
        self.local.answer(time.monotonic())
        if self.connected:
            await self._announce(self.local.snapshot())

    def _tell_bus(self, changes: list[natsinterest.Change]) -> None:
        assert self._writer is not None
        for present, pattern in changes:
            self._writer.tell(pattern, present)

    async def _tick(self) -> None:
        """Heartbeats, forgetting silent hosts."""
        while True:
            await asyncio.sleep(natsinterest.HEARTBEAT)
            self._tell_bus(self.remote.expire(time.monotonic()))
            if self.connected:
                with contextlib.suppress(Exception):
                    await self._announce([self.local.heartbeat()])

    # --- fleet: counts, subscriptions' grace, loss episodes ----------------------------------

    async def _count(self) -> None:
        """Every ``LEDGER_INTERVAL``: subscriptions whose grace is over end,
        the counts due go out, loss episodes go on or end."""
        while True:
            await asyncio.sleep(natsledger.LEDGER_INTERVAL)
            for r in self.subs.due(time.monotonic()):
                await self._unsubscribe(r)
            if self.connected:
                await self._send_counts(self.ledger.due(time.monotonic()))
            self.origins.tick(time.time())
            for event, fields in self.origins.reports():
                self.log.warning(event, **fields)

    async def _send_counts(self, counts: list[tuple[str, str, bytes]]) -> None:
        """Counts for other hosts (``natsledger``), on this connection after the data."""
        if not counts or not self.connected:
            return
        for host, value, payload in counts:
            with contextlib.suppress(Exception):
                await self._nc.publish_enveloped(self.map.ledger_of(host), payload, value)

    # --- what the server confirmed --------------------------------------------------------

    async def _confirm(self) -> None:
        """Confirm what was published, every CONFIRM_SECONDS while some is not
        (and every HEARTBEAT anyway, for the round-trip time): one round trip
        at a time on a connection."""
        try:
            while True:
                await asyncio.sleep(CONFIRM_SECONDS)
                if self._trip is not None or not self.connected or self._nc is None:
                    continue
                due = self.sent > self.confirmed
                if due or time.monotonic() - self._trip_done >= natsinterest.HEARTBEAT:
                    self._trip = asyncio.ensure_future(self._round_trip(self._nc))
                    self._trip.add_done_callback(self._trip_ended)
        finally:
            if self._trip is not None:
                self._trip.cancel()

    def _trip_ended(self, trip: asyncio.Future[None]) -> None:
        if self._trip is trip:
            self._trip = None
            self._trip_done = time.monotonic()

    async def _round_trip(self, nc: Any) -> None:
        """One PING and its PONG, after everything published so far is written
        (``write_held``: it returns once nats-py's writer has taken it, or when
        the trip is cancelled)."""
        upto = self.sent
        try:
            await write_held(nc, CONFIRM_TIMEOUT)
            if not self.connected:
                return  # what it holds goes to the next server: not confirmed here
            start = time.monotonic()
            await nc.flush(timeout=CONFIRM_TIMEOUT)
        except Exception:
            return  # nothing confirmed; the connection's loss counts it, if lost
        self.rtt = time.monotonic() - start
        self.confirmed = max(self.confirmed, upto)

    def _unconfirmed_lost(self) -> None:
        """The connection is gone: what its server did not confirm is counted
        (at most lost: some of it may have been taken, or may still wait in
        nats-py for the next server)."""
        if self._trip is not None:
            # its PONG will never come (nats-py may swallow the cancel: the trip
            # then ends by its timeout, confirming nothing new); the next
            # connection's trips need not wait for it
            self._trip.cancel()
            self._trip = None
        lost = self.sent - self.confirmed
        self.confirmed = self.sent
        if lost > 0 and not self._closing:
            self.unconfirmed_total += lost
            self.log.warning(
                "nats.unconfirmed",
                server=self.server,
                messages=lost,
                total=self.unconfirmed_total,
                hint="handed to a server that went away before confirming them: at most lost",
            )
