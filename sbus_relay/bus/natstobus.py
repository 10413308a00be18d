"""What a NATS bridge writes to its bus (``bus.natsbridge``), from the bridge's asyncio loop.

Theory of operation.  Three kinds of packets go to the bus's end of the
socket pair, in this order of precedence: ``SUB``/``UNSUB`` as the other
hosts' interest changes (the net change per pattern, like a connection's
notices: memory per distinct pattern, never lost), then ``CMSG
nats/settled`` once, then ``MSG`` from other hosts, packed in batches
(docs/protocol.md, "Packed batches").  A write is scheduled once per turn
of the loop, so what NATS delivers in one burst goes in few frames; what the
socket refuses waits for it to drain (a writer callback), and messages
beyond ``TO_BUS_MESSAGES`` are refused to the caller, who counts them.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque

from sbus_relay.protocol import codec
from sbus_relay.protocol.limits import BATCH_MESSAGES, SEND_BUFFER

#: Messages from NATS waiting for room in the bus's socket; beyond it they are
#: refused (the bridge counts them, ``bus_full``): the bus is far behind.
TO_BUS_MESSAGES = 65_536
#: What the bridge tells the bus once the other hosts' interest is known.
SETTLED = b"nats/settled"
#: Largest packed frame written: half the send buffer, so that one always fits.
FRAME_BYTES = SEND_BUFFER // 2


class BusWriter:
    """Writes interest changes and messages to the bus's end, in order, bounded."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self._messages: deque[bytes] = deque()
        self._notices: dict[bytes, bool] = {}
        self._settle_owed = False
        self._writing = False  # waiting for the socket to drain
        self._soon = False  # a write is scheduled for this turn of the loop
        #: the bus has been told the other hosts' interest is known
        self.settled = False

    @property
    def queued(self) -> int:
        return len(self._messages)

    def tell(self, pattern: bytes, present: bool) -> None:
        """The other hosts' union gained (or lost) ``pattern``: coalesced per pattern."""
        if pattern in self._notices:
            del self._notices[pattern]  # came and went: nothing to say
        else:
            self._notices[pattern] = present
        self._schedule()

    def settle(self) -> None:
        """Tell the bus, after the interest pending now, that it is complete."""
        self._settle_owed = True
        self._schedule()

    def put(self, packet: bytes) -> bool:
        """One ``MSG`` for the bus; False (not taken) if too many wait already."""
        if len(self._messages) >= TO_BUS_MESSAGES:
            return False
        self._messages.append(packet)
        self._schedule()
        return True

    def stop(self) -> None:
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False

    def _schedule(self) -> None:
        if not self._soon and not self._writing:
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
            return  # the bus has gone: the bridge's reader ends the bridge
        self.stop()

    def _write(self) -> None:
        sock = self._sock
        if self._notices:
            # taken whole: popping a big dict from its front one by one costs a
            # scan past every slot freed before (quadratic: a snapshot of 200,000
            # patterns held the loop for minutes)
            notices = list(self._notices.items())
            self._notices = {}
            for i, (pattern, present) in enumerate(notices):
                try:
                    sock.send((codec.SUB if present else codec.UNSUB) + pattern)
                except BlockingIOError:
                    self._notices = dict(notices[i:])
                    raise
        if self._settle_owed:
            sock.send(codec.encode_cmsg(SETTLED))
            self._settle_owed = False
            self.settled = True
        queue = self._messages
        while queue:
            batch: list[bytes] = []
            size = len(codec.BATCH_HEAD)
            while queue and len(batch) < BATCH_MESSAGES:
                more = len(queue[0]) + 4
                if batch and size + more > FRAME_BYTES:
                    break
                batch.append(queue.popleft())
                size += more
            frame = batch[0] if len(batch) == 1 else codec.encode_batch(batch)
            try:
                sock.send(frame)
            except BlockingIOError:
                queue.extendleft(reversed(batch))
                raise
