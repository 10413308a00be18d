"""The recorder: a bus client that writes what it receives into capture files.

What it owns: the recording loop, its drop query and what it hands the writer.
What it may touch: its bus connection (through protocol.codec), its writer and
loss log.

One loop owns one raw SEQPACKET socket and one ``RotatingCaptureWriter``.  It
reads in tight non-blocking batches (``recv_into`` one reusable buffer, up to
RECORDER_READ_BATCH packets or until the socket is empty), keeps the columns in plain
lists and hands each batch to the writer, which builds Arrow arrays once per
batch: no per-message object beyond the key and payload bytes.  When the socket
is empty it waits in ``poll`` for at most TICK_SECONDS, so that a stop request,
a due journal flush (twice a second) and a drop query are never late.

Losses: once a second the recorder asks the bus how many messages it dropped
for this connection (``CMSG drops/count``, our protocol extension; see
docs/pipeline.md "Drop query"), and writes every increase, with its time, into
the capture's loss log (``capture.LossLog``).  On a bus that does not answer
(the reference sbusd ignores unknown control messages) losses are unknown, and
the log says so.  On stop it unsubscribes and asks one last time: the reply
comes after every message the bus sent us, so the final count is exact.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sbus_relay.ops.addresses import Address, connect
from sbus_relay.protocol import codec, control
from sbus_relay.protocol.codec import encode_cmsg, encode_sub, encode_unsub
from sbus_relay.protocol.errors import BusClosed, PeerError
from sbus_relay.protocol.keys import WHOAMI
from sbus_relay.protocol.limits import MAX_PACKET, NOTICE_SCAN_PACKETS, RECORDER_READ_BATCH

from .capture import LossLog, RotatingCaptureWriter

if TYPE_CHECKING:
    import threading

#: Longest wait for the socket when it is empty, seconds: how soon a stop
#: request, a due flush or a drop query is seen.
TICK_SECONDS = 0.1
#: Seconds to wait for the whoami reply that proves our SUBs are in place.
READY_TIMEOUT = 5.0
#: On stop, wait at most this long (seconds) for the bus to confirm that it has
#: sent us everything (the whoami reply after our UNSUBs).
DRAIN_MAX = 5.0
#: Seconds between drop queries while recording.
DROP_POLL_SECONDS = 1.0
#: Seconds between progress callbacks (the terminal progress line).
PROGRESS_INTERVAL = 0.5

#: The drop query (our extension): the reply's payload is the decimal drop total.
DROPS_KEY = control.DROPS_COUNT


def _refusal(payload: bytes | None) -> BusClosed:
    """The bus's notice of why it closes us (``CMSG disconnect``), as the error."""
    reason, detail = control.parse_disconnect(payload)
    text = f"{reason}: {detail}" if detail else reason
    return BusClosed(f"the bus closed the connection: {text}", reason)


@dataclass
class RecorderStatus:
    """Live numbers for the progress line and the summary."""

    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    control_messages: int = 0
    #: True when the bus answers the drop query, False when it does not.
    drop_query: bool = False
    #: Messages the bus dropped for us (valid when drop_query).
    dropped: int = 0
    #: Why recording ended early ("" for a requested stop).
    ended_by: str = ""


class Recorder:
    """Subscribe to ``patterns`` on the bus at ``address`` and feed ``writer``."""

    def __init__(
        self,
        address: str | Address,
        patterns: Sequence[str | bytes],
        writer: RotatingCaptureWriter,
        *,
        drop_poll_seconds: float = DROP_POLL_SECONDS,
    ) -> None:
        self.address = address
        self.patterns = [p.encode("utf-8") if isinstance(p, str) else p for p in patterns]
        self.writer = writer
        self.drop_poll_seconds = drop_poll_seconds
        self.status = RecorderStatus()
        self.loss_log: LossLog | None = None
        self._buffer = bytearray(MAX_PACKET + 1)  # +1: an over-long packet fills it
        self._whoami_seen = False
        self._query_pending = False
        self._times: list[int] = []
        self._keys: list[bytes] = []
        self._sizes: list[int] = []
        self._payloads: list[bytes] = []

    def run(
        self,
        stop: threading.Event | Callable[[], bool],
        *,
        progress: Callable[[Recorder], None] | None = None,
        on_ready: Callable[[], None] | None = None,
        max_messages: int | None = None,
        deadline: float | None = None,
    ) -> None:
        """Record until ``stop`` is set, ``max_messages`` are written, the monotonic
        ``deadline`` passes, or the bus closes (``BusClosed`` propagates).

        ``on_ready`` is called once the subscriptions are in place.  Every journal
        is finished into a Parquet file on the way out, and the loss log closed.
        """
        should_stop = stop.is_set if hasattr(stop, "is_set") else stop
        writer = self.writer
        sock = connect(self.address)
        try:
            self._handshake(sock)
        except BusClosed as exc:
            self.status.ended_by = str(exc)
            sock.close()
            raise
        # Only a session the bus accepted has a loss log.
        self.loss_log = LossLog(writer.directory, writer.prefix)
        try:
            self.loss_log.write(
                "start", instance=writer.instance, drop_query=self.status.drop_query
            )
            self.status.ready = True
            if on_ready is not None:
                on_ready()
            self._loop(sock, should_stop, progress, max_messages, deadline)
            if max_messages is None or writer.stats.messages < max_messages:
                self._finish(sock, record=True)
            else:
                self._finish(sock, record=False)
            self.loss_log.write(
                "end",
                messages=writer.stats.messages,
                dropped=self.status.dropped if self.status.drop_query else None,
            )
        except BusClosed as exc:
            self.status.ended_by = str(exc)
            self.loss_log.write("end", messages=writer.stats.messages, closed=str(exc))
            raise
        finally:
            self._hand_over()
            sock.close()
            writer.close()
            self.loss_log.close()
            if progress is not None:
                progress(self)

    # --- phases --------------------------------------------------------------

    def _handshake(self, sock: socket.socket) -> None:
        """Subscribe, then ask for the drop count and whoami, in that order.

        The server handles one client's packets in order: the whoami reply means
        every SUB is in place, and a drop-count reply before it means the bus
        answers the query.  A relay whose upstream is away answers whoami late
        (docs/protocol.md); then recording starts anyway, with losses unknown.
        """
        sock.settimeout(READY_TIMEOUT)
        try:
            for pattern in self.patterns:
                sock.send(encode_sub(pattern))
            sock.send(encode_cmsg(DROPS_KEY))
            self._query_pending = True
            sock.send(encode_cmsg(WHOAMI))
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise self._closed(sock, exc) from None
        end = time.monotonic() + READY_TIMEOUT
        while not self._whoami_seen and time.monotonic() < end:
            sock.settimeout(max(0.001, end - time.monotonic()))
            try:
                self._receive_one(sock)
            except TimeoutError:
                break
        if not self.status.drop_query:
            self._query_pending = False

    def _loop(
        self,
        sock: socket.socket,
        should_stop: Callable[[], bool],
        progress: Callable[[Recorder], None] | None,
        max_messages: int | None,
        deadline: float | None,
    ) -> None:
        writer = self.writer
        sock.setblocking(False)
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        tick_ms = int(TICK_SECONDS * 1000)
        next_progress = next_query = 0.0
        while not should_stop():
            budget = RECORDER_READ_BATCH
            if max_messages is not None:
                budget = min(budget, max_messages - writer.stats.messages - len(self._times))
                if budget <= 0:
                    break
            got = self._read_batch(sock, budget)
            self._hand_over()
            now = time.monotonic()
            writer.tick()
            if deadline is not None and now >= deadline:
                break
            if self.status.drop_query and not self._query_pending and now >= next_query:
                self._ask_drops(sock)
                next_query = now + self.drop_poll_seconds
            if progress is not None and now >= next_progress:
                progress(self)
                next_progress = now + PROGRESS_INTERVAL
            if not got:
                poller.poll(tick_ms)

    def _finish(self, sock: socket.socket, *, record: bool) -> None:
        """Unsubscribe and read until the bus confirms it has sent us everything.

        Messages already on their way are recorded (unless ``record`` is false:
        a ``--count`` was reached), and the last drop count is exact.
        """
        self._hand_over()
        sock.setblocking(True)
        sock.settimeout(DRAIN_MAX)
        for pattern in self.patterns:
            sock.send(encode_unsub(pattern))
        if self.status.drop_query:
            sock.send(encode_cmsg(DROPS_KEY))
            self._query_pending = True
        self._whoami_seen = False
        sock.send(encode_cmsg(WHOAMI))
        end = time.monotonic() + DRAIN_MAX
        while not self._whoami_seen and time.monotonic() < end:
            sock.settimeout(max(0.001, end - time.monotonic()))
            try:
                self._receive_one(sock, record=record)
            except TimeoutError:
                break
            if len(self._times) >= RECORDER_READ_BATCH:
                self._hand_over()
        self._hand_over()

    # --- packets -------------------------------------------------------------

    def _read_batch(self, sock: socket.socket, budget: int) -> int:
        """Read up to ``budget`` packets without blocking; return how many."""
        buf = self._buffer
        view = memoryview(buf)
        recv_into = sock.recv_into
        now = time.time_ns
        times, keys, sizes, payloads = self._times, self._keys, self._sizes, self._payloads
        keep = self.writer.keep_payload
        # Bounded in bytes too: a batch of big payloads is handed over early.
        room = self.writer.row_group_bytes
        got = 0
        while got < budget and room > 0:
            try:
                n = recv_into(buf)
            except BlockingIOError:
                break
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise self._closed(sock, exc) from None
            if not n:
                raise BusClosed("the bus closed the connection")
            msg = codec.msg_in(buf, n, keep)  # None if not a MSG
            if msg is not None:
                times.append(now())
                keys.append(msg[0])
                sizes.append(msg[1])
                if keep:
                    payloads.append(msg[2])  # type: ignore[arg-type]
                    room -= n
                got += 1
            else:
                self._control(sock, bytes(view[:n]))
        return got

    def _receive_one(self, sock: socket.socket, *, record: bool = True) -> None:
        """One blocking receive (handshake and finish); raises TimeoutError."""
        try:
            n = sock.recv_into(self._buffer)
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise self._closed(sock, exc) from None
        if not n:
            raise BusClosed("the bus closed the connection")
        keep = self.writer.keep_payload
        msg = codec.msg_in(self._buffer, n, keep)  # None if not a MSG
        if msg is not None:
            if not record:
                return
            self._times.append(time.time_ns())
            self._keys.append(msg[0])
            self._sizes.append(msg[1])
            if keep:
                self._payloads.append(msg[2])  # type: ignore[arg-type]
        else:
            self._control(sock, bytes(memoryview(self._buffer)[:n]))

    def _closed(self, sock: socket.socket, exc: OSError) -> BusClosed:
        """The bus closed us: its reason, from the disconnect notice still waiting
        to be read (docs/protocol.md, ``CMSG disconnect``), else the socket's error."""
        sock.settimeout(0.0)
        for _ in range(NOTICE_SCAN_PACKETS):
            try:
                packet = sock.recv(MAX_PACKET)
            except OSError:
                break
            if not packet:
                break
            try:
                event = codec.decode(packet)
            except PeerError:
                continue  # not a packet the bus sends: not the notice either
            if isinstance(event, codec.Control) and event.key == control.DISCONNECT:
                return _refusal(event.payload)
        return BusClosed(f"the bus closed the connection: {exc.strerror or exc}")

    def _control(self, sock: socket.socket, packet: bytes) -> None:
        try:
            event = codec.decode(packet)
        except PeerError:
            event = None  # not a packet a bus sends: counted with the others
        key = payload = None
        if isinstance(event, codec.Control):
            key, payload = event.key, event.payload
        if key == control.DISCONNECT:
            raise _refusal(payload)
        if key == control.DROPS_COUNT:
            self._query_pending = False
            total = control.parse_drops_count(payload)
            if total is None:
                return
            self.status.drop_query = True
            if total > self.status.dropped:
                if self.loss_log is not None:
                    self.loss_log.write("drops", dropped=total - self.status.dropped, total=total)
                self.status.dropped = total
        elif key == WHOAMI:
            self._whoami_seen = True
        else:
            self.status.control_messages += 1

    def _ask_drops(self, sock: socket.socket) -> None:
        try:
            sock.send(encode_cmsg(DROPS_KEY))
        except BlockingIOError:
            return  # our send buffer is full: ask on the next tick
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise self._closed(sock, exc) from None
        self._query_pending = True

    def _hand_over(self) -> None:
        """Give the rows read so far to the writer."""
        if self._times:
            self.writer.extend(self._times, self._keys, self._sizes, self._payloads)
            self._times, self._keys, self._sizes, self._payloads = [], [], [], []
