"""The packets between a bus and its NATS link process (protocol/linkwire.py):
every control packet round-trips, and malformed ones are refused with
``PeerError``, nothing else."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbus_relay.protocol import codec, linkwire
from sbus_relay.protocol.errors import PeerError

pytestmark = pytest.mark.timeout(60)


def payload_of(packet: bytes) -> bytes:
    got = linkwire.control(packet)
    assert got is not None
    return got[1]


def test_hello_round_trips_with_patterns_of_any_byte() -> None:
    hello = linkwire.Hello(
        host="web-1",
        servers=["nats://a:4222", "tls://b:4443"],
        export=[b"", b"\xff/x/", b"a b"],
        import_=[b"k/"],
        identities=True,
        user="bus",
        password="s3cret",
        engine="nats-py",
        log_level="debug",
    )
    packet = linkwire.encode_hello(hello)
    assert linkwire.control(packet) is not None
    assert linkwire.decode_hello(payload_of(packet)) == hello


@pytest.mark.parametrize("payload", [b"", b"{", b"[]", b'{"host": 1}', b'{"servers": []}'])
def test_a_bad_hello_is_refused(payload: bytes) -> None:
    with pytest.raises(PeerError):
        linkwire.decode_hello(payload)


counts = st.integers(min_value=0, max_value=2**64 - 1)


@given(
    state=st.sampled_from(linkwire.STATES),
    connected=st.booleans(),
    settled=st.booleans(),
    server=st.text(max_size=40).filter(lambda t: "\0" not in t),
    numbers=st.lists(counts, min_size=11, max_size=11),
    drops=st.lists(
        counts, min_size=len(linkwire.DROP_REASONS), max_size=len(linkwire.DROP_REASONS)
    ),
)
def test_stats_round_trip(
    state: str, connected: bool, settled: bool, server: str, numbers: list[int], drops: list[int]
) -> None:
    by_reason = dict(zip(linkwire.DROP_REASONS, drops, strict=True))
    s = linkwire.Stats(
        state=state, connected=connected, settled=settled, server=server, engine="nats.c",
        drops=by_reason,
    )  # fmt: skip
    for name, value in zip(
        ("sent", "sent_bytes", "received", "received_bytes", "reconnects", "unconfirmed",
         "to_bus_queued", "subscriptions", "remote_hosts", "remote_patterns", "rtt_us"),
        numbers, strict=True,
    ):  # fmt: skip
        setattr(s, name, value)
    assert linkwire.decode_stats(payload_of(linkwire.encode_stats(s))) == s


@given(st.binary(max_size=200))
def test_any_bytes_as_stats_or_log_are_refused_or_read(data: bytes) -> None:
    for decode in (linkwire.decode_stats, linkwire.decode_log):
        with contextlib.suppress(PeerError):
            decode(data)


def test_log_records_round_trip_and_carry_what_json_cannot_as_repr() -> None:
    packet = linkwire.encode_log("warning", "nats.lost", {"server": "a:1", "odd": b"\x00"})
    assert linkwire.decode_log(payload_of(packet)) == (
        "warning",
        "nats.lost",
        {"server": "a:1", "odd": "b'\\x00'"},
    )


def test_messages_of_a_msg_and_of_a_packed_batch() -> None:
    assert linkwire.messages(codec.encode_msg(b"a/b", b"x\0y")) == ([b"a/b"], [b"x\0y"])
    batch = codec.encode_batch([codec.encode_msg(b"k%d" % i, b"p%d" % i) for i in range(3)])
    assert linkwire.messages(batch) == ([b"k0", b"k1", b"k2"], [b"p0", b"p1", b"p2"])
    assert linkwire.messages(codec.encode_sub(b"a/")) is None
    with pytest.raises(PeerError):
        linkwire.messages(codec.BATCH_HEAD + b"\0\0\0\x09MSG a")  # cut short


def test_a_batch_built_message_by_message_is_the_packed_batch_of_its_packets() -> None:
    from sbus_relay.protocol import frames
    from sbus_relay.protocol.limits import BATCH_MESSAGES

    one = frames.BatchFrame()
    assert one.add(codec.msg_head(b"k"), b"v")
    assert one.frame() == codec.encode_msg(b"k", b"v")  # a batch of one: the lone packet
    full = frames.BatchFrame()
    packets = []
    while full.add(codec.msg_head(b"k/%d" % len(packets)), b"p"):
        packets.append(codec.encode_msg(b"k/%d" % len(packets), b"p"))
    assert full.count == len(packets) == BATCH_MESSAGES
    assert full.frame() == codec.encode_batch(packets)
    assert frames.unpack(full.frame())[0] == packets
    small = frames.BatchFrame(limit=100)
    assert small.add(codec.msg_head(b"a"), b"x" * 500)  # alone, whatever its size
    assert not small.add(codec.msg_head(b"b"), b"y")
