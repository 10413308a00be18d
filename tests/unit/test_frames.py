"""The hot path's framing (``protocol.frames``): tables, round trips with the
codec's packer, and fuzzing (only PeerError may escape)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbus_relay.protocol import codec, frames
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.limits import BATCH_MESSAGES, MAX_PACKET

pytestmark = pytest.mark.timeout(60)

keys = st.binary(max_size=40).filter(lambda k: b"\0" not in k)
msgs = st.builds(codec.encode_msg, keys, st.binary(max_size=60))


@pytest.mark.parametrize(
    ("packet", "key"),
    [
        (b"MSG a/b\0payload", b"a/b"),
        (b"MSG \0", b""),
        (b"MSG k\0p\0q", b"k"),
        (b"SUB a/b", None),
        (b"CMSG batch\0", None),
        (b"MSGk\0", None),
        (b"", None),
    ],
)
def test_msg_key_table(packet: bytes, key: bytes | None) -> None:
    assert frames.msg_key(packet) == key


def test_a_msg_without_nul_is_a_peer_error() -> None:
    with pytest.raises(PeerError, match="MSG without NUL"):
        frames.msg_key(b"MSG key and no end")


@given(st.lists(msgs, max_size=BATCH_MESSAGES))
def test_unpack_gives_back_what_was_packed(packets: list[bytes]) -> None:
    frame = codec.encode_batch(packets)
    assert frames.is_batch(frame)
    got, got_keys = frames.unpack(frame)
    assert got == packets
    assert got_keys == [codec.decode(p).key for p in packets]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "frame",
    [
        codec.BATCH_HEAD + b"\0\0",  # a length cut short
        codec.BATCH_HEAD + (100).to_bytes(4, "big") + b"MSG k\0",  # past the end
        codec.encode_batch([b"MSG k\0", b"SUB x"]),  # not a MSG
        codec.encode_batch([b"MSG no nul"]),
        codec.encode_batch([b"MSG k\0"] * (BATCH_MESSAGES + 1)),  # too many
    ],
)
def test_a_malformed_batch_is_refused_whole(frame: bytes) -> None:
    with pytest.raises(PeerError) as info:
        frames.unpack(frame)
    assert info.value.reason == "protocol_error"


@given(st.binary(max_size=300))
def test_any_bytes_give_a_batch_or_a_peer_error(tail: bytes) -> None:
    try:
        packets, keys = frames.unpack(codec.BATCH_HEAD + tail)
    except PeerError:
        return
    assert len(packets) == len(keys) <= BATCH_MESSAGES
    assert all(frames.msg_key(p) == k for p, k in zip(packets, keys, strict=True))


def test_msg_in_reads_a_buffer_of_its_own() -> None:
    buffer = bytearray(64)
    packet = b"MSG a/b\0xyz"
    buffer[: len(packet)] = packet
    assert frames.msg_in(buffer, len(packet), True) == (b"a/b", 3, b"xyz")
    assert frames.msg_in(buffer, len(packet), False) == (b"a/b", 3, None)
    assert frames.msg_in(buffer, 2, True) is None  # "MS": an older packet's bytes follow
    buffer[:6] = b"CMSG k"
    assert frames.msg_in(buffer, 6, True) is None
    buffer[:5] = b"MSG k"
    buffer[5:] = b"x" * 59  # no NUL within the packet
    with pytest.raises(PeerError, match="without NUL"):
        frames.msg_in(buffer, 20, True)
    with pytest.raises(PeerError, match="longer than"):
        frames.msg_in(b"MSG k\0" + bytes(MAX_PACKET), MAX_PACKET + 6, True)


@pytest.mark.parametrize(
    ("packet", "parts"),
    [
        (b"MSG a/b\0payload", (b"a/b", b"payload")),
        (b"MSG \0", (b"", b"")),
        (b"MSG k\0p\0q", (b"k", b"p\0q")),
        (b"CMSG batch\0", None),
        (b"MSGk\0", None),
        (b"", None),
    ],
)
def test_msg_parts_table(packet: bytes, parts: tuple[bytes, bytes] | None) -> None:
    assert frames.msg_parts(packet) == parts


@given(st.lists(msgs, max_size=BATCH_MESSAGES))
def test_unpack_full_gives_the_payloads_too(packets: list[bytes]) -> None:
    got, keys, payloads = frames.unpack_full(codec.encode_batch(packets))
    assert got == packets
    assert list(zip(keys, payloads, strict=True)) == [frames.msg_parts(p) for p in packets]
    assert frames.unpack_messages(codec.encode_batch(packets)) == (keys, payloads)


def test_unpack_refuses_what_is_not_a_packed_batch() -> None:
    with pytest.raises(PeerError, match="not a packed batch"):
        frames.unpack(b"MSG k\0v")
