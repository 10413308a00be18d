"""One client of the server: its socket, its outbound queue and its pauses.

Theory of operation.  A connection has no greenlet of its own: the gevent
hub calls ``_on_readable`` when its socket has packets and ``_on_writable``
when a socket with a backlog can take more.  An idle client therefore costs
one socket, one watcher and this object.

Reading (the hot path): up to ``READ_BATCH`` packets per wake-up, in one
system call where the compiled helper is built (``batchio``); a ``MSG`` goes
to ``Router.publish``, anything else to ``Router.handle``.  The router routes
inline: a recipient with nothing queued gets the packet in its ``pending``
list (sent with the rest of the batch by ``Router.flush``), or at once if it
is in a block mode; otherwise ``deliver`` runs, where ``protocol.flood``
decides and the connection carries the decision out: queue, queue and pause
the publisher, drop (and shed), or disconnect.

Pauses: a publisher is paused (its socket is no longer read, so its own
sends block in the kernel) while a client in a block mode it filled is
``still_blocked``, and a relay's client while the server waits for its
identity prefix.  Pauses are counted, so each release resumes exactly one.

Writing: the backlog is drained in the client's order from
``_on_writable``; interest notices for a relay wait, coalesced per pattern,
in ``notices`` and go first.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any, Protocol

import gevent

from sbus_relay.protocol import codec, flood
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.flood import Action, OutboundQueue
from sbus_relay.protocol.keys import Credentials
from sbus_relay.protocol.limits import (
    DROP_EPISODE_QUIET,
    LOG_REPEAT_INTERVAL,
    MAX_PACKET,
    NOTICE_BATCH,
    READ_BATCH,
    WRITE_BATCH,
)
from sbus_relay.protocol.quota import Account
from sbus_relay.protocol.stats import Stats

from .batchio import recv_many

_MSG = b"MSG "
_NUL = b"\0"
_TRUNC = socket.MSG_TRUNC
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT
_READ = 1
_WRITE = 2
_ADD = b"interest/add"
_REMOVE = b"interest/remove"
_READY = b"interest/ready"
_DISCONNECT = b"disconnect"
_decide = flood.decide
_QUEUE = Action.QUEUE
_monotonic = time.monotonic
#: reasons a client ends by itself or by the server's own shutdown: logged at info
_ORDINARY = frozenset({"closed", "server_stopping"})


class Router(Protocol):
    """What a connection needs from the server: it hands every packet over."""

    stats: Stats

    def publish(self, sender: Connection | None, packet: bytes, key: bytes) -> None:
        """Route one ``MSG`` packet whose routing key is ``key``."""

    def handle(self, conn: Connection, packet: bytes) -> None:
        """Act on one ``SUB``, ``UNSUB`` or ``CMSG`` packet."""

    def forget(self, conn: Connection) -> None:
        """``conn`` has closed: drop its patterns and interest."""

    def flush(self, sender: Connection | None = None) -> None:
        """Send every recipient what ``publish`` routed to it since the last flush
        (``sender``: the publisher of that batch, which a block mode may pause)."""


class Connection:
    """A connected client.  Created by the server at accept time."""

    __slots__ = (
        "__weakref__",
        "_base_log",
        "_drop_reason",
        "_drop_timer",
        "_log",
        "_loop",
        "_read_watcher",
        "_repeats",
        "_retry",
        "_stash",
        "_write_watcher",
        "account",
        "alive",
        "batch",
        "bytes_in",
        "bytes_out",
        "cid",
        "creds",
        "dropped",
        "echo",
        "ended",
        "episode_drops",
        "fd",
        "interest",
        "label",
        "msgs_in",
        "msgs_out",
        "notices",
        "pattern_bytes",
        "pauses",
        "pending",
        "queue",
        "ready_owed",
        "relay",
        "router",
        "send",
        "shed",
        "since",
        "sock",
        "waiters",
    )

    def __init__(
        self,
        router: Router,
        sock: socket.socket,
        cid: int,
        creds: Credentials,
        queue: OutboundQueue,
        account: Account,
        log: Any,
    ) -> None:
        self.router = router
        self.sock = sock
        self.send = sock.send  # bound once: the fan-out calls it per recipient
        self.fd = sock.fileno()
        self.cid = cid
        self.creds = creds
        self.queue = queue
        self.account = account
        self.echo = True
        self.interest = False  # sent interest/on: a relay listening for notices
        self.relay = False  # declared itself a relay (its pattern limit is the relay one)
        self.alive = True
        #: not in soft/block: what one read batch routes here while nothing is
        #: queued waits in ``pending`` and goes out in one call when the router
        #: flushes.  (soft/block must pause the publisher at the very packet its
        #: socket refuses, so it is always sent at once.)
        self.batch = True
        self.pending: list[bytes] | None = None
        #: drop reason while new messages for this client are shed without a
        #: send attempt; the fan-out checks it first, so a stalled client costs
        #: the others a counter increment per message
        self.shed: str | None = None
        self.episode_drops = 0
        self.dropped = 0  # messages dropped for this client since it connected
        #: traffic of this client since it connected (``/clients``, per-relay/user series)
        self.msgs_in = self.bytes_in = self.msgs_out = self.bytes_out = 0
        self.since = time.monotonic()
        #: the server's relay label of this client (``accounting``): ``local`` until
        #: it says it is a relay
        self.label = "local"
        self.ended = ""  # why it was closed, once it is
        self.pattern_bytes = 0  # bytes of the distinct patterns it holds
        self._drop_reason = ""
        self._drop_timer: Any = None
        #: how many reasons this connection is not being read for (block modes,
        #: a relay's prefix); read again when it falls back to 0
        self.pauses = 0
        #: publishers paused on this client, with the action that paused them
        self.waiters: list[tuple[Connection, Action]] | None = None
        #: interest notices not yet sent: pattern -> present (net state, coalesced)
        self.notices: dict[bytes, bool] | None = None
        self.ready_owed = False  # interest/ready goes after the pending notices
        #: packets read but not yet handled because the connection was paused
        self._stash: list[bytes | None] | None = None
        self._retry = False  # the packet being handled is to be handled again on resume
        self._repeats: dict[str, list[Any]] | None = None  # rate-limited log lines
        self._base_log = log
        self._log: Any = None
        loop = gevent.get_hub().loop
        self._loop = loop
        self._write_watcher: Any = None
        self._read_watcher = loop.io(self.fd, _READ)
        self._read_watcher.start(self._on_readable)

    @property
    def log(self) -> Any:
        """This client's logger (bound on first use: an idle client never pays for it)."""
        if self._log is None:
            c = self.creds
            self._log = self._base_log.bind(client=self.cid, pid=c.pid, uid=c.uid, gid=c.gid)
        return self._log

    # --- reading ---------------------------------------------------------------

    def _on_readable(self) -> None:
        """The hub's callback: read a batch of packets and hand them over."""
        router = self.router
        stats = router.stats
        publish = router.publish
        msgs = nbytes = done = 0
        try:
            packets, self._stash = self._stash, None
            if packets is None:
                packets = recv_many(self.sock, self.fd, READ_BATCH)
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
                if packet.startswith(_MSG):
                    nul = packet.find(_NUL, 4)
                    if nul < 0:
                        raise PeerError("protocol_error", "MSG without NUL")
                    msgs += 1
                    publish(self, packet, packet[4:nul])
                else:
                    router.flush(self)  # what was routed before it goes first
                    router.handle(self, packet)
                if self.pauses:
                    if self._retry:  # held for later: handle it again on resume
                        self._retry = False
                        done -= 1
                    if done < len(packets) and self.alive:
                        self._stash = packets[done:]
                    break
                if not self.alive:
                    break
        except PeerError as e:
            if e.reason == "protocol_error":  # a refused SUB was counted as a SUB
                stats.packets_in["invalid"] += 1
            self.close(e.reason, e.detail)
        except OSError as e:
            self.close("io_error", str(e))
        except Exception as e:  # a bug of ours: cost this one client, never the server
            self.log.exception("client.internal_error")
            self.close("internal_error", repr(e))
        finally:
            router.flush(self)
            stats.packets_in["msg"] += msgs
            stats.bytes_in += nbytes
            self.msgs_in += msgs
            self.bytes_in += nbytes

    def _zero_length(self) -> None:
        """recv returned 0: the peer closed, or it sent an empty packet."""
        try:
            more = self.sock.recv(1, _PEEK)
        except BlockingIOError:
            more = None  # still open: that was an empty packet
        except OSError:
            more = b""
        if more == b"":
            self.close("closed")
        else:
            self.router.stats.packets_in["invalid"] += 1
            self.close("protocol_error", "empty packet")

    def pause(self) -> None:
        """Stop reading this client until a matching ``resume``."""
        self.pauses += 1
        if self.pauses == 1 and self.alive:
            self._read_watcher.stop()

    def resume(self) -> None:
        """Release one pause; read again once none is left."""
        self.pauses -= 1
        if self.pauses == 0 and self.alive:
            self._read_watcher.start(self._on_readable)
            if self._stash:
                self._loop.run_callback(self._on_readable)  # what was read before the pause

    def hold(self) -> None:
        """The packet being handled must wait: stop reading, and handle it again on resume."""
        self._retry = True
        self.pause()

    # --- delivering (called by the router's fan-out) ------------------------------

    def deliver(self, packet: bytes, sender: Connection | None) -> None:
        """The slow path of delivery: the socket is full or a backlog waits.

        The router tried ``send`` first when nothing was queued; here
        ``protocol.flood`` decides and this method carries it out.
        """
        q = self.queue
        action = _decide(q)
        if action is _QUEUE:  # the common case, kept short: a stalled client's queue fills here
            q.push(packet, _monotonic())
            watcher = self._write_watcher
            if watcher is None or not watcher.active:
                self._want_write()
        elif action in flood.BLOCKING:
            self._enqueue(packet)
            if sender is not None and sender.alive:  # even when it fills its own queue
                waiters = self.waiters
                if waiters is None:
                    waiters = self.waiters = []
                if not any(p is sender and a is action for p, a in waiters):
                    waiters.append((sender, action))
                    sender.pause()
        elif action is Action.DISCONNECT:
            self.count_drop("slow_client_disconnected")
            self.close(
                "slow_client", "blocking/%s/error" % ("soft" if q.soft == "error" else "hard")
            )
        else:
            self.start_shedding(action.value)

    def reply(self, packet: bytes) -> None:
        """Send a server-made reply (whoami, drops/count): never a reason to disconnect."""
        if not self.alive:
            return
        if not self.queue.count:
            try:
                self.send(packet)
                return
            except BlockingIOError:
                pass
            except OSError as e:
                self.close("io_error", str(e))
                return
        if flood.decide_reply(self.queue) is Action.QUEUE:
            self._enqueue(packet)
        else:
            self.count_drop(Action.DROP_HARD.value)

    def notify(self, pattern: bytes, present: bool) -> None:
        """An interest notice for this relay; coalesced with any pending one for ``pattern``."""
        if not self.alive:
            return
        notices = self.notices
        if notices is None:
            notices = self.notices = {}
        if pattern in notices:
            del notices[pattern]  # add then remove (or remove then add): nothing to say
        else:
            notices[pattern] = present
        self._want_write()

    def owe_ready(self) -> None:
        """Send ``interest/ready`` once the notices pending now have gone."""
        self.ready_owed = True
        if self.notices is None:
            self.notices = {}
        self._want_write()

    def _enqueue(self, packet: bytes) -> None:
        self.queue.push(packet, time.monotonic())
        self._want_write()

    def _want_write(self) -> None:
        watcher = self._write_watcher
        if watcher is None:
            watcher = self._write_watcher = self._loop.io(self.fd, _WRITE)
        if not watcher.active:
            watcher.start(self._on_writable)

    def _on_writable(self) -> None:
        """The hub's callback: the socket can take more; drain notices, then the queue."""
        try:
            if self.notices is not None and not self._send_notices():
                return
            q = self.queue
            stats = self.router.stats
            send = self.send
            sent = nbytes = 0
            try:
                for _ in range(WRITE_BATCH):
                    if not q.count:
                        break
                    packet, t = q.peek()
                    try:
                        send(packet)
                    except BlockingIOError:
                        break
                    q.pop()
                    sent += 1
                    nbytes += len(packet)
                    stats.observe_queue_wait(time.monotonic() - t)
            finally:
                stats.delivered += sent
                stats.bytes_out += nbytes
                self.msgs_out += sent
                self.bytes_out += nbytes
            if self.shed is not None and flood.shedding_ends(self.shed, q):
                self.shed = None
            if self.waiters:
                self._wake_waiters()
            if not q.count and self.notices is None:
                self._write_watcher.stop()
        except OSError as e:
            self.close("io_error", str(e))

    def _send_notices(self) -> bool:
        """Send pending interest notices; True once none is left."""
        notices = self.notices
        assert notices is not None
        send = self.send
        for _ in range(NOTICE_BATCH):
            if not notices:
                break
            pattern, present = notices.popitem()
            try:
                send(codec.encode_cmsg(_ADD if present else _REMOVE, pattern))
            except BlockingIOError:
                notices[pattern] = present
                return False
        if notices:
            return False  # a large snapshot: the rest on the next wake-up
        if self.ready_owed:
            try:
                send(codec.encode_cmsg(_READY, b""))
            except BlockingIOError:
                return False
            self.ready_owed = False
        self.notices = None
        return True

    def _wake_waiters(self) -> None:
        """Resume the publishers this client no longer holds back."""
        waiters = self.waiters
        assert waiters is not None
        q = self.queue
        keep = [(p, a) for p, a in waiters if p.alive and flood.still_blocked(a, q)]
        if len(keep) == len(waiters):
            return
        self.waiters = keep or None
        for publisher, action in waiters:
            if publisher.alive and not flood.still_blocked(action, q):
                publisher.resume()

    # --- drops ---------------------------------------------------------------------

    def start_shedding(self, reason: str) -> None:
        """Drop this message and the next ones without trying, until
        ``flood.shedding_ends``; the episode is logged once, with its count."""
        self.count_drop(reason)
        self.shed = reason
        self._want_write()  # the drained socket (soft) or queue (hard) ends it
        if self._drop_timer is None:
            self._drop_timer = self._loop.timer(DROP_EPISODE_QUIET, DROP_EPISODE_QUIET)
            self._drop_timer.start(self._drop_episode_tick)

    def count_drop(self, reason: str) -> None:
        """Count one message dropped for this client."""
        self.router.stats.drops[reason] += 1
        self.episode_drops += 1
        self.dropped += 1
        self._drop_reason = reason

    def _drop_episode_tick(self) -> None:
        """Every quiet interval: log the episode once no drop came during the last one."""
        if self.shed is not None and self.alive:
            return  # still shedding: look again later
        self._end_drop_episode()

    def _end_drop_episode(self) -> None:
        if self._drop_timer is not None:
            self._drop_timer.stop()
            self._drop_timer = None
        if self.episode_drops:
            self.log.warning("flood.drop", count=self.episode_drops, reason=self._drop_reason)
            self.episode_drops = 0

    def warn_repeated(self, event: str, **fields: Any) -> None:
        """Log a misbehaviour line: the first at once, then a count per interval."""
        repeats = self._repeats
        if repeats is None:
            repeats = self._repeats = {}
        now = time.monotonic()
        entry = repeats.get(event)
        if entry is None or now - entry[0] >= LOG_REPEAT_INTERVAL:
            if entry is not None and entry[1]:
                self.log.warning(event + ".repeated", suppressed=entry[1])
            repeats[event] = [now, 0]
            self.log.warning(event, **fields)
        else:
            entry[1] += 1
            self.router.stats.log_lines_suppressed += 1

    # --- closing ---------------------------------------------------------------------

    def close(self, reason: str, detail: str = "") -> None:
        """Disconnect this client (idempotent); logged with ``reason`` and counted.

        Unless the client itself closed, it is first told why (our
        ``CMSG disconnect`` extension), best effort and without waiting.
        """
        if not self.alive:
            return
        self.alive = False
        self.ended = reason
        stats = self.router.stats
        stats.disconnects[reason] = stats.disconnects.get(reason, 0) + 1
        lost = self.queue.clear() + len(self.pending or ())
        self.pending = None
        if lost:
            why = "slow_client_disconnected" if reason == "slow_client" else "client_gone"
            stats.drops[why] += lost
            self.dropped += lost
        if reason != "closed":
            why_text = reason + (": " + detail if detail else "")
            with contextlib.suppress(OSError):
                self.send(codec.encode_cmsg(_DISCONNECT, why_text.encode("utf-8", "replace")))
        self._end_drop_episode()
        if self._repeats:
            for event, (_, suppressed) in self._repeats.items():
                if suppressed:
                    self.log.warning(event + ".repeated", suppressed=suppressed)
        level = self.log.info if reason in _ORDINARY else self.log.warning
        level("client.disconnected", reason=reason, detail=detail, lost=lost)
        self._read_watcher.close()
        if self._write_watcher is not None:
            self._write_watcher.close()
        self.notices = None
        self._stash = None
        waiters, self.waiters = self.waiters, None
        for publisher, _ in waiters or ():
            if publisher.alive:
                publisher.resume()
        self.router.forget(self)
        self.sock.close()
