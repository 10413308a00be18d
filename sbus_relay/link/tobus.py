"""What the link process writes to its bus, from the link's asyncio loop.

What it owns: the order and the bounds of everything sent on the link's end
of the socket pair.  What it may touch: that socket, and the loop's writer
callback for it.  On every message's way from NATS: compiled where a
compiler is (``sbus_relay.accel``, ``_c_tobus.pxd``), the pure-Python path kept.

Four kinds of packets go to the bus, in this order of precedence: ``SUB`` /
``UNSUB`` as the other hosts' interest changes (the net change per pattern,
like a connection's notices: memory per distinct pattern, never lost), then
control packets (``nats/settled``, ``link/synced``, log records, in order;
the latest ``link/stats`` only), then ``MSG`` from other hosts, packed in
batches (docs/protocol.md, "Packed batches").  A write is scheduled once per
turn of the loop, so what NATS delivers in one burst goes in few frames; what
the socket refuses waits for it to drain, and messages beyond
``TO_BUS_MESSAGES`` (control packets beyond ``CONTROL_MAX``) are refused to
the caller, who counts them.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque

from sbus_relay.accel import load_compiled
from sbus_relay.protocol import codec, frames
from sbus_relay.protocol.limits import SEND_BUFFER

#: Messages from NATS waiting for room in the bus's socket; beyond it they are
#: refused (counted ``bus_full``): the bus is far behind.
TO_BUS_MESSAGES = 65_536
#: Control packets (log records mostly) waiting; beyond it a log record is dropped.
CONTROL_MAX = 1024
#: Largest packed frame written: half the send buffer, so that one always fits.
FRAME_BYTES = SEND_BUFFER // 2
# (the compiled module's own copies, as C integers)
_MESSAGES_MAX, _CONTROL_MAX, _FRAME_BYTES = TO_BUS_MESSAGES, CONTROL_MAX, FRAME_BYTES


class BusWriter:
    """Writes interest changes, control packets and messages to the bus, in order, bounded."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self._frames: deque[frames.BatchFrame] = deque()
        self._queued = 0  # messages in ``_frames``
        self._notices: dict[bytes, bool] = {}
        self._control: deque[bytes] = deque()
        self._stats: bytes | None = None
        self._writing = False  # waiting for the socket to drain
        self._soon = False  # a write is scheduled for this turn of the loop
        self.gone = False  # the bus closed its end

    @property
    def queued(self) -> int:
        return self._queued

    def tell(self, pattern: bytes, present: bool) -> None:
        """The other hosts' union gained (or lost) ``pattern``: coalesced per pattern."""
        if pattern in self._notices:
            del self._notices[pattern]  # came and went: nothing to say
        else:
            self._notices[pattern] = present
        self._schedule()

    def control(self, packet: bytes) -> bool:
        """A control packet, after the interest pending now; False if too many wait."""
        if len(self._control) >= _CONTROL_MAX:
            return False
        self._control.append(packet)
        self._schedule()
        return True

    def record(self, packets: list[bytes]) -> None:
        """A hand-over record's parts, after the control packets waiting (never refused)."""
        self._control.extend(packets)
        self._schedule()

    @property
    def idle(self) -> bool:
        """Everything taken so far is written (or the bus has gone)."""
        return self.gone or not (self._frames or self._control or self._notices or self._stats)

    def stats(self, packet: bytes) -> None:
        """The latest ``link/stats`` (an older one not yet written is replaced)."""
        self._stats = packet
        self._schedule()

    def put(self, head: bytes, payload: bytes) -> bool:
        """One message for the bus (its packet's head, ``codec.msg_head``, and its
        payload); False (not taken) if too many wait already."""
        if self._queued >= _MESSAGES_MAX:
            return False
        queue = self._frames
        if queue:
            frame = queue[-1]
            if frame.add(head, payload):
                self._queued += 1
                return True
        frame = frames.BatchFrame(_FRAME_BYTES)
        frame.add(head, payload)
        queue.append(frame)
        self._schedule()
        self._queued += 1
        return True

    def stop(self) -> None:
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False

    def _schedule(self) -> None:
        if not self._soon and not self._writing and not self.gone:
            self._soon = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._soon = False
        try:
            self._write()
        except BlockingIOError:
            if not self._writing:
                self._writing = True
                self._loop.add_writer(self._fd, self._flush)
            return
        except OSError:
            self.gone = True  # the bus has gone: the link's reader sees its EOF and ends
        self.stop()

    def _write(self) -> None:
        sock = self._sock
        if self._notices:
            # taken whole: popping a big dict from its front one by one costs a
            # scan past every slot freed before (quadratic: a snapshot of 200,000
            # patterns held the link for minutes)
            notices = list(self._notices.items())
            self._notices = {}
            for i, (pattern, present) in enumerate(notices):
                try:
                    sock.send(codec.encode_sub(pattern) if present else codec.encode_unsub(pattern))
                except BlockingIOError:
                    self._notices = dict(notices[i:])
                    raise
        control = self._control
        while control:
            sock.send(control[0])
            control.popleft()
        if self._stats is not None:
            sock.send(self._stats)
            self._stats = None
        queue = self._frames
        while queue:
            sock.send(queue[0].frame())  # (what the socket refuses waits for it to drain)
            self._queued -= queue.popleft().count


load_compiled(globals(), "sbus_relay.link._c_tobus")
