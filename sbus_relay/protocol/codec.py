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

from dataclasses import dataclass

from .errors import PeerError, UsageError
from .limits import MAX_PACKET

#: The head of a packed batch: then, per MSG packet, its length in 4 bytes
#: (big-endian) and the packet (docs/protocol.md, "Packed batches").
BATCH_HEAD = b"CMSG batch\0"
#: What a peer sends to be sent packed batches, and the answer that says it will be.
BATCH_ON = b"batch/on"
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


def _check_field(value: bytes) -> None:
    if NUL in value:
        raise UsageError("routing keys and patterns cannot contain NUL")
