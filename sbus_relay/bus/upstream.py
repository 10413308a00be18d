"""The relay's link to its upstream bus (docs/protocol.md, "Relays").

Theory of operation.  A relay is a full local bus that is also a client of
its parent.  ``UpstreamLink`` owns that client connection, and reaches its
own bus only through ``UpstreamHost``:

* one greenlet connects (with capped exponential back-off) and reads what
  comes down; writing is a callback of the hub, like a client's;
* on connect it sends ``CMSG echo/off``, ``CMSG !/cred/whoami``,
  ``CMSG interest/on`` and its name (``CMSG relay/name``); once whoami is
  answered (our identity is known, and so are the right secret patterns) it
  sends ``SUB`` for every local pattern, and local publishes start to go up;
* after that, pattern changes (the index's first/last callbacks) are kept as
  the net change per pattern until they can be sent: a burst of SUB/UNSUB
  churn costs memory per distinct pattern, never per packet;
* local publishes go up only when they match the upstream's interest (all of
  them until its snapshot is complete); they wait in a bounded queue while
  the upstream is slow or away and beyond it are dropped and counted
  (``flood.decide_upward``): the local bus never waits for its upstream;
* an upstream that never answers whoami is warned about after
  ``WHOAMI_TIMEOUT`` (a relay cycle never answers: publishes wait for the
  answer, so nothing can storm round it), and an identity chain that begins
  with this relay's own earlier identity is refused as a cycle.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

import gevent

from sbus_relay.ops.addresses import connect, peer_ucred
from sbus_relay.ops.config import ServerConfig
from sbus_relay.protocol import codec, flood
from sbus_relay.protocol.errors import AddressError, PeerError
from sbus_relay.protocol.flood import Action
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.interest import ADD, READY, REMOVE
from sbus_relay.protocol.keys import WHOAMI
from sbus_relay.protocol.limits import (
    DROP_EPISODE_QUIET,
    NOTICE_BATCH,
    READ_BATCH,
    SEND_BUFFER,
    WHOAMI_TIMEOUT,
    WRITE_BATCH,
)
from sbus_relay.protocol.stats import Stats

from .batchio import recv_many, send_all

_MSG = b"MSG "
_UP = "upstream"  # the one holder in the interest index
_HELLO = (
    codec.encode_cmsg(b"echo/off"),
    codec.encode_cmsg(WHOAMI),
    codec.encode_cmsg(b"interest/on"),
)


class UpstreamHost(Protocol):
    """What the upstream link needs from its local bus (the server implements it)."""

    def deliver(self, packet: bytes, key: bytes) -> None:
        """A ``MSG`` came down: deliver it locally (never back up)."""

    def flush(self) -> None:
        """Send local clients what ``deliver`` routed since the last flush."""

    def set_prefix(self, prefix: bytes) -> None:
        """The upstream answered whoami: our identity prefix is ``<reply>/``."""

    def local_patterns(self) -> Iterable[bytes]:
        """Every distinct pattern a local client holds."""

    def upstream_interest(self, pattern: bytes, present: bool) -> None:
        """The upstream's interest in ``pattern`` changed."""

    def upstream_interest_lost(self) -> None:
        """The link went down: the upstream's interest is unknown again."""


class UpstreamLink:
    """The client side of a relay: SUB/UNSUB and publishes up, deliveries down."""

    def __init__(self, host: UpstreamHost, config: ServerConfig, stats: Stats, log: Any) -> None:
        assert config.upstream is not None
        self.host = host
        self.stats = stats
        self.address = config.upstream
        self.log = log.bind(upstream=config.upstream)
        self._min = config.reconnect_min
        self._max = config.reconnect_max
        self._max_messages = config.upstream_queue_messages
        self._max_bytes = config.upstream_queue_bytes
        #: the hello: the last packet names this relay (its ``instance``), so the
        #: upstream's per-relay series and ``/clients`` say which relay it is
        self._hello_packets = (
            *_HELLO,
            codec.encode_cmsg(b"relay/name", config.instance.encode("utf-8", "replace")),
        )
        self.connected = False  # socket up, hello sent
        self.ready = False  # whoami answered: patterns synced, publishes flow
        #: the last whoami answer we took, kept across reconnects (cycle detection)
        self._identity_known: bytes | None = None
        self.interest: SubscriptionIndex[str] = SubscriptionIndex()
        self.interest_complete = False
        #: control packets to send before anything else (the hello)
        self._hello: deque[bytes] = deque()
        #: pattern -> wanted upstream (True: SUB, False: UNSUB), the net change not yet sent
        self._pending: dict[bytes, bool] = {}
        #: publishes waiting to go up, in order, bounded
        self._outbox: deque[bytes] = deque()
        #: publishes of the current local read batch, sent together by ``flush``
        self._batch: list[bytes] | None = None
        self._out_bytes = 0
        self._episode_drops = 0
        self._drop_timer: Any = None
        self._sock: socket.socket | None = None
        self._write_watcher: Any = None
        self._read_watcher: Any = None
        self._whoami_timer: Any = None
        self._runner: gevent.Greenlet | None = None
        self._stopping = False
        self._connections = 0

    # --- what the server sees --------------------------------------------------

    @property
    def interest_count(self) -> int:
        """Distinct patterns the upstream has told us it wants."""
        return self.interest.distinct

    @property
    def queued(self) -> int:
        """Messages waiting to go up."""
        return len(self._outbox)

    def start(self) -> None:
        """Connect (and keep reconnecting) in the background."""
        self._runner = gevent.spawn(self._run)

    def stop(self) -> None:
        """Drop the link for good."""
        self._stopping = True
        if self._runner is not None:
            self._runner.kill(block=False)
        self._close()
        self._end_drop_episode()

    def subscribe(self, pattern: bytes) -> None:
        """A local pattern went 0 -> 1: SUB it upstream."""
        self._want(pattern, True)

    def unsubscribe(self, pattern: bytes) -> None:
        """A local pattern went 1 -> 0: UNSUB it upstream."""
        self._want(pattern, False)

    def _want(self, pattern: bytes, present: bool) -> None:
        if not self.ready:
            return  # the whole set is sent once whoami is answered
        pending = self._pending
        if pattern in pending:
            del pending[pattern]  # SUB then UNSUB (or back): the upstream's view is right
        else:
            pending[pattern] = present
        self._want_write()

    def forward(self, key: bytes, packet: bytes) -> None:
        """A local publish: send it up if someone outside may want it.

        While the link is up and nothing waits before it, the packet joins this
        read batch's ``_batch``, sent in one call by ``flush``.
        """
        if self.interest_complete and not self.interest.match(key):
            return
        if self.ready and not self._outbox and not self._pending:
            batch = self._batch
            if batch is None:
                self._batch = [packet]
            else:
                batch.append(packet)
            return
        self._queue(packet)

    def flush(self) -> None:
        """Send this batch's publishes up; what the socket refuses waits in the queue."""
        batch, self._batch = self._batch, None
        sock = self._sock
        if batch is None:
            return
        sent = 0
        if sock is not None and self.ready:
            try:
                sent = send_all(sock, sock.fileno(), batch)
            except OSError as e:
                self._lost("send failed: %s" % e)
            self.stats.forwarded_up += sent
        for i in range(sent, len(batch)):
            self._queue(batch[i])

    def _queue(self, packet: bytes) -> None:
        action = flood.decide_upward(
            len(self._outbox), self._out_bytes, self._max_messages, self._max_bytes
        )
        if action is Action.QUEUE:
            self._outbox.append(packet)
            self._out_bytes += len(packet)
            self._want_write()
            return
        self.stats.drops[action.value] += 1
        self._episode_drops += 1
        if self._drop_timer is None:
            self.log.warning("upstream.queue_full", reason=action.value)
            self._drop_timer = gevent.get_hub().loop.timer(DROP_EPISODE_QUIET, DROP_EPISODE_QUIET)
            self._drop_timer.start(self._drop_tick, self._episode_drops)

    def _drop_tick(self, seen: int) -> None:
        """Log the drop episode once a quiet interval passes without a drop."""
        if self._episode_drops != seen:
            self._drop_timer.stop()
            self._drop_timer.start(self._drop_tick, self._episode_drops)
            return
        self._end_drop_episode()

    def _end_drop_episode(self) -> None:
        if self._drop_timer is not None:
            self._drop_timer.stop()
            self._drop_timer = None
        if self._episode_drops:
            self.log.warning(
                "upstream.dropped", count=self._episode_drops, reason=Action.DROP_UPWARD.value
            )
            self._episode_drops = 0

    # --- writing: a callback of the hub --------------------------------------------

    def _want_write(self) -> None:
        watcher = self._write_watcher
        if watcher is not None and not watcher.active:
            watcher.start(self._on_writable)

    def _on_writable(self) -> None:
        """Send the hello, then the net pattern changes, then (once ready) publishes."""
        sock = self._sock
        if sock is None:
            return
        try:
            hello = self._hello
            while hello:
                sock.send(hello[0])
                hello.popleft()
            if not self.ready:
                self._write_watcher.stop()  # nothing more until whoami is answered
                return
            pending = self._pending
            for _ in range(NOTICE_BATCH):
                if not pending:
                    break
                pattern, present = pending.popitem()
                try:
                    sock.send((codec.SUB if present else codec.UNSUB) + pattern)
                except BlockingIOError:
                    pending[pattern] = present
                    return
            if pending:
                return  # the rest on the next wake-up
            outbox = self._outbox
            sent = 0
            try:
                for _ in range(WRITE_BATCH):
                    if not outbox:
                        break
                    sock.send(outbox[0])
                    self._out_bytes -= len(outbox.popleft())
                    sent += 1
            finally:
                self.stats.forwarded_up += sent
            if not outbox:
                self._write_watcher.stop()
        except BlockingIOError:
            return
        except OSError as e:
            self._lost("send failed: %s" % e)

    # --- the connection's life ------------------------------------------------------

    def _run(self) -> None:
        delay = self._min
        failures = 0
        while not self._stopping:
            try:
                sock = connect(self.address)
            except (OSError, AddressError) as e:
                # The first failure of a streak is news (a relay started before its
                # upstream says so at warning); the retries that follow are not.
                failures += 1
                say = self.log.warning if failures == 1 else self.log.info
                say("upstream.connect_failed", error=str(e), retry_in=round(delay, 3))
                gevent.sleep(delay)
                delay = min(delay * 2, self._max)
                continue
            if self._is_self(sock):
                sock.close()
                self.log.error("upstream.refused", reason="upstream is this very server")
                gevent.sleep(self._max)
                continue
            self._open(sock)
            failures = 0
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
        return peer_ucred(sock)[0] == os.getpid()

    def _open(self, sock: socket.socket) -> None:
        """Start a connection: the hello goes out; patterns follow the whoami reply."""
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._sock = sock
        self._connections += 1
        if self._connections > 1:
            self.stats.upstream_reconnects += 1
        loop = gevent.get_hub().loop
        self._write_watcher = loop.io(sock.fileno(), 2)
        self._hello = deque(self._hello_packets)
        self._pending = {}
        self.connected = True
        self._whoami_timer = loop.timer(WHOAMI_TIMEOUT)
        self._whoami_timer.start(self._whoami_late)
        self.log.info("upstream.connected", waiting=len(self._outbox))
        self._want_write()

    def _whoami_late(self) -> None:
        if self.connected and not self.ready:
            self.log.warning(
                "upstream.no_whoami",
                seconds=WHOAMI_TIMEOUT,
                hint="the upstream does not answer whoami: is it a relay whose own upstream "
                "leads back here (a relay cycle)?",
            )

    def _read_loop(self, sock: socket.socket) -> None:
        hub = gevent.get_hub()
        fd = sock.fileno()
        watcher = self._read_watcher = hub.loop.io(fd, 1)
        stats = self.stats
        deliver = self.host.deliver
        flush = self.host.flush
        try:
            while not self._stopping and self._sock is sock:
                packets = recv_many(sock, fd, READ_BATCH)
                for packet in packets:
                    if not packet:
                        if packet is None:
                            raise PeerError("protocol_error", "over-long packet from upstream")
                        return  # the upstream closed (it never sends an empty packet)
                    if packet.startswith(_MSG):
                        nul = packet.find(b"\0", 4)
                        if nul < 0:
                            raise PeerError("protocol_error", "MSG without NUL")
                        stats.forwarded_down += 1
                        deliver(packet, packet[4:nul])
                    else:
                        flush()
                        self._control(codec.decode(packet))
                    if self._sock is not sock:
                        return  # closed while handling (a cycle was found)
                flush()
                if len(packets) == READ_BATCH:
                    gevent.sleep(0)  # a full batch: let the others in, then read on
                else:
                    hub.wait(watcher)
        finally:
            flush()
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
            self.host.upstream_interest(payload, True)
        elif event.key == REMOVE:
            if self.interest.remove(_UP, payload):
                self.host.upstream_interest(payload, False)
        elif event.key == READY:
            self.interest_complete = True
            self.log.info("upstream.interest_ready", patterns=self.interest.distinct)
        elif event.key == b"disconnect":
            self.log.warning("upstream.disconnected_us", reason=payload.decode("utf-8", "replace"))

    def _identity(self, reply: bytes) -> None:
        """The whoami reply: our prefix is ``<reply>/``; now send every pattern."""
        if self.ready:
            return  # one answer per connection is all we asked for
        if self._identity_known is not None and reply.startswith(self._identity_known + b"/"):
            # Our own identity heads the chain: the upstream is one of our
            # descendants, a cycle.  Whole identities are compared, not our pid:
            # each group holds a pid as seen in its writer's pid namespace, so in
            # containers a number proves neither a cycle nor its absence.
            self.log.error(
                "upstream.refused",
                reason="relay cycle detected",
                identity=reply.decode("ascii", "replace"),
            )
            self._lost("cycle")
            return
        self.host.set_prefix(reply + b"/")
        self._identity_known = reply
        self._pending = dict.fromkeys(self.host.local_patterns(), True)
        self.ready = True
        self.log.info(
            "upstream.ready",
            identity=reply.decode("ascii", "replace"),
            patterns=len(self._pending),
        )
        self._want_write()

    def _lost(self, why: str) -> None:
        """The link went down: forget its interest; queued publishes stay (bounded)."""
        was = self.connected
        self._close()
        if self.interest.distinct:
            self.interest = SubscriptionIndex()
            self.host.upstream_interest_lost()
        self.interest_complete = False
        if was:
            self.log.warning("upstream.lost", reason=why, waiting=len(self._outbox))

    def _close(self) -> None:
        """Close the socket, waking the reading greenlet (it then reconnects)."""
        self.connected = False
        self.ready = False
        self._pending = {}
        self._hello.clear()
        for watcher in (self._write_watcher, self._whoami_timer):
            if watcher is not None:
                watcher.close()
        self._write_watcher = self._whoami_timer = None
        reading = self._read_watcher
        if reading is not None and gevent.getcurrent() is not self._runner:
            gevent.get_hub().cancel_wait(reading, OSError("upstream link closed"))
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
