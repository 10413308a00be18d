"""The codec: a table of packets, round trips, and fuzzing (only PeerError may escape)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import PeerError, UsageError
from sbus_relay.protocol.limits import BATCH_MESSAGES

pytestmark = pytest.mark.timeout(60)

TABLE = [
    (b"SUB a/b", codec.Subscribe(b"a/b")),
    (b"SUB a/b\0ignored", codec.Subscribe(b"a/b")),
    (b"SUB ", codec.Subscribe(b"")),
    (b"UNSUB x\0y", codec.Unsubscribe(b"x")),
    (b"MSG k\0", codec.Publish(b"k", b"", b"MSG k\0")),
    (b"MSG k\0p\0q", codec.Publish(b"k", b"p\0q", b"MSG k\0p\0q")),
    (b"CMSG echo/off", codec.Control(b"echo/off", None)),
    (b"CMSG k\0", codec.Control(b"k", b"")),
    (b"CMSG k\0v", codec.Control(b"k", b"v")),
]


@pytest.mark.parametrize(("packet", "event"), TABLE)
def test_decode_table(packet: bytes, event: codec.Event) -> None:
    assert codec.decode(packet) == event


@pytest.mark.parametrize(
    "packet", [b"", b"MSG k", b"MSG", b"SUB", b"sub x", b"PUB x\0", b"MSGk\0", b"\0SUB x"]
)
def test_bad_packets_are_peer_errors(packet: bytes) -> None:
    with pytest.raises(PeerError) as info:
        codec.decode(packet)
    assert info.value.reason == "protocol_error"


def test_encoders_refuse_nul_in_keys() -> None:
    with pytest.raises(UsageError):
        codec.encode_msg(b"a\0b", b"")


field = st.binary(max_size=20).filter(lambda b: b"\0" not in b)


@settings(max_examples=300, deadline=None)
@given(field, st.binary(max_size=50))
def test_roundtrip_publish(key: bytes, payload: bytes) -> None:
    packet = codec.encode_msg(key, payload)
    event = codec.decode(packet)
    assert event == codec.Publish(key, payload, packet)


@settings(max_examples=300, deadline=None)
@given(field, st.one_of(st.none(), st.binary(max_size=20)))
def test_roundtrip_control(key: bytes, payload: bytes | None) -> None:
    assert codec.decode(codec.encode_cmsg(key, payload)) == codec.Control(key, payload)


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=64),
        st.sampled_from([b"MSG ", b"SUB ", b"UNSUB ", b"CMSG "]).flatmap(
            lambda v: st.binary(max_size=30).map(lambda b: v + b)
        ),
    )
)
def test_fuzz_only_peer_errors(packet: bytes) -> None:
    """Any bytes either decode to one of the four events or raise PeerError."""
    try:
        event = codec.decode(packet)
    except PeerError as e:
        assert e.reason == "protocol_error"
        return
    assert packet.startswith((b"MSG ", b"SUB ", b"UNSUB ", b"CMSG "))
    assert isinstance(event, codec.Publish | codec.Subscribe | codec.Unsubscribe | codec.Control)


def test_pack_keeps_order_and_sends_what_is_not_a_msg_alone() -> None:
    packets = [b"MSG a\0" + b"1", b"MSG a\0" + b"2", b"CMSG k", b"MSG b\0" + b"3"]
    frames, counts = codec.pack(packets)
    assert counts == [2, 1, 1]
    assert frames[1:] == [b"CMSG k", b"MSG b\0" + b"3"]  # a lone MSG goes as it is
    assert codec.unpack(frames[0])[0] == packets[:2]


def test_pack_keeps_each_frame_within_its_bounds() -> None:
    big = codec.encode_msg(b"k", bytes(1000))
    frames, counts = codec.pack([big] * 10, max_bytes=2500)
    assert counts == [2, 2, 2, 2, 2]
    assert all(len(f) <= 2500 for f in frames)
    many = [codec.encode_msg(b"k", b"")] * (BATCH_MESSAGES + 1)
    assert codec.pack(many)[1] == [BATCH_MESSAGES, 1]


@settings(max_examples=300, deadline=None)
@given(field.filter(bool), st.binary(max_size=50))
def test_a_request_splits_into_what_made_it(reply_to: bytes, payload: bytes) -> None:
    assert codec.split_request(codec.encode_request(reply_to, payload)) == (reply_to, payload)


def test_what_is_not_a_request_is_a_usage_error() -> None:
    for payload in (b"no nul", b"\0starts with one"):
        with pytest.raises(UsageError):
            codec.split_request(payload)


def test_encode_subscription_says_sub_or_unsub() -> None:
    assert codec.encode_subscription(b"a/", True) == codec.encode_sub(b"a/")
    assert codec.encode_subscription(b"a/", False) == codec.encode_unsub(b"a/")
