"""The sbus packet codec: bytes in, events out, and back.  No I/O.

One SOCK_SEQPACKET packet is one message (docs/protocol.md, "Packets"):

    SUB <pattern>[\\0<ignored>]      Subscribe
    UNSUB <pattern>[\\0<ignored>]    Unsubscribe
    MSG <key>\\0<payload>            Publish (forwarded byte for byte)
    CMSG <key>[\\0<payload>]         Control (never forwarded)

    CMSG batch\\0(<length><MSG>)...   Packed batch (our extension)

Anything else raises ``PeerError`` -- the only error bad input can raise.
The server's read loop picks the key out of a ``MSG`` itself (allocating
only the key); ``decode`` builds an event object and serves everything else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import PeerError, UsageError
from .limits import BATCH_MESSAGES, MAX_PACKET

#: The head of a packed batch: then, per MSG packet, its length in 4 bytes
#: (big-endian) and the packet (docs/protocol.md, "Packed batches").
BATCH_HEAD = b"CMSG batch\0"
#: What a peer sends to be sent packed batches, and the answer that says it will be.
BATCH_ON = b"batch/on"
T = TypeVar("T")
#: A packed message's length: 4 bytes, big-endian.
_U32 = struct.Struct(">I")
SUB = b"SUB "
UNSUB = b"UNSUB "
MSG = b"MSG "
CMSG = b"CMSG "
NUL = b"\0"


@dataclass(frozen=True, slots=True)
class Subscribe:
    pattern: bytes


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    pattern: bytes


@dataclass(frozen=True, slots=True)
class Publish:
    key: bytes
    payload: bytes
    packet: bytes  # the whole packet, forwarded unchanged


@dataclass(frozen=True, slots=True)
class Control:
    key: bytes
    payload: bytes | None  # None when the sender omitted "\0<payload>"


Event = Subscribe | Unsubscribe | Publish | Control


def _head(packet: bytes, start: int) -> bytes:
    """The field from ``start`` up to the first NUL (or the end)."""
    nul = packet.find(NUL, start)
    return packet[start:] if nul < 0 else packet[start:nul]


def decode(packet: bytes) -> Event:
    """Turn one received packet into an event, or raise ``PeerError``."""
    if len(packet) > MAX_PACKET:
        raise PeerError("protocol_error", "packet too long")
    if packet.startswith(MSG):
        nul = packet.find(NUL, 4)
        if nul < 0:
            raise PeerError("protocol_error", "MSG without NUL")
        return Publish(packet[4:nul], packet[nul + 1 :], packet)
    if packet.startswith(SUB):
        return Subscribe(_head(packet, 4))
    if packet.startswith(UNSUB):
        return Unsubscribe(_head(packet, 6))
    if packet.startswith(CMSG):
        nul = packet.find(NUL, 5)
        if nul < 0:
            return Control(packet[5:], None)
        return Control(packet[5:nul], packet[nul + 1 :])
    if not packet:
        raise PeerError("protocol_error", "empty packet")
    raise PeerError("protocol_error", "unknown verb")


def encode_sub(pattern: bytes) -> bytes:
    """``SUB <pattern>``."""
    _check_field(pattern)
    return SUB + pattern


def encode_unsub(pattern: bytes) -> bytes:
    """``UNSUB <pattern>``."""
    _check_field(pattern)
    return UNSUB + pattern


def encode_msg(key: bytes, payload: bytes) -> bytes:
    """``MSG <key>\\0<payload>``."""
    _check_field(key)
    return MSG + key + NUL + payload


def msg_head(key: bytes) -> bytes:
    """``MSG <key>\\0``: what every message packet of ``key`` begins with (a
    packet is its head and its payload: ``head + payload``), checked once."""
    _check_field(key)
    return MSG + key + NUL


def encode_cmsg(key: bytes, payload: bytes | None = None) -> bytes:
    """``CMSG <key>[\\0<payload>]``; servers always pass a payload (docs/protocol.md, "Packets")."""
    _check_field(key)
    return CMSG + key if payload is None else CMSG + key + NUL + payload


def encode_batch(packets: list[bytes]) -> bytes:
    """One packed batch of MSG packets (at most ``BATCH_MESSAGES``, and a frame
    within ``MAX_PACKET``: the caller splits)."""
    parts = [BATCH_HEAD]
    for packet in packets:
        parts.append(len(packet).to_bytes(4, "big"))
        parts.append(packet)
    return b"".join(parts)


def pack_batches(packets: list[bytes]) -> list[bytes]:
    """MSG ``packets`` as few packed batches as the bounds allow (``BATCH_MESSAGES``
    per frame, a frame within ``MAX_PACKET``); a packet that fits no frame with
    another goes in one of its own, and a lone packet goes as it is."""
    frames: list[bytes] = []
    start = 0
    while start < len(packets):
        size = len(BATCH_HEAD) + 4 + len(packets[start])
        end = start + 1
        while end < len(packets) and end - start < BATCH_MESSAGES:
            size += 4 + len(packets[end])
            if size > MAX_PACKET:
                break
            end += 1
        group = packets[start:end]
        frames.append(group[0] if len(group) == 1 else encode_batch(group))
        start = end
    return frames


def unpack_batch(frame: bytes) -> list[bytes]:
    """The MSG packets of one packed batch (``CMSG batch\\0...``), in order.

    A malformed frame -- a length past its end, more than ``BATCH_MESSAGES``
    packets, or anything but a MSG inside -- raises ``PeerError``.
    """
    if not frame.startswith(BATCH_HEAD):
        raise PeerError("protocol_error", "not a packed batch")
    packets: list[bytes] = []
    append = packets.append
    offset = len(BATCH_HEAD)
    end = len(frame)
    lengths = _U32.unpack_from
    while offset < end:
        if end - offset < 4 or len(packets) == BATCH_MESSAGES:
            raise PeerError("protocol_error", "malformed packed batch")
        (size,) = lengths(frame, offset)
        offset += 4
        if size > end - offset:
            raise PeerError("protocol_error", "malformed packed batch")
        packet = frame[offset : offset + size]
        offset += size
        if not packet.startswith(MSG) or packet.find(NUL, 4) < 0:
            raise PeerError("protocol_error", "a packed batch holds only MSG packets")
        append(packet)
    return packets


def split_batch(frame: bytes, make: Callable[[bool, bytes, bytes, bytes], T]) -> list[T]:
    """``make(False, key, payload, packet)`` for each MSG of a packed batch, in
    order, in one pass (a client's receiving path); the checks of ``unpack_batch``."""
    out: list[T] = []
    append = out.append
    offset = len(BATCH_HEAD)
    end = len(frame)
    lengths = _U32.unpack_from
    find = frame.find
    count = 0
    while offset < end:
        if end - offset < 4 or count == BATCH_MESSAGES:
            raise PeerError("protocol_error", "malformed packed batch")
        (size,) = lengths(frame, offset)
        start = offset + 4
        offset = start + size
        nul = find(NUL, start + 4, offset)
        if offset > end or nul < 0 or not frame.startswith(MSG, start):
            if offset > end:
                raise PeerError("protocol_error", "malformed packed batch")
            raise PeerError("protocol_error", "a packed batch holds only MSG packets")
        append(make(False, frame[start + 4 : nul], frame[nul + 1 : offset], frame[start:offset]))
        count += 1
    return out


def _check_field(value: bytes) -> None:
    if NUL in value:
        raise UsageError("routing keys and patterns cannot contain NUL")
