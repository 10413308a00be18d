"""The relay's link to its upstream bus (docs/protocol.md, "Relays").

What it owns: connecting and reconnecting to the upstream, its timers, and
carrying out what its LinkSession decides.  What it may touch: its connection
(conn) through its methods, its bus through UpstreamHost.

Theory of operation.  A relay is a full local bus that is also a client of
its parent.  The link's traffic is carried by one ``Connection`` (``conn``),
made once and kept across reconnects, so what it queues survives an outage.
It reads, batches, queues and drops exactly as a client's connection does,
and it is one more recipient in the subscription index: it holds the
patterns the upstream wants, so a local publish is matched once for local
subscribers and the upstream alike.  This class is the link's *controller*:
it connects, speaks the handshake and the interest extension, and reaches
its own bus only through ``UpstreamHost``.

* One greenlet connects (with capped exponential back-off) whenever the link
  is down, and watches the upstream's socket file meanwhile: a restarted
  upstream is reached as soon as it binds again, not after the back-off; the
  connection's reading and writing are callbacks of the hub.
* On connect it sends ``CMSG echo/off``, ``CMSG !/cred/whoami``,
  ``CMSG interest/on``, ``CMSG batch/on``, ``CMSG identity/follow`` and its
  name (``CMSG relay/name``);
  an upstream that answers ``batch/on`` is sent packed batches, and sends
  them (docs/protocol.md, "Packed batches"); once whoami is
  answered (our identity is known, and so are the right secret patterns) it
  subscribes every local pattern, and the connection opens: what waits in
  its queue goes up ``RESUBSCRIBE_GRACE`` later (a restarted upstream's other
  relays subscribe again meanwhile), whatever is published behind it.
* After that, pattern changes (the index's first/last callbacks) wait in the
  connection as the net change per pattern until they can be sent: a burst
  of SUB/UNSUB churn costs memory per distinct pattern, never per packet.
* Until the upstream's interest is complete (``interest/ready``), and while
  the link is down, the link holds ``EVERYTHING``: every local publish goes
  up (or waits in the bounded queue, beyond which it is dropped and counted:
  the local bus never waits for its upstream).
* Our identity can change on a link that stays up (``CMSG
  identity/changed``: a relay above us reconnected from another pid): the
  host renames its clients' secret patterns, which go up as UNSUB and SUB,
  and tells its own relays in turn.  Nobody is disconnected for it.
* An upstream that never answers whoami is warned about after
  ``WHOAMI_TIMEOUT`` (a relay cycle never answers: publishes wait for the
  answer, so nothing can storm round it), and an identity chain that begins
  with this relay's own earlier identity is refused as a cycle.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable
from typing import Any, Protocol

import gevent
from gevent.event import Event

from sbus_relay.ops.addresses import connect, parse_address, peer_ucred
from sbus_relay.ops.config import ServerConfig
from sbus_relay.protocol import control
from sbus_relay.protocol.errors import AddressError
from sbus_relay.protocol.flood import OutboundQueue
from sbus_relay.protocol.keys import CRED, Credentials
from sbus_relay.protocol.limits import (
    RESUBSCRIBE_GRACE,
    SEND_BUFFER,
    UPSTREAM_STARTING,
    UPSTREAM_WATCH,
    WHOAMI_TIMEOUT,
)
from sbus_relay.protocol.quota import unlimited
from sbus_relay.protocol.session import (
    BATCH_ON,
    Cycle,
    Disconnected,
    Identity,
    InterestReady,
    LinkSession,
    Renamed,
    UpstreamInterest,
)

from .batchio import send_one
from .connection import Connection, Handler, Router

#: What the link holds while the upstream's interest is unknown: every public
#: key ("") and every secret one (the prefix pattern "!/cred/").
EVERYTHING = (b"", CRED)


class UpstreamHost(Protocol):
    """What the upstream link needs from its local bus (the server implements it)."""

    router: Router

    def set_prefix(self, prefix: bytes) -> None:
        """The upstream answered whoami: our identity prefix is ``<reply>/``."""

    def local_patterns(self) -> Iterable[bytes]:
        """Every distinct pattern a local client holds."""

    def upstream_interest(self, pattern: bytes, present: bool) -> None:
        """The link comes to hold ``pattern`` (True), or lets one hold of it go."""


def link_connection(
    host: UpstreamHost, handler: Handler, queue: OutboundQueue, log: Any
) -> Connection:
    """The connection of a bus's link to what lies beyond it (its upstream, or
    NATS): this process's own credentials, no quota, upward flood control
    with ``queue``, its control packets to ``handler``."""
    return Connection(
        host.router,
        handler,
        -1,
        0,
        Credentials(os.getegid(), os.geteuid(), os.getpid()),
        unlimited(),
        queue=queue,
        log=log,
        upward=True,
    )


class UpstreamLink:
    """The client side of a relay: its handshake, its interest, its reconnects."""

    def __init__(self, host: UpstreamHost, config: ServerConfig, log: Any) -> None:
        assert config.upstream is not None
        self.host = host
        self.address = config.upstream
        self.log = log.bind(upstream=config.upstream)
        self._min = config.reconnect_min
        self._max = config.reconnect_max
        #: what the hello names this relay (its ``instance``), so the upstream's
        #: per-relay series and ``/clients`` say which relay it is
        self._name = config.instance
        queue = OutboundQueue(
            config.upstream_queue_bytes, config.upstream_queue_messages, upward=True
        )
        self.conn = link_connection(host, self, queue, self.log)
        #: the handshake, our identity and the upstream's interest (``protocol.session``)
        self.session = LinkSession()
        self._whoami_timer: Any = None
        self._release_timer: Any = None
        self._runner: gevent.Greenlet | None = None
        self._down = Event()  # set when the link is lost: the runner reconnects
        self._worked = False  # the link that was lost had got as far as ready
        self._stopping = False
        self._connections = 0
        self._adopted = False  # taken over from an earlier process (``adopt``)
        address = parse_address(config.upstream)
        #: the upstream's socket file, watched while it is away (None: not a path)
        self._watched_path = address.path if address.kind == "path" else None

    # --- what the server sees --------------------------------------------------

    @property
    def connected(self) -> bool:
        """The socket is up and the hello sent."""
        return self.session.connected

    @property
    def ready(self) -> bool:
        """Whoami answered: our identity is known, patterns synced, publishes flow."""
        return self.session.ready

    @property
    def interest_count(self) -> int:
        """How many patterns the upstream has said it wants."""
        return self.session.interest_count

    def start(self) -> None:
        """Connect (and keep reconnecting) in the background; until the upstream's
        interest is known, hold everything (not when adopted: that is known)."""
        if not self._adopted:
            self._hold_everything()
        self._runner = gevent.spawn(self._run)

    # --- a live upgrade -------------------------------------------------------------

    def freeze(self) -> None:
        """Nothing more goes up or comes down until ``thaw`` or ``let_go``."""
        self.conn.freeze()
        if self._whoami_timer is not None:
            self._whoami_timer.stop()

    def thaw(self) -> None:
        self.conn.thaw()
        if self._whoami_timer is not None:
            self._whoami_timer.start(self._whoami_late)

    def let_go(self) -> None:
        """The link lives on in a newer process: close our copy, quietly."""
        self._stopping = True
        if self._runner is not None:
            self._runner.kill(block=False)
        self._cancel_whoami()
        self.conn.let_go()

    def export(self) -> dict[str, Any]:
        """The link's state as plain data (its connection's is ``bus.handover``'s)."""
        link = self.session
        return {
            "connected": link.connected,
            "ready": link.ready,
            "identity_known": link.identity,
            "unsent": sorted(link.unsent),
            "interest_count": link.interest_count,
            "interest_complete": link.interest_complete,
            "connections": self._connections,
        }

    def adopt(self, state: dict[str, Any], fd: int | None) -> None:
        """Take up the link an earlier process handed over (before ``start``);
        ``fd``: its socket's descriptor, attached to ``conn`` already, if it had one."""
        self._adopted = True
        link = self.session
        link.connected = state["connected"] and fd is not None
        link.ready = state["ready"] and link.connected
        link.identity = state["identity_known"]
        link.unsent = set(state.get("unsent", ()))  # (an older process's record has none)
        link.interest_count = state["interest_count"]
        link.interest_complete = state["interest_complete"]
        self._connections = state["connections"]

    def stop(self) -> None:
        """Drop the link for good."""
        self._stopping = True
        if self._runner is not None:
            self._runner.kill(block=False)
        self._cancel_whoami()
        self.session.lost()
        self.conn.close("server_stopping")

    def reconfigure(self, config: ServerConfig) -> None:
        """A reload: the back-off and the upward queue's bounds change now; a
        new ``instance`` is told to the upstream at once (and in every hello)."""
        self._min = config.reconnect_min
        self._max = config.reconnect_max
        self.conn.set_limits(config.upstream_queue_bytes, config.upstream_queue_messages)
        if config.instance != self._name:
            self._name = config.instance
            name = control.relay_name(config.instance)
            if self.connected and self.conn.fd >= 0:
                # straight to the socket, never into the queue, whose packets
                # may go packed (a packed batch holds only MSG); a full socket
                # leaves it to the next hello, a failed one to the reader
                with contextlib.suppress(OSError):
                    send_one(self.conn.fd, name)

    def subscribe(self, pattern: bytes) -> None:
        """A local pattern went 0 -> 1: SUB it upstream."""
        if self.ready:  # before that, the whole set is sent once whoami is answered
            self.conn.notify(pattern, True)

    def unsubscribe(self, pattern: bytes) -> None:
        """A local pattern went 1 -> 0: UNSUB it upstream (if it ever went up)."""
        if self.session.unsubscribes(pattern):
            self.conn.notify(pattern, False)

    # --- the connection's handler ------------------------------------------------

    def handle(self, conn: Connection, packet: bytes) -> None:
        """A packet from the upstream that is not a MSG: what it asks is decided
        by the link's session (``protocol.session.LinkSession``), done here."""
        action = self.session.receive(packet)
        kind = type(action)
        if kind is UpstreamInterest:
            self.host.upstream_interest(action.pattern, action.present)  # type: ignore[union-attr]
        elif kind is Identity:
            self._identity(action.reply)  # type: ignore[union-attr]
        elif kind is Renamed:
            # a relay above us reconnected from another pid: the host renames
            # what changes, and that goes up as UNSUB and SUB
            reply = action.reply  # type: ignore[union-attr]
            self.log.info("upstream.identity_changed", identity=reply.decode("ascii", "replace"))
            self.host.set_prefix(reply + b"/")
        elif kind is Cycle:
            # our own identity heads the chain: the upstream is one of our descendants
            self.log.error(
                "upstream.refused",
                reason="relay cycle detected",
                identity=action.reply.decode("ascii", "replace"),  # type: ignore[union-attr]
            )
            self.lost(self.conn, "cycle", "")
        elif kind is InterestReady:
            if action.first:  # type: ignore[union-attr]
                for pattern in EVERYTHING:
                    self.host.upstream_interest(pattern, False)
            self.log.info("upstream.interest_ready", patterns=self.interest_count)
        elif action is BATCH_ON:
            conn.packs = True  # the upstream reads packed batches: send them
        elif kind is Disconnected:
            self.log.warning("upstream.disconnected_us", reason=action.reason)  # type: ignore[union-attr]

    def lost(self, conn: Connection, reason: str, detail: str) -> None:
        """The link failed: what it queued stays (bounded); its interest is unknown again."""
        was = self.connected
        self._worked = self.ready
        conn.detach()
        self.session.lost()
        self._cancel_whoami()
        self._forget_interest()
        if was:
            self.log.warning("upstream.lost", reason=reason, detail=detail, waiting=conn.queued[0])
        self._down.set()

    def forget(self, conn: Connection) -> None:
        """The link's connection closed for good (``stop``): nothing is held for it."""

    # --- the upstream's interest ---------------------------------------------------

    def _hold_everything(self) -> None:
        for pattern in EVERYTHING:
            self.host.upstream_interest(pattern, True)

    def _forget_interest(self) -> None:
        """Let go of every pattern the link holds, then hold everything again."""
        index = self.host.router.index
        for pattern, count in index.patterns_of(self.conn).items():
            for _ in range(count):
                self.host.upstream_interest(pattern, False)
        self._hold_everything()

    # --- the connection's life ------------------------------------------------------

    def _run(self) -> None:
        delay = self._min
        failures = 0
        changed = -UPSTREAM_STARTING  # when its socket file last changed
        while not self._stopping:
            if self.connected:  # up (an adopted link starts so): wait until it is lost
                self._down.wait()
                if self._stopping:
                    return
                if self._worked:
                    delay = self._min  # it worked for a while: start the back-off afresh
                if self._wait_for_upstream(delay):
                    changed = time.monotonic()
                delay = min(delay * 2, self._max)
                continue
            try:
                sock = connect(self.address)
            except (OSError, AddressError) as e:
                if time.monotonic() - changed < UPSTREAM_STARTING:
                    # its socket file was just bound: it listens in a moment
                    gevent.sleep(UPSTREAM_WATCH)
                    continue
                # The first failure of a streak is news (a relay started before its
                # upstream says so at warning); the retries that follow are not.
                failures += 1
                say = self.log.warning if failures == 1 else self.log.info
                say("upstream.connect_failed", error=str(e), retry_in=round(delay, 3))
                if self._wait_for_upstream(delay):
                    changed = time.monotonic()  # it is coming back: try at once
                else:
                    delay = min(delay * 2, self._max)
                continue
            if self._is_self(sock):
                sock.close()
                self.log.error("upstream.refused", reason="upstream is this very server")
                gevent.sleep(self._max)
                continue
            failures = 0
            self._down.clear()
            try:
                self._open(sock)
            except OSError as e:
                self.lost(self.conn, "io_error", str(e))
                gevent.sleep(delay)

    def _wait_for_upstream(self, delay: float) -> bool:
        """Sleep ``delay`` seconds, or less if the upstream's socket file changes
        (it is being bound again: a restarted upstream is reached within
        ``UPSTREAM_WATCH`` of listening, not after the back-off); True then."""
        path = self._watched_path
        if path is None:
            gevent.sleep(delay)
            return False
        changed = Event()
        watcher = gevent.get_hub().loop.stat(path, UPSTREAM_WATCH)
        watcher.start(changed.set)
        try:
            return bool(changed.wait(delay))
        finally:
            watcher.close()

    def _is_self(self, sock: socket.socket) -> bool:
        """SO_PEERCRED tells whether we connected to our own listening socket."""
        return peer_ucred(sock)[0] == os.getpid()

    def _open(self, sock: socket.socket) -> None:
        """Start a connection: the hello goes out; patterns follow the whoami reply."""
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._connections += 1
        if self._connections > 1:
            self.host.router.stats.upstream_reconnects += 1
        self.conn.attach(sock.detach())
        for packet in self.session.hello(self._name):  # a fresh socket takes these at once
            send_one(self.conn.fd, packet)
        self._whoami_timer = gevent.get_hub().loop.timer(WHOAMI_TIMEOUT)
        self._whoami_timer.start(self._whoami_late)
        self.log.info("upstream.connected", waiting=self.conn.queued[0])

    def _cancel_whoami(self) -> None:
        for timer in (self._whoami_timer, self._release_timer):
            if timer is not None:
                timer.close()
        self._whoami_timer = self._release_timer = None

    def _whoami_late(self) -> None:
        if self.connected and not self.ready:
            self.log.warning(
                "upstream.no_whoami",
                seconds=WHOAMI_TIMEOUT,
                hint="the upstream does not answer whoami: is it a relay whose own upstream "
                "leads back here (a relay cycle)?",
            )

    def _identity(self, reply: bytes) -> None:
        """The whoami reply (the session took it: no cycle, the first this
        connection): our prefix is ``<reply>/``; now send every pattern."""
        self._cancel_whoami()
        self.host.set_prefix(reply + b"/")
        patterns = self.session.to_sync(self.host.local_patterns())
        for pattern in patterns:
            self.conn.notify(pattern, True)
        self.session.synced()
        # What was published while the upstream was away waits a moment more:
        # the other relays of a restarted upstream reconnect within milliseconds
        # and subscribe again, and then it reaches them too.
        held = self.conn.queued[0] > 0
        self.conn.opened(hold=held)
        if held:
            self._release_timer = gevent.get_hub().loop.timer(RESUBSCRIBE_GRACE)
            self._release_timer.start(self.conn.release)
        self.log.info(
            "upstream.ready",
            identity=reply.decode("ascii", "replace"),
            patterns=len(patterns),
        )
