"""The relay's link to its upstream bus (SPEC §6).

Theory of operation.  A relay is a full local bus that is also a client of
its parent.  ``UpstreamLink`` owns that client connection:

* on connect it sends ``CMSG echo/off``, ``CMSG !/cred/whoami``,
  ``CMSG interest/on``, then ``SUB`` for every pattern held locally;
* from then on ``subscribe``/``unsubscribe`` (fed by the index's first/last
  callbacks) go up live;
* local publishes go up only once the whoami reply has arrived (a relay that
  was wrongly pointed into a cycle never answers, so nothing can storm round
  it) and, once the upstream's interest snapshot is complete, only when they
  match that interest;
* what comes down is delivered to local clients and never sent back up;
* on loss it reconnects with capped exponential back-off.  Upward messages
  wait meanwhile in a bounded outbox and go up in order after the handshake;
  beyond the bound they are dropped and counted (``upstream_queue_overflow``).
"""

from __future__ import annotations

import os
import socket
import struct
from collections import deque
from typing import TYPE_CHECKING

import gevent
from gevent.event import Event

from sbus_relay.ops.addresses import connect
from sbus_relay.ops.config import ServerConfig
from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import AddressError, PeerError
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.interest import ADD, READY, REMOVE
from sbus_relay.protocol.keys import WHOAMI
from sbus_relay.protocol.limits import MAX_PACKET, READ_BATCH, SEND_BUFFER, UPSTREAM_HIGH_WATER

if TYPE_CHECKING:
    from .connection import Connection
    from .server import Server

_MSG = b"MSG "
_UP = "upstream"  # the one holder in the interest index


class UpstreamLink:
    """The client side of a relay: SUB/UNSUB and publishes up, deliveries down."""

    def __init__(self, server: Server, config: ServerConfig) -> None:
        assert config.upstream is not None
        self.server = server
        self.address = config.upstream
        self.log = server.log.bind(upstream=config.upstream)
        self._min = config.reconnect_min
        self._max = config.reconnect_max
        self._max_messages = config.upstream_queue_messages
        self._max_bytes = config.upstream_queue_bytes
        self.connected = False  # socket up: SUB/UNSUB flow
        self.ready = False  # whoami answered: publishes flow
        self.interest: SubscriptionIndex[str] = SubscriptionIndex()
        self.interest_complete = False
        #: packets waiting to go up, in order; only MSG packets count towards the bound
        self._outbox: deque[bytes] = deque()
        self._out_msgs = 0
        self._out_bytes = 0
        self._sock: socket.socket | None = None
        self._read_watcher: object | None = None
        self._runner: gevent.Greenlet | None = None
        self._writer: gevent.Greenlet | None = None
        self._stopping = False
        self._connections = 0
        #: set whenever the outbox shrinks; publishers paused by back-pressure wait on it
        self.space = Event()

    # --- what the server sees --------------------------------------------------

    @property
    def interest_count(self) -> int:
        """Distinct patterns the upstream has told us it wants."""
        return self.interest.distinct

    @property
    def queued(self) -> int:
        """Messages waiting to go up."""
        return self._out_msgs

    def start(self) -> None:
        """Connect (and keep reconnecting) in the background."""
        self._runner = gevent.spawn(self._run)

    def stop(self) -> None:
        """Drop the link for good."""
        self._stopping = True
        for g in (self._runner, self._writer):
            if g is not None:
                g.kill(block=False)
        self._close()

    def subscribe(self, pattern: bytes) -> None:
        """A local pattern went 0 -> 1: SUB it upstream (SPEC §6.3)."""
        if self.connected:
            self._send(codec.SUB + pattern, msg=False)

    def unsubscribe(self, pattern: bytes) -> None:
        """A local pattern went 1 -> 0: UNSUB it upstream."""
        if self.connected:
            self._send(codec.UNSUB + pattern, msg=False)

    def forward(self, key: bytes, packet: bytes, sender: Connection) -> None:
        """A local publish: send it up if someone outside may want it (SPEC §6.4).

        While the upstream is up but slow, the publisher is paused rather than
        its messages dropped; the bounded drop is for outages only.
        """
        if self.ready and self.interest_complete and not self.interest.match(key):
            return
        self._send(packet, msg=True)
        if self.ready and self._out_msgs > UPSTREAM_HIGH_WATER:
            sender.waits.append((self.space, self._busy))

    def _busy(self) -> bool:
        return self.ready and self._out_msgs > UPSTREAM_HIGH_WATER // 2

    # --- sending -------------------------------------------------------------------

    def _send(self, packet: bytes, *, msg: bool) -> None:
        sock = self._sock
        if self.ready and sock is not None and not self._outbox:
            try:
                sock.send(packet)
                if msg:
                    self.server.stats.forwarded_up += 1
                return
            except BlockingIOError:
                pass
            except OSError:
                self._lost("send failed")
        if msg:
            full = self._out_msgs >= self._max_messages or self._out_bytes >= self._max_bytes
            if full and not self.ready:
                self.server.stats.drops["upstream_queue_overflow"] += 1
                return
            self._out_msgs += 1
            self._out_bytes += len(packet)
        elif not self.connected:
            return  # the whole pattern set is sent again on reconnect
        self._outbox.append(packet)
        self._kick()

    def _kick(self) -> None:
        if self._writer is None and self._sock is not None and self.connected:
            self._writer = gevent.spawn(self._drain)

    def _drain(self) -> None:
        """Send the outbox in order.  Before whoami is answered only SUB/UNSUB go."""
        hub = gevent.get_hub()
        try:
            while self._outbox and self._sock is not None:
                sock = self._sock
                packet = self._outbox[0]
                is_msg = packet.startswith(_MSG)
                if is_msg and not self.ready:
                    return  # publishes wait for the whoami reply
                try:
                    sock.send(packet)
                except BlockingIOError:
                    watcher = hub.loop.io(sock.fileno(), 2)
                    try:
                        hub.wait(watcher)
                    finally:
                        watcher.close()
                    continue
                except OSError:
                    self._lost("send failed")
                    return
                self._outbox.popleft()
                if is_msg:
                    self._out_msgs -= 1
                    self._out_bytes -= len(packet)
                    self.server.stats.forwarded_up += 1
                    if self._out_msgs == UPSTREAM_HIGH_WATER // 2:
                        self.space.set()
        finally:
            self._writer = None
            self.space.set()

    # --- the connection's life ------------------------------------------------------

    def _run(self) -> None:
        delay = self._min
        while not self._stopping:
            try:
                sock = connect(self.address)
            except (OSError, AddressError) as e:
                self.log.info("upstream.connect_failed", error=str(e), retry_in=round(delay, 3))
                gevent.sleep(delay)
                delay = min(delay * 2, self._max)
                continue
            if self._is_self(sock):
                sock.close()
                self.log.error("upstream.refused", reason="upstream is this very server")
                gevent.sleep(self._max)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self._sock = sock
            self._connections += 1
            if self._connections > 1:
                self.server.stats.upstream_reconnects += 1
            self._handshake()
            try:
                self._read_loop(sock)
            except PeerError as e:
                self.log.warning("upstream.protocol_error", reason=e.reason, detail=e.detail)
            except OSError as e:
                self.log.warning("upstream.io_error", error=str(e))
            except gevent.GreenletExit:
                raise
            except Exception:  # a bug of ours must not end reconnection for good
                self.log.exception("upstream.internal_error")
            if self._stopping:
                return
            if self.ready:
                delay = self._min  # it worked for a while: start the back-off afresh
            self._lost("connection closed")
            gevent.sleep(delay)
            delay = min(delay * 2, self._max)

    def _is_self(self, sock: socket.socket) -> bool:
        """SO_PEERCRED tells whether we connected to our own listening socket."""
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        return pid == os.getpid()

    def _handshake(self) -> None:
        """SPEC §6.1-3: echo off, ask who we are, ask for interest, SUB everything."""
        assert self._sock is not None
        self.connected = True
        hello = [
            codec.encode_cmsg(b"echo/off"),
            codec.encode_cmsg(WHOAMI),
            codec.encode_cmsg(b"interest/on"),
        ]
        hello += [codec.SUB + p for p in self.server.index.patterns()]
        # hello goes first, before anything left in the outbox from the outage
        self._outbox.extendleft(reversed(hello))
        self.log.info("upstream.connected", patterns=len(hello) - 3, waiting=self._out_msgs)
        self._kick()

    def _read_loop(self, sock: socket.socket) -> None:
        hub = gevent.get_hub()
        watcher = self._read_watcher = hub.loop.io(sock.fileno(), 1)
        buf = bytearray(MAX_PACKET)
        view = memoryview(buf)
        server = self.server
        stats = server.stats
        try:
            while not self._stopping:
                for _ in range(READ_BATCH):
                    try:
                        n = sock.recv_into(buf, MAX_PACKET, socket.MSG_TRUNC)
                    except BlockingIOError:
                        break
                    if n == 0:
                        return
                    if n > MAX_PACKET:
                        raise PeerError("protocol_error", "over-long packet from upstream")
                    packet = bytes(view[:n])
                    if packet.startswith(_MSG):
                        nul = packet.find(b"\0", 4)
                        if nul < 0:
                            raise PeerError("protocol_error", "MSG without NUL")
                        stats.forwarded_down += 1
                        server.publish(None, packet, packet[4:nul])
                    else:
                        self._control(codec.decode(packet))
                else:
                    gevent.sleep(0)
                    continue
                hub.wait(watcher)
        finally:
            self._read_watcher = None
            watcher.close()

    def _control(self, event: codec.Event) -> None:
        if not isinstance(event, codec.Control):
            return  # a server sends only MSG and CMSG; ignore anything else
        payload = event.payload or b""
        if event.key == WHOAMI:
            self._identity(payload)
        elif event.key == ADD:
            self.interest.add(_UP, payload)
            self.server.upstream_interest(payload, True)
        elif event.key == REMOVE:
            if self.interest.remove(_UP, payload):
                self.server.upstream_interest(payload, False)
        elif event.key == READY:
            self.interest_complete = True
            self.log.info("upstream.interest_ready", patterns=self.interest.distinct)

    def _identity(self, reply: bytes) -> None:
        """The whoami reply: our prefix is ``<reply>/`` (SPEC §6.2)."""
        if self.server.prefix is not None and self.server.prefix != reply + b"/":
            self.log.warning("upstream.identity_changed", identity=reply.decode("ascii", "replace"))
        if b"/%d/!/cred/" % os.getpid() in reply:
            # our own pid already stands as a relay in the chain above us: a cycle
            self.log.error("upstream.refused", reason="relay cycle detected")
            self._lost("cycle")
            return
        self.server.set_prefix(reply + b"/")
        self.ready = True
        self.log.info("upstream.ready", identity=reply.decode("ascii", "replace"))
        self._kick()

    def _lost(self, why: str) -> None:
        """The link went down: forget its interest, keep only queued publishes."""
        was = self.connected
        self._close()
        if self.interest.distinct:
            self.interest = SubscriptionIndex()
            self.server.upstream_interest_lost()
        self.interest_complete = False
        kept = deque(p for p in self._outbox if p.startswith(_MSG))
        self._outbox = kept
        if was:
            self.log.warning("upstream.lost", reason=why, waiting=self._out_msgs)

    def _close(self) -> None:
        """Close the socket, waking whichever greenlets wait on it."""
        self.connected = False
        self.ready = False
        sock, self._sock = self._sock, None
        current = gevent.getcurrent()
        if self._writer is not None and self._writer is not current:
            self._writer.kill(block=False)
        watcher = self._read_watcher
        if watcher is not None and self._runner is not current:
            gevent.get_hub().cancel_wait(watcher, OSError("upstream link closed"))
        if sock is not None:
            sock.close()
