"""Packed batches (docs/protocol.md, "Packed batches"): many MSG packets in one
frame between peers that both asked for them.

The frames are checked byte for byte against ``codec.encode_batch``, from the
compiled helper and the pure-Python path alike; a real server packs what it
sends to a client that asked, unpacks what a client sends, and disconnects a
client whose batch is malformed.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sbus_relay.bus import batchio
from sbus_relay.protocol import codec
from sbus_relay.protocol.codec import BATCH_HEAD, encode_batch
from sbus_relay.protocol.limits import BATCH_MESSAGES, MAX_PACKET

pytestmark = pytest.mark.timeout(60)

SENDERS: dict[str, Callable[..., int]] = {"python": batchio._send_packed_py}
if batchio.COMPILED:
    SENDERS["compiled"] = batchio.send_packed


@pytest.fixture(params=sorted(SENDERS))
def send_packed(request: pytest.FixtureRequest) -> Callable[..., int]:
    return SENDERS[request.param]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    yield a, b
    a.close()
    b.close()


def frames_of(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(MAX_PACKET + 1))
        except BlockingIOError:
            return out


def test_runs_of_msg_packets_go_packed_and_anything_else_alone(
    send_packed: Callable[..., int], pair: Any
) -> None:
    a, b = pair
    msgs = [b"MSG k/%d\0" % i + b"x" * (i % 7) for i in range(BATCH_MESSAGES + 10)]
    reply = b"CMSG !/cred/whoami\0!/cred/1/2/3"
    packets = [*msgs[:5], reply, *msgs[5:]]
    assert send_packed(a.fileno(), packets, BATCH_HEAD) == len(packets)
    assert (
        frames_of(b)
        == [
            encode_batch(msgs[:5]),
            reply,
            encode_batch(msgs[5 : 5 + BATCH_MESSAGES]),  # at most BATCH_MESSAGES a frame
            encode_batch(msgs[5 + BATCH_MESSAGES :]),
        ]
    )


def test_a_frame_never_passes_the_largest_packet(
    send_packed: Callable[..., int], pair: Any
) -> None:
    a, b = pair
    big = [b"MSG big\0" + b"y" * 150_000 for _ in range(5)]
    assert send_packed(a.fileno(), big, BATCH_HEAD) == 5
    frames = frames_of(b)
    assert all(len(f) <= MAX_PACKET for f in frames)
    # a MSG that no other joins goes as it is, as codec.pack writes it
    assert frames == [encode_batch(big[0:2]), encode_batch(big[2:4]), big[4]]
    assert frames == codec.pack(big)[0]


def test_only_whole_frames_count_as_sent(send_packed: Callable[..., int], pair: Any) -> None:
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 200_000)  # room for a frame or two
    packets = [b"MSG k\0" + b"z" * 300 for _ in range(20 * BATCH_MESSAGES)]
    sent = send_packed(a.fileno(), packets, BATCH_HEAD)
    assert 0 < sent < len(packets)
    got = frames_of(b)
    assert got == [
        encode_batch(packets[i : i + BATCH_MESSAGES]) for i in range(0, sent, BATCH_MESSAGES)
    ]


def unpacked(frame: bytes) -> list[bytes]:
    assert frame.startswith(BATCH_HEAD)
    out, offset = [], len(BATCH_HEAD)
    while offset < len(frame):
        size = int.from_bytes(frame[offset : offset + 4], "big")
        out.append(frame[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return out


def test_a_client_that_asks_is_answered_and_sent_packed_batches(connect: Any) -> None:
    packer, pub = connect(), connect()
    packer.send(b"CMSG batch/on")
    assert packer.recv_packet() == b"CMSG batch/on\0"
    packer.sub(b"p/")
    messages = [b"MSG p/%d\0payload" % i for i in range(500)]
    for packet in messages:  # sent faster than read: the server reads them in batches
        pub.send(packet)
    got: list[bytes] = []
    frames = 0
    while len(got) < len(messages):
        packet = packer.recv_packet()
        if packet.startswith(BATCH_HEAD):
            frames += 1
            got += unpacked(packet)
        else:
            got.append(packet)
    assert got == messages
    assert frames >= 1  # at least one burst went packed


def test_a_packed_batch_from_a_client_is_delivered_as_single_messages(connect: Any) -> None:
    packer, sub = connect(), connect()
    sub.sub(b"q/")
    messages = [b"MSG q/%d\0v" % i for i in range(3)] + [b"MSG other\0not for sub"]
    packer.send(encode_batch(messages))
    packer.sync()
    assert [sub.recv_packet() for _ in range(3)] == messages[:3]
    sub.expect_nothing()  # a subscriber that did not ask gets plain packets only


@pytest.mark.parametrize(
    "frame",
    [
        BATCH_HEAD + b"\0\0",  # a length cut short
        BATCH_HEAD + (100).to_bytes(4, "big") + b"MSG k\0",  # past the frame's end
        encode_batch([b"SUB x"]),  # not a MSG
        encode_batch([b"MSG no nul"]),
        encode_batch([b"MSG k\0"] * (BATCH_MESSAGES + 1)),  # too many
        BATCH_HEAD + b"\x80\0\0\0MSG k\0",  # a length past 2**31
    ],
    ids=["short-length", "past-end", "not-msg", "msg-without-nul", "too-many", "huge-length"],
)
def test_a_malformed_batch_disconnects_its_sender_only(connect: Any, frame: bytes) -> None:
    bad, bystander = connect(), connect()
    bystander.sub(b"k")
    bad.send(frame)
    got = bad.expect_closed()
    assert got and got[-1].startswith(b"CMSG disconnect\0protocol_error")
    bystander.sync()  # still served
