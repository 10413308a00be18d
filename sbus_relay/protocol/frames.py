"""The readers of received packets, one per frame kind, bounds-checked, and a
packed batch built on the hot path.  No I/O.

What it owns: how a MSG and a packed batch are read, and how a packed batch
is built message by message (``BatchFrame``).  What it may touch: nothing
(pure functions over the bytes given, and the frame it builds).

Every byte the project receives is read here or in ``codec.decode`` (which
reads ``SUB``, ``UNSUB`` and ``CMSG`` with the help of these), and nowhere
else (``tests/unit/test_codec_only.py`` walks the source for slicing, NUL
splitting and packet prefixes outside ``protocol/``).  Two frame kinds come on
every message, so they are read here, compiled with the rest of the hot path
(``sbus_relay.accel``), allocating only what is kept:

    MSG <key>\\0<payload>              ``msg_key`` (the key: the bus's read loop),
                                       ``msg_parts`` (key and payload: a client),
                                       ``msg_in`` (from a buffer of one's own: the recorder)
    CMSG batch\\0(<length><MSG>)...     ``unpack`` (the packets and keys: the bus),
                                       ``unpack_full`` (and the payloads: a client),
                                       ``unpack_messages`` (keys and payloads: the NATS link);
                                       ``BatchFrame``: one built message by message
                                       (the NATS link's way to the bus)

(docs/protocol.md, "Packets" and "Packed batches").  Each kind has one set
of rules, applied by one private reader (``_msg_nul``, ``_walk``) that the
public functions share.  Bad input raises ``PeerError("protocol_error",
...)``, nothing else.
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


def _msg_nul(packet: bytes) -> int:
    """Where the key of ``MSG <key>\\0<payload>`` ends (its NUL); -1 if
    ``packet`` is not a MSG.  The one reading of a MSG's rules."""
    if not packet.startswith(_MSG):
        return -1
    nul = find_byte(packet, _NUL, 4)
    if nul < 0:
        raise PeerError("protocol_error", "MSG without NUL")
    return nul


def msg_key(packet: bytes) -> bytes | None:
    """The key of ``MSG <key>\\0<payload>``; None if ``packet`` is not a MSG."""
    nul = _msg_nul(packet)
    if nul < 0:
        return None
    return cut(packet, 4, nul)


def msg_parts(packet: bytes) -> tuple[bytes, bytes] | None:
    """The key and the payload of ``MSG <key>\\0<payload>``; None if ``packet``
    is not a MSG."""
    nul = _msg_nul(packet)
    if nul < 0:
        return None
    return cut(packet, 4, nul), cut(packet, nul + 1, len(packet))


def is_msg(packet: bytes) -> bool:
    """Whether ``packet`` is a MSG (by its verb; ``msg_key`` checks the rest)."""
    return packet.startswith(_MSG)


def is_batch(packet: bytes) -> bool:
    """Whether ``packet`` is a packed batch (``CMSG batch\\0...``)."""
    return packet.startswith(_BATCH)


def _walk(
    frame: bytes, payloads: bool, whole: bool = True
) -> tuple[list[bytes] | None, list[bytes], list[bytes] | None]:
    """The one reading of a packed batch: its MSG packets (if ``whole``),
    their keys and (if asked) their payloads.  The whole frame is checked before anything is
    returned: a malformed one (not a packed batch, a length cut short or past
    its end, a packet that is not a MSG, more than ``BATCH_MESSAGES``)
    delivers nothing of itself."""
    if not frame.startswith(_BATCH):
        raise PeerError("protocol_error", "not a packed batch")
    offset = len(_BATCH)
    end = len(frame)
    packets: list[bytes] | None = [] if whole else None
    keys: list[bytes] = []
    bodies: list[bytes] | None = [] if payloads else None
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
        if packets is not None:
            packets.append(packet)
        keys.append(cut(packet, 4, nul))
        if bodies is not None:
            bodies.append(cut(packet, nul + 1, size))
        count += 1
    return packets, keys, bodies


def unpack(frame: bytes) -> tuple[list[bytes], list[bytes]]:
    """A packed batch's MSG packets, in order, and the key of each (``_walk``)."""
    packets, keys, _ = _walk(frame, False)
    assert packets is not None
    return packets, keys


def unpack_full(frame: bytes) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """A packed batch's MSG packets, in order, with the key and the payload of
    each (``_walk``): a client's receiving path."""
    packets, keys, payloads = _walk(frame, True)
    assert packets is not None and payloads is not None
    return packets, keys, payloads


def unpack_messages(frame: bytes) -> tuple[list[bytes], list[bytes]]:
    """A packed batch's keys and payloads, in order, without the packets
    (``_walk``): the NATS link's way out."""
    _, keys, payloads = _walk(frame, True, False)
    assert payloads is not None
    return keys, payloads


def msg_in(
    buffer: bytes | bytearray, length: int, payload: bool
) -> tuple[bytes, int, bytes | None] | None:
    """The MSG in ``buffer[:length]``, for a reader that receives into a buffer
    of its own (the recorder): its key, its payload's size and (if
    ``payload``) its payload, copied once each; None if that packet is not a
    MSG."""
    if length > MAX_PACKET:
        raise PeerError("protocol_error", "packet longer than %d bytes" % MAX_PACKET)
    if length < 4 or not buffer.startswith(_MSG, 0, length):
        return None  # (what follows ``length`` is an older packet's)
    nul = buffer.find(_NUL, 4, length)
    if nul < 0:
        raise PeerError("protocol_error", "MSG without NUL")
    view = memoryview(buffer)
    key = bytes(view[4:nul])
    body = bytes(view[nul + 1 : length]) if payload else None
    return key, length - nul - 1, body


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
