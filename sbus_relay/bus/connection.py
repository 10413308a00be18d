"""One client of the server: its socket, reader greenlet, outbound queue and writer.

The reader loop is the hot path: it reads packets in batches into one shared
buffer, hands MSG packets straight to ``Server.publish`` and everything else to
``Server.handle``.  The writer greenlet exists only while the client has a
backlog (SPEC §4); it drains the queue in the client's chosen order.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent
from gevent.event import Event

from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.flood import OutboundQueue
from sbus_relay.protocol.keys import Credentials
from sbus_relay.protocol.limits import BLOCK_RECHECK, DROP_EPISODE_QUIET, MAX_PACKET, READ_BATCH

if TYPE_CHECKING:
    from .server import Server

_MSG = b"MSG "
_NUL = b"\0"
_TRUNC = socket.MSG_TRUNC
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


class Connection:
    """A connected client.  Created by ``Server`` at accept time."""

    def __init__(self, server: Server, sock: socket.socket, cid: int, creds: Credentials) -> None:
        self.server = server
        self.sock = sock
        self.send = sock.send  # bound once: the fan-out calls it per recipient
        self.cid = cid
        self.creds = creds
        self.echo = True
        self.interest = False
        self.alive = True
        self.queue = OutboundQueue(
            server.config.hard_limit_bytes, server.config.hard_limit_messages
        )
        #: (event, still-busy?) pairs this client's reader must wait on before it
        #: reads again: block modes (SPEC §4) and a slow upstream (SPEC §6)
        self.waits: list[tuple[Event, Callable[[], bool]]] = []
        #: drop reason while new messages for this client are shed without a
        #: send attempt (soft discard with a full socket, or hard discard over
        #: the limit); the fan-out checks it first so a stalled client costs
        #: the others two increments per message
        self.shed: str | None = None
        self.episode_drops = 0
        #: every message dropped for this client since it connected (CMSG drops/count)
        self.drops_total = 0
        self._drop_reason = ""  # the latest drop reason, for the episode's log line
        self.blocked = False
        self.space = Event()  # set by the writer whenever the backlog shrinks
        self.log = server.log.bind(client=cid, pid=creds.pid, uid=creds.uid, gid=creds.gid)
        hub = gevent.get_hub()
        self._hub = hub
        self._read_watcher = hub.loop.io(sock.fileno(), 1)
        self._write_watcher = hub.loop.io(sock.fileno(), 2)
        self._writer: gevent.Greenlet | None = None
        self._shed_watcher: Any = None
        self._drop_timer: Any = None
        self.reader = gevent.spawn(self._read_loop)

    # --- reading ---------------------------------------------------------

    def _read_loop(self) -> None:
        server = self.server
        stats = server.stats
        buf = server.recv_buffer
        view = server.recv_view
        recv_into = self.sock.recv_into
        publish = server.publish
        handle = server.handle
        wait = self._hub.wait
        watcher = self._read_watcher
        msgs = nbytes = 0
        try:
            while self.alive:
                for _ in range(READ_BATCH):
                    try:
                        n = recv_into(buf, MAX_PACKET, _TRUNC)
                    except BlockingIOError:
                        break
                    if n == 0:
                        self._zero_length()
                        return
                    if n > MAX_PACKET:
                        raise PeerError(
                            "protocol_error", "packet longer than %d bytes" % MAX_PACKET
                        )
                    packet = bytes(view[:n])
                    nbytes += n
                    if packet.startswith(_MSG):
                        nul = packet.find(_NUL, 4)
                        if nul < 0:
                            raise PeerError("protocol_error", "MSG without NUL")
                        msgs += 1
                        publish(self, packet, packet[4:nul])
                    else:
                        handle(self, packet)
                    if self.waits:
                        self._wait_for_space()
                    if not self.alive:
                        return
                else:
                    stats.packets_in["msg"] += msgs
                    stats.bytes_in += nbytes
                    msgs = nbytes = 0
                    gevent.sleep(0)  # a full batch: let the other clients in
                    continue
                stats.packets_in["msg"] += msgs
                stats.bytes_in += nbytes
                msgs = nbytes = 0
                wait(watcher)
        except PeerError as e:
            if e.reason == "protocol_error":  # a refused SUB was counted as a SUB
                stats.packets_in["invalid"] += 1
            self.close(e.reason, e.detail)
        except OSError as e:
            self.close("io_error", str(e))
        except gevent.GreenletExit:
            raise
        except Exception as e:  # a bug of ours: cost this one client, never the server
            self.log.exception("client.internal_error")
            self.close("internal_error", repr(e))
        finally:  # the last batch's counts, whichever way the loop ended
            stats.packets_in["msg"] += msgs
            stats.bytes_in += nbytes

    def _zero_length(self) -> None:
        """recv returned 0: the peer closed, or it sent an empty packet (SPEC §1)."""
        try:
            more = self.sock.recv(1, _PEEK)
        except BlockingIOError:
            more = None  # still open: that was an empty packet
        except OSError:
            more = b""
        if more == b"":
            self.close("closed")
        else:
            self.server.stats.packets_in["invalid"] += 1
            self.close("protocol_error", "empty packet")

    def _wait_for_space(self) -> None:
        """Pause this publisher until what it filled can take more (block modes)."""
        waits, self.waits = self.waits, []
        self.blocked = True
        try:
            for space, busy in waits:
                while self.alive and busy():
                    space.clear()
                    space.wait(BLOCK_RECHECK)
        finally:
            self.blocked = False

    def wait_for(self, target: Connection, *, until_empty: bool) -> None:
        """After this packet, pause until ``target``'s queue is empty or below its limit."""
        q = target.queue

        def busy() -> bool:
            return target.alive and bool(q.count if until_empty else q.over_limit())

        self.waits.append((target.space, busy))

    # --- writing ---------------------------------------------------------

    def enqueue(self, packet: bytes) -> None:
        """Queue a packet behind the backlog and make sure a writer drains it."""
        self.queue.push(packet, time.monotonic())
        if self._writer is None:
            self._writer = gevent.spawn(self._write_loop)

    def send_control(self, packet: bytes, *, essential: bool = False) -> None:
        """Send a server-made CMSG.  Soft modes never drop it; over the hard limit
        the client's hard mode applies as for any message (SPEC §4), except that
        an *essential* notice (interest/add, /remove, /ready), which a relay cannot
        afford to miss, disconnects the client instead: it reconnects and resyncs.
        """
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
        if self.queue.over_limit():
            hard = self.queue.hard
            if essential or hard == "error":
                self.close("slow_client", "hard limit reached with a control message pending")
                return
            if hard == "discard":
                self.count_drop("hard_discard")
                return
        self.enqueue(packet)

    def _write_loop(self) -> None:
        q = self.queue
        stats = self.server.stats
        send = self.send
        try:
            while self.alive and q.count:
                self._hub.wait(self._write_watcher)
                sent = nbytes = 0
                while q.count:
                    packet, t = q.peek()
                    try:
                        send(packet)
                    except BlockingIOError:
                        break
                    q.pop()
                    sent += 1
                    nbytes += len(packet)
                    stats.observe_queue_wait(time.monotonic() - t)
                stats.delivered += sent
                stats.bytes_out += nbytes
                if self.shed is not None and not q.over_limit():
                    self.shed = None  # below the hard limit again: stop shedding
                self.space.set()
        except OSError as e:
            self.close("io_error", str(e))
        finally:
            self._writer = None
            self.space.set()

    # --- drops and closing ----------------------------------------------------

    def start_shedding(self, reason: str) -> None:
        """Drop this message and the next ones without trying, until the client
        can take messages again; the episode is logged once, with its count."""
        self.server.stats.drops[reason] += 1
        self.episode_drops += 1
        self.drops_total += 1
        self._drop_reason = self.shed = reason
        if reason == "soft_discard" and not self.queue.count:
            # nothing queued, so no writer will notice the socket drain: watch it
            if self._shed_watcher is None:
                self._shed_watcher = self._hub.loop.io(self.sock.fileno(), 2)
            self._shed_watcher.start(self._writable)
        if self._drop_timer is None:
            self._drop_timer = gevent.spawn_later(DROP_EPISODE_QUIET, self._drop_episode, 0)

    def _writable(self) -> None:
        """libev callback: the socket can take packets again."""
        self._shed_watcher.stop()
        if self.queue.soft != "discard" or not self.queue.count:
            self.shed = None

    def reset_shedding(self) -> None:
        """A flood-control mode changed: decide afresh on the next message."""
        self.shed = None
        if self._shed_watcher is not None:
            self._shed_watcher.stop()

    def count_drop(self, reason: str) -> None:
        """Count one dropped message (no shedding state)."""
        self.server.stats.drops[reason] += 1
        self.episode_drops += 1
        self.drops_total += 1
        self._drop_reason = reason

    def _drop_episode(self, seen: int) -> None:
        if self.episode_drops != seen and self.alive:  # still dropping: look again later
            self._drop_timer = gevent.spawn_later(
                DROP_EPISODE_QUIET, self._drop_episode, self.episode_drops
            )
            return
        self.log.warning("flood.drop", count=self.episode_drops, reason=self._drop_reason)
        self.episode_drops = 0
        self._drop_timer = None

    def close(self, reason: str, detail: str = "") -> None:
        """Disconnect this client (idempotent); logged with ``reason`` and counted."""
        if not self.alive:
            return
        self.alive = False
        stats = self.server.stats
        stats.disconnects[reason] = stats.disconnects.get(reason, 0) + 1
        lost = self.queue.clear()
        if lost:
            why = "slow_client_disconnected" if reason == "slow_client" else "client_gone"
            stats.drops[why] += lost
        if self._drop_timer is not None:
            self._drop_timer.kill(block=False)
            if self.episode_drops:
                self.log.warning("flood.drop", count=self.episode_drops, reason=self._drop_reason)
        if self._shed_watcher is not None:
            self._shed_watcher.close()
        level = self.log.info if reason in ("closed", "server_stopping") else self.log.warning
        level("client.disconnected", reason=reason, detail=detail, lost=lost)
        self.space.set()
        self.server.forget(self)
        current = gevent.getcurrent()
        for g in (self.reader, self._writer):
            if g is not None and g is not current:
                g.kill(block=False)
        self._read_watcher.close()
        self._write_watcher.close()
        self.sock.close()
