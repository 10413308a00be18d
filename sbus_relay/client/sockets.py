"""The socket work both faces of the client share: a received packet checked,
and a connection closed without resetting its peer.

What it owns: how a packet received into a client's buffer is checked, and
how a client's socket is closed.  What it may touch: the socket it is given.
"""

from __future__ import annotations

import socket

from sbus_relay.protocol.errors import BusClosed, PeerError
from sbus_relay.protocol.limits import MAX_PACKET, NOTICE_SCAN_PACKETS

#: MSG_TRUNC as a plain int: ``flags & socket.MSG_TRUNC`` goes through the
#: enum's ``__and__`` on every packet received.
TRUNC = int(socket.MSG_TRUNC)


def received(view: memoryview, size: int, flags: int) -> bytes:
    """The packet ``recvmsg_into`` put at the start of ``view``: ``BusClosed``
    at the end of the stream (a server never sends an empty packet),
    ``PeerError`` for one longer than any packet may be (the buffer is one
    byte larger than the largest, so that such a one is seen; docs/protocol.md,
    "Packets")."""
    if size == 0:
        raise BusClosed("the bus closed the connection")
    if flags & TRUNC or size > MAX_PACKET:
        raise PeerError("protocol_error", f"server sent a packet over {MAX_PACKET} bytes")
    return bytes(view[:size])


def drain_and_close(sock: socket.socket) -> None:
    """Close, reading first what already arrived: a socket closed with unread
    packets resets its peer, which the bus would log as an I/O error."""
    try:
        sock.settimeout(0.0)
        for _ in range(NOTICE_SCAN_PACKETS):
            if not sock.recv(MAX_PACKET):
                break
    except OSError:
        pass  # nothing more to read, or the bus has gone: closed all the same
    sock.close()
