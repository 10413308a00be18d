"""One connection of the bus, in and out, and the router that joins them.

What it owns: one socket's bytes in and out (its descriptor, watchers,
pending, queue, pauses, counters) with its side jobs in the rare part
(Notices, Waiters, Warnings), and the routing of each message (Router).  What
it may touch: its own state, its Session part through that class's methods,
the recipients it offers to and the publishers it holds back, its handler
through Handler alone.

Theory of operation.  No greenlet exists per connection: the gevent hub calls
``Connection._on_readable`` when a socket has packets and ``_on_writable``
when a socket with a backlog can take more.  A connection is a client the
server accepted or, on a relay, the link to the upstream bus; both read,
queue, drop and count in the same code.  The path of one message, top to
bottom in this file:

1. ``Connection._on_readable`` reads up to ``READ_BATCH`` packets in one
   ``recvmmsg`` (``batchio.recv_many``) and hands each ``MSG`` to
   ``Router.publish`` (``protocol.frames`` parses it, and unpacks a packed
   batch's); any other packet goes to the connection's *handler* (the
   server, or the upstream link's controller), which asks the connection's
   ``Session`` what it means (``protocol.session``);
2. ``Router.publish`` finds the recipients with one ``match`` (on a relay the
   upstream link is one of them, holding the patterns the upstream wants)
   and offers the packet to each;
3. ``Connection.offer``: the recipient alone decides.  Shedding (a consumer
   that fell behind): count the drop, nothing more.  Nothing waiting before
   it: the packet joins ``pending``, to go with the rest of the batch (in
   soft/block it is sent at once, since that mode must pause the publisher
   at the very packet its socket refuses).  Otherwise ``deliver``:
   ``protocol.flood`` decides -- queue, queue and pause the publisher, drop,
   or disconnect -- and the connection carries it out;
4. at the end of the batch ``Router.flush`` has each recipient send its
   ``pending`` list in one ``sendmmsg`` (``Connection.flush``); what its
   socket refuses goes through ``deliver``, in order.

A connection *is* a ``protocol.session.Session``: its protocol state (open
or closing, echo, relay, interest, packed batches) and what each packet
does to it are decided there, without a socket; this class moves the bytes
and runs the timers.  Everything about a connection's way out is its own:
its queue and modes, its counters, its drop episodes and its warnings (``protocol.episodes``: one
line when something begins, a bounded rate while it lasts, one when it
ends).  The server only matches and offers.

Pauses: a publisher is not read while a client in a block mode it filled is
``flood.still_blocked``, nor while the server holds one of its packets (a
relay waiting for its identity prefix).  Pauses are counted, so each release
resumes exactly one.  Interest notices (to a relay below: ``CMSG
interest/add``; to the upstream: ``SUB``/``UNSUB``) wait coalesced per
pattern in ``notices`` and go before the queue.  That, the publishers it
holds back, a stash of packets read while paused, its write watcher, its
episodes and its logger live in a ``_Rare`` part made on first need: an
idle client has none of them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any, Protocol

import gevent

from sbus_relay.accel import compiled, load_compiled
from sbus_relay.protocol import codec, control, episodes
from sbus_relay.protocol.episodes import Episode, Episodes
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.flood import (
    DEFAULT_HARD,
    DEFAULT_SOFT,
    Action,
    OutboundQueue,
    decide,
    decide_reply,
    shedding_ends,
    still_blocked,
)
from sbus_relay.protocol.frames import is_batch, msg_key, unpack
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.keys import BANG, Credentials, valid_key
from sbus_relay.protocol.limits import (
    EPISODE_QUIET,
    MAX_PACKET,
    NOTICE_BATCH,
    READ_BATCH,
    WRITE_BATCH,
)
from sbus_relay.protocol.quota import Account
from sbus_relay.protocol.scan import size_of
from sbus_relay.protocol.stats import Stats

from .batchio import borrowed, recv_many, send_all, send_one, send_packed

if not compiled():
    try:
        import cython
    except ImportError:  # Cython is needed only to build the compiled path
        from sbus_relay.accel import NotCompiled as cython
else:
    # The compiled twin replaces this module at its end: until then only
    # ``cython.compiled`` is read, so Cython's shadow module (1.5 MiB) stays out.
    from sbus_relay.accel import NotCompiled as cython
if not cython.compiled:  # compiled, the base class is cimported (_c_connection.pxd)
    from sbus_relay.protocol.session import Session

_BATCH = codec.BATCH_HEAD
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT
_READ = 1
_WRITE = 2
_QUEUE = Action.QUEUE
_WAIT_EMPTY = Action.QUEUE_AND_WAIT_EMPTY
_WAIT_BELOW = Action.QUEUE_AND_WAIT_BELOW
_DISCONNECT_ACTION = Action.DISCONNECT
_DROP_REPLY = Action.DROP_HARD.value
_ENDED = episodes.ENDED
_monotonic = time.monotonic
#: reasons a connection ends by itself or by the server's own shutdown: logged at info
_ORDINARY = frozenset({"closed", "server_stopping"})
#: the episode of messages dropped for one connection (docs/observability.md)
DROPPING = "flood.drop"
#: what a connection holds, as a hand-over carries it (``Connection.held``)
Held = tuple[
    list[bytes], list[float], "dict[bytes, bool] | None", "list[bytes | None] | None", bool, bool
]


class Handler(Protocol):
    """Who a connection reports to: the server for a client, the upstream link's
    controller for the link."""

    def handle(self, conn: Connection, packet: bytes) -> None:
        """Act on one packet that is not a ``MSG``."""

    def lost(self, conn: Connection, reason: str, detail: str) -> None:
        """The connection failed (closed by its peer, bad input, an I/O error)."""

    def forget(self, conn: Connection) -> None:
        """``conn`` has closed for good: drop what is held for it."""


class Router:
    """Matches each published key once and offers the packet to every recipient."""

    def __init__(
        self,
        index: SubscriptionIndex,
        stats: Stats,
        log: Any,
        queue_bytes: int,
        queue_messages: int,
    ) -> None:
        self.index = index
        self.stats = stats
        #: the log each connection binds its own fields to, when it first has
        #: something to say
        self.log = log
        #: the hard limits of a client's queue, made when it first needs one
        self.queue_bytes = queue_bytes
        self.queue_messages = queue_messages
        self.loop = gevent.get_hub().loop
        #: connections that were offered packets during the current read batch
        self.dirty: list[Connection] = []
        #: when the current read batch began: the time a packet queued during it
        #: waits from (one clock read per batch, not per packet)
        self.now = 0.0

    def publish(self, sender: Connection, packet: bytes, key: bytes) -> None:
        """Offer one ``MSG`` packet to everyone whose patterns match ``key``."""
        if BANG in key and not valid_key(key):
            self.stats.drops["reserved_key"] += 1
            return
        for conn in self.index.match(key):
            if conn is not sender or conn.echo:
                conn.offer(packet, sender)

    def flush(self, sender: Connection) -> None:
        """End of a read batch: every recipient sends what it was offered."""
        dirty = self.dirty
        if dirty:
            self.dirty = []
            for conn in dirty:
                conn.flush(sender)


class Notices:
    """The interest notices a connection owes its peer, coalesced per pattern
    (the net change: a pattern added then removed is nothing to say), and
    ``interest/ready`` once those owed with it have gone.  To a relay below
    each is ``CMSG interest/add|remove``, to the upstream ``SUB``/``UNSUB``.
    Made when the first is owed; its connection drops it once all went."""

    __slots__ = ("owed", "ready_owed")

    def __init__(self, owed: dict[bytes, bool] | None = None, ready_owed: bool = False) -> None:
        #: pattern -> present, in the order they became owed
        self.owed: dict[bytes, bool] = {} if owed is None else owed
        #: ``interest/ready`` goes once ``owed`` is empty
        self.ready_owed = ready_owed

    def add(self, pattern: bytes, present: bool) -> None:
        """``pattern`` came (``present``) or went, coalesced with what is owed of it."""
        owed = self.owed
        if pattern in owed:
            del owed[pattern]  # add then remove (or remove then add): nothing to say
        else:
            owed[pattern] = present

    def send(self, fd: int, upward: bool) -> bool:
        """Send what is owed, at most ``NOTICE_BATCH`` a call (a large snapshot
        goes out between other work); True once nothing is left."""
        owed = self.owed
        for _ in range(NOTICE_BATCH):
            if not owed:
                break
            pattern, present = owed.popitem()
            if upward:
                packet = codec.encode_subscription(pattern, present)
            else:
                packet = control.interest(pattern, present)
            try:
                send_one(fd, packet)
            except BlockingIOError:
                owed[pattern] = present
                return False
        if owed:
            return False
        if self.ready_owed:
            try:
                send_one(fd, control.INTEREST_READY_PACKET)
            except BlockingIOError:
                return False
            self.ready_owed = False
        return True


class Waiters:
    """The publishers a connection holds back: each paused (``pause``) by an
    action of its flood control until its queue has room again
    (``flood.still_blocked``), once per publisher and action."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: list[tuple[Connection, Action]] = []

    def add(self, publisher: Connection, action: Action) -> bool:
        """Hold ``publisher`` back for ``action``; False if it is already."""
        for held, why in self.held:
            if held is publisher and why is action:
                return False
        self.held.append((publisher, action))
        return True

    def wake(self, q: OutboundQueue) -> bool:
        """Resume those ``q`` no longer blocks; True once none is held."""
        held = self.held
        keep = [(p, a) for p, a in held if p.alive and still_blocked(a, q)]
        if len(keep) == len(held):
            return not keep
        self.held = keep
        for publisher, action in held:
            if publisher.alive and not still_blocked(action, q):
                publisher.resume()
        return not keep

    def release(self) -> None:
        """Resume every one of them (their holder closes)."""
        held, self.held = self.held, []
        for publisher, _ in held:
            if publisher.alive:
                publisher.resume()


class Warnings:
    """A connection's episodes (``protocol.episodes``): its drop episode, its
    repeated warnings, and the timer that reports them every
    ``EPISODE_QUIET`` seconds while any is open.  Made at the first; the
    lines go to its connection's logger (``report``)."""

    __slots__ = ("dropping", "episodes", "tick")

    def __init__(self) -> None:
        self.episodes = Episodes()
        self.dropping: Episode | None = None  # the open drop episode, if any
        self.tick: Any = None  # the timer, while any episode is open

    def begin(self, event: str, tell_end: bool, loop: Any, on_tick: Any) -> Episode | None:
        """An occurrence of ``event``: its episode if one begins now (say it),
        None if one is open (counted); the timer runs from now on."""
        if self.tick is None:
            self.tick = loop.timer(EPISODE_QUIET, EPISODE_QUIET)
            self.tick.start(on_tick)
        return self.episodes.begin(event, _monotonic(), tell_end=tell_end)

    def due(self) -> list[tuple[str, Episode]]:
        """What a tick reports; the timer stops once no episode is open."""
        reports = self.episodes.tick(_monotonic())
        if not self.episodes:
            self.stop()
        return reports

    def close(self) -> list[tuple[str, Episode]]:
        """Every open episode ends (its connection closes); what to report."""
        reports = self.episodes.close()
        self.stop()
        return reports

    def report(self, log: Any, reports: list[tuple[str, Episode]]) -> None:
        """One line per report; the drop episode is over once it ended."""
        now = _monotonic()
        for what, episode in reports:
            if episode is self.dropping and what is _ENDED:
                self.dropping = None
            log.warning(
                episode.event + "." + what,
                count=episode.count,
                seconds=round(now - episode.since, 3),
            )

    def stop(self) -> None:
        if self.tick is not None:
            self.tick.close()
            self.tick = None

    def freeze(self) -> None:
        if self.tick is not None:
            self.tick.stop()

    def thaw(self, on_tick: Any) -> None:
        if self.tick is not None:
            self.tick.start(on_tick)


class _Rare:
    """What a connection needs only once it has more to do than deliver at
    once: packets read while it was paused, a backlog to write, and its side
    jobs -- notices to send (``Notices``), publishers it holds back
    (``Waiters``), episodes to report (``Warnings``) -- and a logger.  Made
    on first need (``Connection._more``) and written by its connection alone,
    so that an idle client carries one pointer for all of it."""

    __slots__ = (
        "log",
        "notices",
        "retry",
        "stash",
        "waiters",
        "warnings",
        "write_watcher",
        "writing",
    )

    def __init__(self, log: Any) -> None:
        #: its bound logger, made on first use (``Connection.log``); given for the link
        self.log = log
        #: packets read but not handled yet because the connection was paused
        self.stash: list[bytes | None] | None = None
        self.retry = False  # the packet being handled is handled again on resume
        self.write_watcher: Any = None
        self.writing = False  # the write watcher is started
        self.waiters: Waiters | None = None
        self.notices: Notices | None = None
        self.warnings: Warnings | None = None


class Connection(Session):
    """A socket of the bus and everything about its way in and its way out.

    Its protocol state and what each packet does to it are its ``Session``
    part (``protocol.session``): this class moves the bytes.  It keeps its
    socket's file descriptor, not a socket object, and the state
    an idle client never needs in a ``_Rare`` made on demand: an idle client
    costs this object, its read watcher and its slot in the server's table."""

    __slots__ = (
        "_rare",
        "_read_watcher",
        "account",
        "batch",
        "bytes_in",
        "bytes_out",
        "cid",
        "dropped",
        "fd",
        "gid",
        "handler",
        "holding",
        "label",
        "msgs_in",
        "msgs_out",
        "open",
        "pattern_bytes",
        "pauses",
        "pending",
        "pid",
        "queue",
        "router",
        "shed",
        "since",
        "uid",
    )

    def __init__(
        self,
        router: Router,
        handler: Handler,
        fd: int,
        cid: int,
        creds: Credentials,
        account: Account,
        *,
        queue: OutboundQueue | None = None,
        log: Any = None,
        upward: bool = False,
    ) -> None:
        Session.__init__(self, upward)
        self.router = router
        self.handler = handler
        self.cid = cid
        #: its peer's credentials (SO_PEERCRED at accept), kept as plain numbers
        self.gid = creds.gid
        self.uid = creds.uid
        self.pid = creds.pid
        #: its queue, made when first needed (``_queue``): an idle client has none
        self.queue = queue
        self.account = account
        #: a packet may go straight to the socket: there is one, and (the link)
        #: the handshake is done
        self.open = False
        #: not in soft/block: a read batch's packets for this connection wait in
        #: ``pending`` and go out in one call at the end of the batch
        self.batch = True
        self.pending: list[bytes] | None = None
        #: what waits in its queue is held back for now (``opened``)
        self.holding = False
        #: the drop reason while new messages are shed without a send attempt
        #: (a stalled consumer then costs the others a counter increment)
        self.shed: str | None = None
        self.dropped = 0  # messages not delivered to this connection since it began
        #: its traffic (``/clients``, per-relay and per-user series, server totals)
        self.msgs_in = self.bytes_in = self.msgs_out = self.bytes_out = 0
        self.since = _monotonic()
        #: the server's relay label of this client (``accounting``): ``local``
        #: until it says it is a relay
        self.label = "local"
        self.pattern_bytes = 0  # bytes of the distinct patterns it holds
        #: reasons this connection is not being read (block modes, a held packet)
        self.pauses = 0
        #: the rest of its state, made on first need (the link's, for its logger)
        self._rare: _Rare | None = None if log is None else _Rare(log)
        self._read_watcher: Any = None
        self.fd = -1  # its socket's descriptor; -1 while it has none
        if fd >= 0:
            self.attach(fd)
            self.open = not upward

    def _more(self) -> _Rare:
        """The rest of its state, made now if it had none."""
        rare = self._rare
        if rare is None:
            rare = self._rare = _Rare(None)
        return rare

    @property
    def log(self) -> Any:
        """This connection's logger (bound on first use: an idle client never pays for it)."""
        rare = self._more()
        if rare.log is None:
            rare.log = self.router.log.bind(**self.who())
        return rare.log

    def who(self) -> dict[str, int]:
        """Who it is, as its log lines say."""
        return {"client": self.cid, "pid": self.pid, "uid": self.uid, "gid": self.gid}

    @property
    def creds(self) -> Credentials:
        """Its peer's credentials."""
        return Credentials(self.gid, self.uid, self.pid)

    # --- its queue and flood-control modes (``protocol.flood``) ----------------------

    def _queue(self) -> OutboundQueue:
        """Its queue, made now if it had none."""
        q = self.queue
        if q is None:
            router = self.router
            q = self.queue = OutboundQueue(router.queue_bytes, router.queue_messages, self.account)
        return q

    def set_flood(self, what: str, value: str) -> None:
        """``CMSG blocking/soft|hard/...`` or ``order/...`` (``flood.parse_flood_control``)."""
        q = self._queue()
        self.shed = None  # decided afresh on the next message
        if what == "soft":
            q.soft = value
        elif what == "hard":
            q.hard = value
        else:
            q.set_order(value)
        # soft/block pauses the publisher at the very packet refused: never batched
        self.batch = q.soft != "block"

    def set_limits(self, max_bytes: int, max_messages: int) -> None:
        """New hard limits for its queue (a reload).  What is queued stays; under
        a lower limit the next message meets its hard mode, and a publisher or a
        shedding that a higher limit releases goes on at once."""
        q = self.queue
        if q is None:
            return  # made with the router's limits when first needed
        q.max_bytes = max_bytes
        q.max_messages = max_messages
        self._room_made(q)

    @property
    def queued(self) -> tuple[int, int]:
        """Messages and bytes waiting in its queue."""
        q = self.queue
        if q is None:
            return 0, 0
        return q.count, q.nbytes

    @property
    def modes(self) -> tuple[str, str]:
        """Its soft and hard flood-control modes."""
        q = self.queue
        if q is None:
            return DEFAULT_SOFT, DEFAULT_HARD
        return q.soft, q.hard

    @property
    def dropping(self) -> bool:
        """Whether messages for it are being dropped now (an open drop episode)."""
        return self._dropping() is not None

    def _dropping(self) -> Episode | None:
        """Its open drop episode, if any."""
        rare = self._rare
        if rare is None or rare.warnings is None:
            return None
        return rare.warnings.dropping

    @property
    def waiters(self) -> list[tuple[Connection, Action]]:
        """The publishers it holds back, with the action that paused each."""
        rare = self._rare
        return [] if rare is None or rare.waiters is None else list(rare.waiters.held)

    def _has_notices(self) -> bool:
        rare = self._rare
        return rare is not None and rare.notices is not None

    @property
    def owes_notices(self) -> bool:
        """Whether notices (or ``interest/ready``) wait to be written."""
        return self._has_notices()

    # --- its socket -------------------------------------------------------------

    def attach(self, fd: int) -> None:
        """Serve the socket ``fd`` (its own from now on, closed with it): read it
        from now on."""
        os.set_blocking(fd, False)
        self.fd = fd
        self._read_watcher = self.router.loop.io(self.fd, _READ)
        if not self.pauses:
            self._read_watcher.start(self)

    def detach(self) -> None:
        """Close the socket but keep everything else: what is pending and queued
        waits for the next ``attach`` (the upstream link across reconnects)."""
        self.open = False
        self.holding = False
        self.packs = False  # the next peer says again whether it reads them
        pending, self.pending = self.pending, None
        now = _monotonic()
        for packet in pending or ():
            self._queue().push(packet, now)
        rare = self._rare
        if rare is not None:
            rare.notices = None
            rare.stash = None
        self._close_socket()

    def _close_socket(self) -> None:
        if self._read_watcher is not None:
            self._read_watcher.close()
            self._read_watcher = None
        rare = self._rare
        if rare is not None:
            if rare.write_watcher is not None:
                rare.write_watcher.close()
                rare.write_watcher = None
            rare.writing = False
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- a live upgrade: frozen, then let go or thawed (``bus.handover``) -----------

    def freeze(self) -> None:
        """Stop every watcher and timer: nothing more is read or written here
        until ``thaw`` (the hand-over failed) or the process ends (it went)."""
        if self._read_watcher is not None:
            self._read_watcher.stop()
        rare = self._rare
        if rare is not None:
            if rare.write_watcher is not None:
                rare.write_watcher.stop()
            if rare.warnings is not None:
                rare.warnings.freeze()

    def thaw(self) -> None:
        """Undo ``freeze``: the hand-over failed and this process serves on."""
        if self._read_watcher is not None and not self.pauses:
            self._read_watcher.start(self)
        rare = self._rare
        if rare is None:
            return
        if rare.writing and rare.write_watcher is not None:
            rare.write_watcher.start(self._on_writable)
        if rare.warnings is not None:
            rare.warnings.thaw(self._on_tick)

    def let_go(self) -> None:
        """The connection lives on in a newer process: close this process's copy
        of its socket, and nothing else (its peer notices nothing)."""
        self.end("handed_over")
        self.open = False
        self._stop_ticking()
        self._close_socket()

    def held(self) -> Held:
        """Every packet it holds, as plain data, for a hand-over
        (``bus.handover``): its pending and queued packets in the order it
        would send them, with when each began to wait; its notices; what it
        read while paused; whether ``interest/ready`` is owed and whether the
        packet being handled is to be handled again."""
        packets: list[bytes] = list(self.pending or ())
        times: list[float] = [self.router.now] * len(packets)
        q = self.queue
        if q is not None:
            queued, waited = q.take(q.count)
            q.put_back(queued, waited)
            packets += queued
            times += waited
        rare = self._rare or _Rare(None)
        owed = rare.notices
        notices = None if owed is None else dict(owed.owed)
        stash = None if rare.stash is None else list(rare.stash)
        ready_owed = owed is not None and owed.ready_owed
        return packets, times, notices, stash, ready_owed, rare.retry

    def hold_again(self, held: Held) -> None:
        """Take back what ``held`` gave (in a newer process): its flood-control
        modes are set already; pauses are restored by whoever held them."""
        packets, times, notices, stash, ready_owed, retry = held
        if packets:
            q = self._queue()
            order = range(len(packets) - 1, -1, -1) if q.order == "stack" else range(len(packets))
            for i in order:
                q.push(packets[i], times[i])
        if ready_owed or retry or notices is not None or stash is not None:
            rare = self._more()
            rare.retry = retry
            if ready_owed or notices is not None:
                rare.notices = Notices(notices, ready_owed)
            rare.stash = stash
        if self.queued[0] or self._has_notices():
            self._want_write()

    # --- reading -------------------------------------------------------------

    def __call__(self) -> None:
        """The read watcher's callback is the connection itself (no bound
        method to keep per connection): its socket has packets."""
        self._on_readable()

    def _on_readable(self) -> None:
        """The hub's callback: read a batch of packets and hand them over."""
        if self.fd < 0:
            return  # closed since this callback was scheduled
        router = self.router
        router.now = _monotonic()
        msgs = nbytes = done = 0
        try:
            packets = None
            rare = self._rare
            if rare is not None and rare.stash is not None:
                packets, rare.stash = rare.stash, None
            if packets is None:
                packets = recv_many(self.fd, READ_BATCH)
            for packet in packets:
                done += 1
                if not packet:
                    if packet is None:
                        raise PeerError(
                            "protocol_error", "packet longer than %d bytes" % MAX_PACKET
                        )
                    self._zero_length()
                    return
                nbytes += len(packet)
                key = msg_key(packet)
                if key is not None:
                    msgs += 1
                    router.publish(self, packet, key)
                elif is_batch(packet):
                    msgs += self._publish_batch(packet)
                else:
                    router.flush(self)  # what was routed before it goes first
                    if self.fd < 0:
                        break  # a send of that (to itself: echo, a relay caught up) closed it
                    self.handler.handle(self, packet)
                if self.pauses:
                    rare = self._more()
                    if rare.retry:  # held for later: handle it again on resume
                        rare.retry = False
                        done -= 1
                    if done < len(packets) and self.fd >= 0:
                        rare.stash = packets[done:]
                    break
                if self.fd < 0:
                    break
        except PeerError as e:
            if e.reason == "protocol_error":  # a refused SUB was counted as a SUB
                router.stats.packets_in["invalid"] += 1
            self.fail(e.reason, e.detail)
        except OSError as e:
            self.fail("io_error", str(e))
        except Exception as e:  # a bug of ours: costs this one connection, never the server
            if router.stats.bug("read_loop"):  # logged once, counted always
                self.log.exception("client.internal_error")
            self.fail("internal_error", repr(e))
        finally:
            router.flush(self)
            self.msgs_in += msgs
            self.bytes_in += nbytes

    def _publish_batch(self, frame: bytes) -> int:
        """A packed batch: each MSG in it, in order, as if it had come alone
        (``frames.unpack``); how many there were."""
        packets, keys = unpack(frame)
        router = self.router
        n = len(packets)
        for i in range(n):
            router.publish(self, packets[i], keys[i])
        return n

    def _send_list(self, packets: list[bytes]) -> int:
        """Send ``packets`` in order, in one call where compiled (packed if its
        peer reads packed batches); how many the socket took."""
        sent: int
        if self.packs and len(packets) > 1:
            sent = send_packed(self.fd, packets, _BATCH)
        else:
            sent = send_all(self.fd, packets)
        return sent

    def _zero_length(self) -> None:
        """recv returned 0: the peer closed, or it sent an empty packet."""
        try:
            with borrowed(self.fd) as sock:
                more = sock.recv(1, _PEEK)
        except BlockingIOError:
            more = None  # still open: that was an empty packet
        except OSError:
            more = b""
        if more == b"":
            self.fail("closed", "")
        else:
            self.router.stats.packets_in["invalid"] += 1
            self.fail("protocol_error", "empty packet")

    def fail(self, reason: str, detail: str) -> None:
        """It failed: its handler decides (a client is closed, the link reconnects)."""
        if self.fd >= 0:
            self.handler.lost(self, reason, detail)

    def pause(self) -> None:
        """Stop reading this connection until a matching ``resume``."""
        self.pauses += 1
        if self.pauses == 1 and self._read_watcher is not None:
            self._read_watcher.stop()

    def resume(self) -> None:
        """Release one pause; read again once none is left."""
        self.pauses -= 1
        if self.pauses == 0 and self._read_watcher is not None:
            self._read_watcher.start(self)
            if self._rare is not None and self._rare.stash:
                self.router.loop.run_callback(self)  # what was read before the pause

    def hold(self) -> None:
        """The packet being handled must wait: stop reading, and handle it again on resume."""
        self._more().retry = True
        self.pause()

    # --- its way out -----------------------------------------------------------------

    def offer(self, packet: bytes, sender: Connection) -> None:
        """A message for this connection (``Router.publish``)."""
        shed = self.shed
        if shed is not None:
            self.drop(shed)
            return
        q = self.queue
        if self.open and (q is None or not q.count):
            if self.batch:
                pending = self.pending
                if pending is None:
                    self.pending = [packet]
                    self.router.dirty.append(self)
                else:
                    pending.append(packet)
                return
            try:
                send_one(self.fd, packet)
            except BlockingIOError:
                pass
            except OSError as e:
                self.fail("io_error", str(e))
                return
            else:
                self.msgs_out += 1
                self.bytes_out += len(packet)
                return
        self.deliver(packet, sender)

    def flush(self, sender: Connection) -> None:
        """Send what this read batch offered, in one call where compiled; what
        the socket does not take goes through flood control, in order."""
        pending, self.pending = self.pending, None
        if pending is None or not self.open:
            if pending is not None and self.alive:
                self._requeue(pending)
            return
        try:
            sent = self._send_list(pending)
        except OSError as e:
            self.pending = pending  # counted as lost with the queue, or kept by the link
            self.fail("io_error", str(e))
            return
        total = len(pending)
        if sent:
            self.msgs_out += sent
            self.bytes_out += size_of(pending, sent)
        for i in range(sent, total):
            self.deliver(pending[i], sender)

    def _requeue(self, packets: list[bytes]) -> None:
        q = self._queue()
        now = _monotonic()
        for packet in packets:
            q.push(packet, now)

    def deliver(self, packet: bytes, sender: Connection) -> None:
        """The slow path: the socket is full, closed for now, or a backlog waits.
        ``protocol.flood`` decides and this method carries it out."""
        if not self.alive:
            return
        q = self._queue()
        action = decide(q)
        if action is _QUEUE:  # the common case: a stalled consumer's queue fills here
            q.push(packet, self.router.now)
            if self.open:
                self._want_write()
        elif action is _WAIT_EMPTY or action is _WAIT_BELOW:
            q.push(packet, self.router.now)
            self._want_write()
            # the upstream link is never paused: one slow local client must
            # not stop what comes down for everyone else
            if sender.alive and not sender.upward:
                self.hold_back(sender, action)
        elif action is _DISCONNECT_ACTION:
            self._count_drop("slow_client_disconnected")
            self.close(
                "slow_client", "blocking/%s/error" % ("soft" if q.soft == "error" else "hard")
            )
        else:
            self.start_shedding(action.value)

    def hold_back(self, publisher: Connection, action: Action) -> None:
        """Pause ``publisher`` until this connection's queue has room again
        (``flood.still_blocked``), once per publisher and action (``Waiters``)."""
        rare = self._more()
        waiters = rare.waiters
        if waiters is None:
            waiters = rare.waiters = Waiters()
        if waiters.add(publisher, action):
            publisher.pause()

    def reply(self, packet: bytes) -> None:
        """Send a server-made reply (whoami, drops/count): never a reason to disconnect."""
        if not self.alive:
            return
        q = self._queue()
        if self.open and not q.count:
            try:
                send_one(self.fd, packet)
                return
            except BlockingIOError:
                pass
            except OSError as e:
                self.fail("io_error", str(e))
                return
        if decide_reply(q) is _QUEUE:
            q.push(packet, _monotonic())
            self._want_write()
        else:
            self.drop(_DROP_REPLY)

    def notify(self, pattern: bytes, present: bool) -> None:
        """A notice about ``pattern``; coalesced with any pending one for it."""
        if not self.alive:
            return
        self._owed().add(pattern, present)
        self._want_write()

    def owe_ready(self) -> None:
        """Send ``interest/ready`` once the notices pending now have gone."""
        self._owed().ready_owed = True
        self._want_write()

    def _owed(self) -> Notices:
        """Its notices, made now if it owed none."""
        rare = self._more()
        notices = rare.notices
        if notices is None:
            notices = rare.notices = Notices()
        return notices

    def _want_write(self) -> None:
        if not self.open:
            return  # written once the socket is there (and ready)
        rare = self._more()
        if rare.writing:
            return  # already waiting
        watcher = rare.write_watcher
        if watcher is None:
            watcher = rare.write_watcher = self.router.loop.io(self.fd, _WRITE)
        watcher.start(self._on_writable)
        rare.writing = True

    def opened(self, hold: bool = False) -> None:
        """The link is ready: packets may go straight to the socket, notices go at
        once, and what waits in the queue too -- or with ``hold``, not until
        ``release`` (the link after an outage: other relays subscribe first)."""
        self.open = True
        self.holding = hold
        if self.queued[0] or self._has_notices():
            self._want_write()

    def release(self) -> None:
        """What waits in the queue may go now (``opened(hold=True)``)."""
        self.holding = False
        if self.queued[0]:
            self._want_write()

    def _on_writable(self) -> None:
        """The hub's callback: the socket can take more; notices first, then the queue."""
        try:
            if self._has_notices() and not self._send_notices():
                return
            q = self._queue()
            if q.count and not self.holding:
                self._send_queued(q)
            self._room_made(q)
            rare = self._rare
            idle = not q.count or self.holding
            if idle and rare is not None and rare.notices is None and rare.writing:
                rare.write_watcher.stop()
                rare.writing = False
        except OSError as e:
            self.fail("io_error", str(e))

    def _room_made(self, q: OutboundQueue) -> None:
        """Its queue took packets out, or its limits grew: a shedding that may
        end now ends, and the publishers it held back go on."""
        if self.shed is not None and shedding_ends(self.shed, q):
            self.shed = None
            dropping = self._dropping()
            if dropping is not None:
                dropping.held = False
        rare = self._rare
        if rare is not None and rare.waiters is not None and rare.waiters.wake(q):
            rare.waiters = None

    def _send_queued(self, q: OutboundQueue) -> None:
        """Send a batch of the queue in one call; what the socket refuses goes back."""
        packets, times = q.take(WRITE_BATCH)
        try:
            sent = self._send_list(packets)
        except OSError:
            q.put_back(packets, times)
            raise
        if sent < len(packets):
            q.put_back(packets[sent:], times[sent:])
        if sent:
            self.msgs_out += sent
            self.bytes_out += size_of(packets, sent)
            stats = self.router.stats
            now = _monotonic()
            for i in range(sent):
                stats.observe_queue_wait(now - times[i])

    def _send_notices(self) -> bool:
        """Send what notices it owes (``Notices.send``); True once none is left."""
        rare = self._more()
        notices = rare.notices
        assert notices is not None and self.fd >= 0
        if not notices.send(self.fd, self.upward):
            return False
        rare.notices = None
        return True

    # --- drops and warnings: one episode mechanism -------------------------------------

    def _count_drop(self, reason: str) -> None:
        self.dropped += 1
        self.router.stats.drops[reason] += 1

    def drop(self, reason: str) -> None:
        """One message for this connection was not delivered: counted, and
        the drop episode begins (logged at once) or goes on."""
        self._count_drop(reason)
        dropping = self._dropping()
        if dropping is not None:
            dropping.count += 1
        else:
            self._begin_dropping(reason)

    def _begin_dropping(self, reason: str) -> None:
        warnings = self._warnings()
        episode = warnings.begin(DROPPING, True, self.router.loop, self._on_tick)
        assert episode is not None
        warnings.dropping = episode
        q = self._queue()
        self.log.warning(
            DROPPING,
            reason=reason,
            soft=q.soft,
            hard=q.hard,
            queued_messages=q.count,
            queued_bytes=q.nbytes,
        )

    def start_shedding(self, reason: str) -> None:
        """Drop this message and the next ones without trying, until
        ``flood.shedding_ends``; the episode lasts as long."""
        self.drop(reason)
        self.shed = reason
        dropping = self._warnings().dropping  # drop() opened it
        if dropping is not None:
            dropping.held = True
        self._want_write()  # the drained socket (soft) or queue (hard) ends it

    def warn(self, event: str, **fields: Any) -> None:
        """A misbehaviour worth a line: the first at once, then a count per interval."""
        if self._warnings().begin(event, False, self.router.loop, self._on_tick) is not None:
            self.log.warning(event, **fields)
        else:
            self.router.stats.log_lines_suppressed += 1

    def _warnings(self) -> Warnings:
        """Its episodes, made now if it had none."""
        rare = self._more()
        warnings = rare.warnings
        if warnings is None:
            warnings = rare.warnings = Warnings()
        return warnings

    def _on_tick(self) -> None:
        """Every ``EPISODE_QUIET`` seconds while an episode is open."""
        warnings = self._warnings()
        warnings.report(self.log, warnings.due())

    def _stop_ticking(self) -> None:
        rare = self._rare
        if rare is not None and rare.warnings is not None:
            rare.warnings.stop()

    # --- closing ---------------------------------------------------------------------

    def close(self, reason: str, detail: str = "") -> None:
        """Close this connection for good (idempotent); logged with ``reason`` and counted.

        Unless the peer itself closed, it is first told why (our ``CMSG
        disconnect`` extension), best effort and without waiting.
        """
        if not self.end(reason):
            return
        self.open = False
        stats = self.router.stats
        stats.disconnects[reason] = stats.disconnects.get(reason, 0) + 1
        lost = (self.queue.clear() if self.queue is not None else 0) + len(self.pending or ())
        self.pending = None
        if lost:
            why = "slow_client_disconnected" if reason == "slow_client" else "client_gone"
            stats.drops[why] += lost
            self.dropped += lost
        notice = self.notice(reason, detail)
        if notice is not None and self.fd >= 0:
            with contextlib.suppress(OSError):
                send_one(self.fd, notice)
        rare = self._rare
        if rare is not None and rare.warnings is not None:
            rare.warnings.report(self.log, rare.warnings.close())
        level = self.log.info if reason in _ORDINARY else self.log.warning
        level(
            "upstream.closed" if self.upward else "client.disconnected",
            reason=reason,
            detail=detail,
            lost=lost,
        )
        rare = self._rare
        if rare is not None:
            rare.notices = None
            rare.stash = None
            waiters, rare.waiters = rare.waiters, None
            if waiters is not None:
                waiters.release()
        self.handler.forget(self)
        self._close_socket()


load_compiled(globals(), "sbus_relay.bus._c_connection")
