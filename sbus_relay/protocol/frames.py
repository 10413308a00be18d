"""The wire format on the hot path: a MSG's key, a packed batch's packets.  No I/O.

``codec.decode`` builds an event object per packet; the bus's read loop must
not pay that for every message, so the two packets it meets on every
message are parsed here instead, allocating only what is kept (the key, and
a batch's packets):

    MSG <key>\\0<payload>              ``msg_key``: the key, or None for any other packet
    CMSG batch\\0(<length><MSG>)...     ``unpack``: the MSG packets and their keys;
                                      ``BatchFrame``: one built message by message

(docs/protocol.md, "Packets" and "Packed batches").  ``msg_end`` serves a
reader that receives into a buffer of its own (the recorder).  Bad input
raises ``PeerError("protocol_error", ...)``, nothing else.  Compiled with the
rest of the hot path (``sbus_relay.accel``).

What it owns: how those two packets are parsed, and a packed batch built on
the hot path.  What it may touch: nothing (pure functions, and the frame it builds).
"""

from __future__ import annotations

import struct

from sbus_relay.accel import load_compiled

from .errors import PeerError
from .limits import BATCH_MESSAGES, MAX_PACKET
from .scan import cut, find_byte, read_u32

_MSG = b"MSG "
_NUL = 0
#: The head of a packed batch (``codec.BATCH_HEAD``, which packs them).
_BATCH = b"CMSG batch\0"
#: A packed message's length: 4 bytes, big-endian.
_LENGTH = struct.Struct(">I").pack


def msg_key(packet: bytes) -> bytes | None:
    """The key of ``MSG <key>\\0<payload>``; None if ``packet`` is not a MSG."""
    if not packet.startswith(_MSG):
        return None
    nul = find_byte(packet, _NUL, 4)
    if nul < 0:
        raise PeerError("protocol_error", "MSG without NUL")
    return cut(packet, 4, nul)


def is_batch(packet: bytes) -> bool:
    """Whether ``packet`` is a packed batch (``CMSG batch\\0...``)."""
    return packet.startswith(_BATCH)


def unpack(frame: bytes) -> tuple[list[bytes], list[bytes]]:
    """A packed batch's MSG packets, in order, and the key of each.

    The whole frame is checked before anything is returned: a malformed one
    (a length cut short or past its end, a packet that is not a MSG, more
    than ``BATCH_MESSAGES``) delivers nothing of itself."""
    offset = len(_BATCH)
    end = len(frame)
    packets: list[bytes] = []
    keys: list[bytes] = []
    count = 0
    while offset < end:
        if end - offset < 4 or count == BATCH_MESSAGES:
            raise PeerError("protocol_error", "malformed packed batch")
        size = read_u32(frame, offset)
        offset += 4
        if size > end - offset:
            raise PeerError("protocol_error", "malformed packed batch")
        packet = cut(frame, offset, offset + size)
        offset += size
        nul = find_byte(packet, _NUL, 4)
        if nul < 0 or not packet.startswith(_MSG):
            raise PeerError("protocol_error", "a packed batch holds only MSG packets")
        packets.append(packet)
        keys.append(cut(packet, 4, nul))
        count += 1
    return packets, keys


def msg_end(buffer: bytes | bytearray, length: int) -> int:
    """Where the key of the MSG in ``buffer[:length]`` ends (its NUL), or -1 if
    that packet is not a MSG: for a reader that receives into a buffer of its own."""
    if not buffer.startswith(_MSG):
        return -1
    nul = buffer.find(_NUL, 4, length)
    if nul < 0 or length > MAX_PACKET:
        raise PeerError("protocol_error", "malformed or over-long MSG")
    return nul


class BatchFrame:
    """A packed batch built message by message, each given as its packet's
    head (``codec.msg_head``) and its payload, so that no packet is made on the way:
    at most ``BATCH_MESSAGES`` messages and ``limit`` bytes (a message larger
    than that goes alone).  ``frame()`` is what to send: the batch, or the lone
    MSG packet of a batch of one."""

    __slots__ = ("count", "data", "limit")

    def __init__(self, limit: int = MAX_PACKET) -> None:
        self.data = bytearray(_BATCH)
        self.count = 0
        self.limit = limit

    def add(self, head: bytes, payload: bytes) -> bool:
        """Add one message; False (nothing added) when the frame is full."""
        size = len(head) + len(payload)
        if self.count and (self.count >= BATCH_MESSAGES or len(self.data) + 4 + size > self.limit):
            return False
        data = self.data
        data += _LENGTH(size)
        data += head
        data += payload
        self.count += 1
        return True

    def frame(self) -> bytes:
        if self.count == 1:
            return bytes(self.data[len(_BATCH) + 4 :])
        return bytes(self.data)


load_compiled(globals(), "sbus_relay.protocol._c_frames")
