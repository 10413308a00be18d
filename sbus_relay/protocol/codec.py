"""The sbus packet codec: bytes in, events out, and back.  No I/O.

What it owns: the packet layouts and their events.  What it may touch: nothing
(pure functions).

One SOCK_SEQPACKET packet is one message (docs/protocol.md, "Packets"):

    SUB <pattern>[\\0<ignored>]      Subscribe
    UNSUB <pattern>[\\0<ignored>]    Unsubscribe
    MSG <key>\\0<payload>            Publish (forwarded byte for byte)
    CMSG <key>[\\0<payload>]         Control (never forwarded)

    CMSG batch\\0(<length><MSG>)...   Packed batch (our extension)

This module and ``frames`` are the project's one codec: ``protocol/`` is the
only place that reads or writes a packet (the control messages' keys and
payloads are ``control``'s, a NATS envelope ``natsmap``'s), and nothing
outside it slices a packet, splits on its NUL or spells a verb
(``tests/unit/test_codec_only.py``).  Reading: ``decode`` turns any packet
into an event (``Subscribe``, ``Unsubscribe``, ``Publish``, ``Control``);
the readers of the two kinds that come on every message are ``frames``'
(compiled, re-exported here: ``msg_key``, ``msg_parts``, ``msg_in``,
``unpack``, ``unpack_full``, ``is_msg``, ``is_batch``).  Writing: one
``encode_*`` per kind (and ``msg_head``, a MSG's packet but its payload),
``pack`` for packed batches (``frames.BatchFrame`` builds one message by
message), and a request's payload
(``encode_request``, ``split_request``: the client library's convention).
Anything received that is not a packet raises ``PeerError`` -- the only
error bad input can raise; a caller's mistake (a NUL in a key) is a
``UsageError``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import PeerError, UsageError
from .frames import (
    is_batch,
    is_msg,
    msg_in,
    msg_key,
    msg_parts,
    unpack,
    unpack_full,
)
from .limits import BATCH_MESSAGES, MAX_PACKET

#: The head of a packed batch: then, per MSG packet, its length in 4 bytes
#: (big-endian) and the packet (docs/protocol.md, "Packed batches").
BATCH_HEAD = b"CMSG batch\0"
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
    parts = msg_parts(packet)
    if parts is not None:
        return Publish(parts[0], parts[1], packet)
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


def msg_length(key: bytes, payload: bytes) -> int:
    """The size of ``MSG <key>\\0<payload>`` without building it (is it within
    ``MAX_PACKET``?)."""
    return len(MSG) + len(key) + len(NUL) + len(payload)


def msg_head(key: bytes) -> bytes:
    """``MSG <key>\\0``: what every message packet of ``key`` begins with (a
    packet is its head and its payload: ``head + payload``), checked once."""
    _check_field(key)
    return MSG + key + NUL


def encode_cmsg(key: bytes, payload: bytes | None = None) -> bytes:
    """``CMSG <key>[\\0<payload>]``; servers always pass a payload (docs/protocol.md, "Packets")."""
    _check_field(key)
    return CMSG + key if payload is None else CMSG + key + NUL + payload


def encode_subscription(pattern: bytes, present: bool) -> bytes:
    """``SUB <pattern>`` when ``present``, else ``UNSUB <pattern>`` (an interest
    notice to an upstream, a change of the hosts' union to a bus)."""
    return encode_sub(pattern) if present else encode_unsub(pattern)


def encode_batch(packets: list[bytes]) -> bytes:
    """One packed batch of MSG packets (at most ``BATCH_MESSAGES``, and a frame
    within ``MAX_PACKET``: ``pack`` splits)."""
    parts = [BATCH_HEAD]
    for packet in packets:
        parts.append(len(packet).to_bytes(4, "big"))
        parts.append(packet)
    return b"".join(parts)


def pack(packets: list[bytes], max_bytes: int = MAX_PACKET) -> tuple[list[bytes], list[int]]:
    """``packets`` as few frames as the bounds allow, in order, and how many
    packets each frame carries: every run of MSG packets in packed batches
    (``BATCH_MESSAGES`` a frame, a frame within ``max_bytes``), anything else
    alone; a MSG that fits no frame with another goes as it is."""
    frames: list[bytes] = []
    counts: list[int] = []
    start = 0
    total = len(packets)
    head = len(BATCH_HEAD)
    while start < total:
        first = packets[start]
        end = start + 1
        if is_msg(first):
            size = head + 4 + len(first)
            while end < total and end - start < BATCH_MESSAGES and is_msg(packets[end]):
                size += 4 + len(packets[end])
                if size > max_bytes:
                    break
                end += 1
        frames.append(first if end - start == 1 else encode_batch(packets[start:end]))
        counts.append(end - start)
        start = end
    return frames, counts


def encode_request(reply_to: bytes, payload: bytes) -> bytes:
    """A request's payload: the key to answer on, a NUL, the request itself
    (a key never holds a NUL, so the first one ends it; docs/client.md)."""
    _check_field(reply_to)
    return reply_to + NUL + payload


def split_request(payload: bytes) -> tuple[bytes, bytes]:
    """``(reply_to, request)`` of a request's payload; ``UsageError`` if it is not one."""
    nul = payload.find(NUL)
    if nul <= 0:
        raise UsageError("not a request: its payload does not start with a reply key and a NUL")
    return payload[:nul], payload[nul + 1 :]


def _check_field(value: bytes) -> None:
    if NUL in value:
        raise UsageError("routing keys and patterns cannot contain NUL")


__all__ = [
    "BATCH_HEAD",
    "Control",
    "Event",
    "Publish",
    "Subscribe",
    "Unsubscribe",
    "decode",
    "encode_batch",
    "encode_cmsg",
    "encode_msg",
    "encode_request",
    "encode_sub",
    "encode_subscription",
    "encode_unsub",
    "is_batch",
    "is_msg",
    "msg_head",
    "msg_in",
    "msg_key",
    "msg_length",
    "msg_parts",
    "pack",
    "split_request",
    "unpack",
    "unpack_full",
]
