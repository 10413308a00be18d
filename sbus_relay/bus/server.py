"""The sbus server: accept loop, routing and control messages, on gevent.

Theory of operation.  One gevent hub runs everything.  The accept loop backs
off on errors (EMFILE...) instead of spinning.  Each client is a
``Connection`` with a reader greenlet; a publish is routed inline by the
reader that received it: ``SubscriptionIndex.match`` (a cached dict lookup),
then a non-blocking ``send`` per recipient.  Only a recipient whose socket is
full gets its packet queued and a writer greenlet (SPEC §4), so one slow client
never delays the others.  On a relay, ``upstream`` is the link to the parent
bus (SPEC §6); the index callbacks feed it SUB/UNSUB.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent
import structlog
from gevent.event import Event

from sbus_relay.ops.config import ServerConfig
from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.flood import Action, parse_flood_control
from sbus_relay.protocol.index import SubscriptionIndex, canonical
from sbus_relay.protocol.interest import READY, InterestTracker
from sbus_relay.protocol.keys import WHOAMI, Credentials, check_pattern, valid_key
from sbus_relay.protocol.limits import (
    ACCEPT_BACKOFF_MAX,
    ACCEPT_BACKOFF_MIN,
    MAX_PACKET,
    MAX_PATTERNS_PER_CLIENT,
    SEND_BUFFER,
    STOP_TIMEOUT,
)
from sbus_relay.protocol.stats import Gauges, Stats

from .connection import Connection

#: Control key of the per-connection drop query (an extension): the reply is
#: ``CMSG drops/count\0<decimal count of messages dropped for this client>``.
DROPS_COUNT = b"drops/count"

if TYPE_CHECKING:
    from .upstream import UpstreamLink

_CRED_FMT = "3i"  # struct ucred: pid, uid, gid
_NEEDS_BLOCK = (Action.QUEUE_AND_WAIT_EMPTY, Action.QUEUE_AND_WAIT_BELOW)


class Server:
    """A full local bus; also a relay when ``config.upstream`` is set."""

    def __init__(
        self,
        config: ServerConfig,
        listener: socket.socket,
        *,
        stats: Stats | None = None,
        log: Any = None,
    ) -> None:
        self.config = config
        self.listener = listener
        self.stats = stats if stats is not None else Stats()
        self.log = log if log is not None else structlog.get_logger("sbus_relay")
        self.clients: dict[int, Connection] = {}
        self.index: SubscriptionIndex[Connection] = SubscriptionIndex(
            on_first=self._first_subscriber, on_last=self._last_subscriber
        )
        self.interest: InterestTracker[Connection] = InterestTracker(self.index)
        #: the index's key -> recipients cache, read directly on the hot path
        #: (the dict object lives as long as the index; it is only ever cleared)
        self._cached: Callable[[bytes], tuple[Connection, ...] | None] = self.index.cache.get
        #: one receive buffer for every reader: a greenlet copies out its packet
        #: before it can yield, so they never share it at the same time
        self.recv_buffer = bytearray(MAX_PACKET)
        self.recv_view = memoryview(self.recv_buffer)
        self.upstream: UpstreamLink | None = None
        #: our identity prefix (SPEC §3): empty on a master, set by the upstream on a relay
        self.prefix: bytes | None = b""
        self.prefix_known = Event()
        self.prefix_known.set()
        self.stopped = Event()
        self._next_cid = 0
        self._ever_connected = False
        self._accepter: gevent.Greenlet | None = None
        self._allowed = frozenset(config.users) | {os.geteuid()} if config.users else None
        if config.upstream:
            from .upstream import UpstreamLink

            self.prefix = None
            self.prefix_known.clear()
            self.upstream = UpstreamLink(self, config)

    # --- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Start accepting clients (and connecting upstream, on a relay)."""
        self.listener.setblocking(False)
        self._accepter = gevent.spawn(self._accept_loop)
        if self.upstream is not None:
            self.upstream.start()
        self.log.info("server.started", relay=self.upstream is not None)

    def serve_forever(self) -> None:
        """Start, then block until ``stop()``."""
        if self._accepter is None:
            self.start()
        self.stopped.wait()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop accepting, disconnect every client, drop the upstream link.

        As gevent's servers do: close everything, give the client greenlets
        ``timeout`` seconds to finish, then kill what is left.
        """
        if self.stopped.is_set():
            return
        if self._accepter is not None:
            self._accepter.kill(block=False)
        conns = list(self.clients.values())
        for conn in conns:
            conn.close("server_stopping")
        if self.upstream is not None:
            self.upstream.stop()
        self.listener.close()
        current = gevent.getcurrent()
        greenlets = [c.reader for c in conns if c.reader is not current]
        gevent.joinall(greenlets, timeout=timeout)
        gevent.killall([g for g in greenlets if not g.dead], block=False)
        self.log.info("server.stopped")
        self.stopped.set()

    # --- accepting -------------------------------------------------------

    def _accept_loop(self) -> None:
        hub = gevent.get_hub()
        watcher = hub.loop.io(self.listener.fileno(), 1)
        backoff = ACCEPT_BACKOFF_MIN
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                hub.wait(watcher)
                continue
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS...: back off, never spin
                self.stats.accept_errors += 1
                self.log.warning("accept.error", error=str(e), retry_in=backoff)
                gevent.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF_MAX)
                continue
            backoff = ACCEPT_BACKOFF_MIN
            try:
                self._admit(sock)
            except OSError as e:
                sock.close()
                self.log.warning("accept.error", error=str(e))

    def _admit(self, sock: socket.socket) -> None:
        pid, uid, gid = struct.unpack(
            _CRED_FMT, sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        )
        if self._allowed is not None and uid not in self._allowed:
            self.stats.connections_refused += 1
            self.log.warning("client.refused", reason="user_not_allowed", uid=uid, pid=pid)
            sock.close()
            return
        if len(self.clients) >= self.config.max_clients:
            self.stats.connections_refused += 1
            self.log.warning("client.refused", reason="too_many_clients", uid=uid, pid=pid)
            sock.close()
            return
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._next_cid += 1
        conn = Connection(self, sock, self._next_cid, Credentials(gid, uid, pid))
        self.clients[conn.cid] = conn
        self._ever_connected = True
        self.stats.connections_accepted += 1
        conn.log.info("client.connected")

    def forget(self, conn: Connection) -> None:
        """Called by ``Connection.close``: drop the client's patterns and interest."""
        self.clients.pop(conn.cid, None)
        if conn.interest:
            del self.interest.listeners[conn]
        for pattern in list(self.index.patterns_of(conn)):
            self._change(conn, pattern, add=False, everything=True)
        if self.config.exit_when_empty and self._ever_connected and not self.clients:
            gevent.spawn(self.stop)

    # --- routing ---------------------------------------------------------

    def publish(self, sender: Connection | None, packet: bytes, key: bytes) -> None:
        """Route one MSG packet: to local subscribers, and upward on a relay.

        ``sender`` is None for messages that came down from the upstream, which
        are never sent back up (SPEC §6).
        """
        if b"!" in key and not valid_key(key):
            self.stats.drops["reserved_key"] += 1
            return
        recipients = self._cached(key)
        if recipients is None:
            recipients = self.index.match(key)
        if recipients:
            delivered = nbytes = 0
            size = len(packet)
            drops = self.stats.drops
            for conn in recipients:
                if conn is sender and not conn.echo:
                    continue
                shed = conn.shed
                if shed is not None:
                    drops[shed] += 1
                    conn.episode_drops += 1
                    conn.drops_total += 1
                    continue
                if not conn.queue.count:
                    try:
                        conn.send(packet)
                        delivered += 1
                        nbytes += size
                        continue
                    except BlockingIOError:
                        pass
                    except OSError as e:
                        conn.close("io_error", str(e))
                        continue
                self._backlog(conn, packet, sender)
            stats = self.stats
            stats.delivered += delivered
            stats.bytes_out += nbytes
        upstream = self.upstream
        if upstream is not None and sender is not None:
            upstream.forward(key, packet, sender)

    def _backlog(self, conn: Connection, packet: bytes, sender: Connection | None) -> None:
        """The slow path: ``conn`` cannot take ``packet`` now (SPEC §4)."""
        q = conn.queue
        if q.soft == "queue" and q.count < q.max_messages and q.nbytes < q.max_bytes:
            conn.enqueue(packet)  # the default mode below the limit: skip decide()
            return
        action = q.decide()
        if action is Action.QUEUE:
            conn.enqueue(packet)
        elif action in _NEEDS_BLOCK:
            conn.enqueue(packet)
            if sender is not None:  # even when it fills its own queue (echo)
                sender.wait_for(conn, until_empty=action is Action.QUEUE_AND_WAIT_EMPTY)
        elif action is Action.DISCONNECT:
            conn.count_drop("slow_client_disconnected")
            mode = "soft" if q.soft == "error" else "hard"
            conn.close("slow_client", "blocking/%s/error" % mode)
        else:
            conn.start_shedding(action.value)

    # --- everything but MSG ----------------------------------------------------

    def handle(self, conn: Connection, packet: bytes) -> None:
        """SUB, UNSUB and CMSG from a client (MSG goes through ``publish``)."""
        event = codec.decode(packet)
        kind = type(event)
        if kind is codec.Subscribe:
            self.stats.packets_in["sub"] += 1
            self._subscribe(conn, event.pattern)  # type: ignore[union-attr]
        elif kind is codec.Unsubscribe:
            self.stats.packets_in["unsub"] += 1
            self._unsubscribe(conn, event.pattern)  # type: ignore[union-attr]
        elif kind is codec.Control:
            self.stats.packets_in["cmsg"] += 1
            self._control(conn, event.key)  # type: ignore[union-attr]
        else:  # a Publish reaching here means the reader's fast path missed it
            raise PeerError("protocol_error", "unexpected packet")

    def _own_prefix(self, pattern: bytes) -> bytes:
        """Our prefix, waiting for the upstream's whoami reply if a secret pattern needs it."""
        if self.prefix is None and pattern.startswith(b"!"):
            self.prefix_known.wait()
        return self.prefix or b""

    def _subscribe(self, conn: Connection, pattern: bytes) -> None:
        stored = canonical(check_pattern(pattern, conn.creds, self._own_prefix(pattern)))
        if (
            self.index.count_of(conn, stored) == 0
            and self.index.distinct_of(conn) >= MAX_PATTERNS_PER_CLIENT
        ):
            raise PeerError("too_many_patterns", "over %d patterns" % MAX_PATTERNS_PER_CLIENT)
        self._change(conn, stored, add=True)

    def _unsubscribe(self, conn: Connection, pattern: bytes) -> None:
        try:
            stored = canonical(check_pattern(pattern, conn.creds, self._own_prefix(pattern)))
        except PeerError:
            stored = pattern  # cannot be held; counted as unknown below
        if self.index.count_of(conn, stored) == 0:
            self.stats.unknown_unsubscribes += 1
            conn.log.info("client.unknown_unsubscribe", pattern=pattern.decode("utf-8", "replace"))
            return
        self._change(conn, stored, add=False)

    def _change(
        self, conn: Connection, pattern: bytes, *, add: bool, everything: bool = False
    ) -> None:
        """Add or remove subscriptions and tell interest listeners what changed."""
        listening = bool(self.interest.listeners)
        before = self.interest.before(pattern) if listening else []
        if add:
            self.index.add(conn, pattern)
        elif everything:
            while self.index.remove(conn, pattern):
                pass
        else:
            self.index.remove(conn, pattern)
        if listening:
            self._notify(self.interest.after(pattern, before))

    def _notify(self, notices: Any) -> None:
        # Collect first: sending may disconnect a slow listener, and its
        # forget() changes the listener set the notices are computed from.
        for listener, verb, pattern in list(notices):
            listener.send_control(codec.encode_cmsg(verb, pattern), essential=True)

    def _control(self, conn: Connection, key: bytes) -> None:
        if key == WHOAMI:
            if self.prefix is None:
                self.prefix_known.wait()  # SPEC §6.2: a local whoami waits for the upstream's
            reply = (self.prefix or b"") + conn.creds.identity()
            conn.send_control(codec.encode_cmsg(WHOAMI, reply))
        elif key == DROPS_COUNT:
            # Our extension: this client's drop total.  Never dropped: behind
            # whatever is queued for the client, even over its hard limit.
            reply = codec.encode_cmsg(DROPS_COUNT, b"%d" % conn.drops_total)
            if conn.queue.count:
                if conn.alive:
                    conn.enqueue(reply)
            else:
                conn.send_control(reply)
        elif key == b"echo/off":
            conn.echo = False
        elif key == b"echo/on":
            conn.echo = True
        elif key == b"interest/on":
            if not conn.interest:
                conn.interest = True
                self.interest.listeners[conn] = None
            for pattern in self.interest.snapshot(conn):
                conn.send_control(codec.encode_cmsg(b"interest/add", pattern), essential=True)
            conn.send_control(codec.encode_cmsg(READY, b""), essential=True)
        elif key == b"interest/off":
            if conn.interest:
                conn.interest = False
                del self.interest.listeners[conn]
        else:
            setting = parse_flood_control(key)
            if setting is None:
                return  # unknown control messages are ignored (SPEC §4)
            what, value = setting
            conn.reset_shedding()
            if what == "soft":
                conn.queue.soft = value
            elif what == "hard":
                conn.queue.hard = value
            else:
                conn.queue.set_order(value)

    # --- relay hooks (SPEC §6) ---------------------------------------------------

    def _first_subscriber(self, pattern: bytes) -> None:
        if self.upstream is not None:
            self.upstream.subscribe(pattern)

    def _last_subscriber(self, pattern: bytes) -> None:
        if self.upstream is not None:
            self.upstream.unsubscribe(pattern)

    def set_prefix(self, prefix: bytes) -> None:
        """The upstream told us who we are: ``<whoami reply>/``."""
        self.prefix = prefix
        self.prefix_known.set()

    def upstream_interest(self, pattern: bytes, present: bool) -> None:
        """The upstream's interest changed: re-advertise it to our own listeners."""
        self._notify(self.interest.set_upstream(pattern, present))

    def upstream_interest_lost(self) -> None:
        """The upstream link went down: its interest is unknown again."""
        self._notify(self.interest.clear_upstream())

    # --- observability ---------------------------------------------------

    def gauges(self) -> Gauges:
        """A snapshot for the metrics collector (cost: one pass over the clients)."""
        queued = qbytes = big = bigbytes = blocked = 0
        soft: dict[str, int] = {}
        hard: dict[str, int] = {}
        for conn in self.clients.values():
            q = conn.queue
            queued += q.count
            qbytes += q.nbytes
            big = max(big, q.count)
            bigbytes = max(bigbytes, q.nbytes)
            soft[q.soft] = soft.get(q.soft, 0) + 1
            hard[q.hard] = hard.get(q.hard, 0) + 1
            blocked += conn.blocked
        up = self.upstream
        return Gauges(
            clients=len(self.clients),
            patterns=len(self.index),
            distinct_patterns=self.index.distinct,
            queued_messages=queued,
            queued_bytes=qbytes,
            largest_queue_messages=big,
            largest_queue_bytes=bigbytes,
            soft_modes=soft,
            hard_modes=hard,
            blocked_publishers=blocked,
            is_relay=up is not None,
            upstream_connected=up is not None and up.connected,
            upstream_interest_patterns=up.interest_count if up is not None else 0,
            upstream_queue_messages=up.queued if up is not None else 0,
        )
