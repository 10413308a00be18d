"""The wire protocol against a real server process, over raw sockets (docs/protocol.md).

Negative checks use a fence (``rawclient.fenced``) instead of sleeping.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import pytest

from tests.server.rawclient import (
    FENCE,
    FENCE_PACKET,
    WHOAMI,
    Closed,
    RawClient,
    fenced,
    own_creds,
    publish_then_fence,
)

pytestmark = pytest.mark.timeout(30)


# --- byte-for-byte forwarding -------------------------------------------------

ALL_BYTES = bytes(range(256))


@pytest.mark.parametrize(
    "payload",
    [
        ALL_BYTES,
        ALL_BYTES * 16 + b"\0\0\0",
        b"\0",
        b"",
        b"MSG x\0y\0SUB \0CMSG z",
        bytes(reversed(ALL_BYTES)) * 3,
    ],
    ids=["all-bytes", "all-bytes-x16", "nul", "empty", "embedded-verbs", "reversed"],
)
def test_binary_payload_is_forwarded_byte_for_byte(
    connect: Callable[[], RawClient], payload: bytes
) -> None:
    sub, pub = connect(), connect()
    sub.sub(b"bin/")
    sent = pub.pub(b"bin/\x01 \xff\x7f", payload)
    assert sent == b"MSG bin/\x01 \xff\x7f\0" + payload
    assert sub.recv_packet() == sent


def test_key_may_hold_any_byte_but_nul(connect: Callable[[], RawClient]) -> None:
    # protocol.md: a routing key may contain any byte other than NUL ('*', '/' and
    # '!' aside, which have meanings).  An exact pattern must match it exactly.
    key = bytes(b for b in range(1, 256) if b not in b"*/!")
    sub, pub = connect(), connect()
    fenced(sub, key)
    sent = publish_then_fence(pub, key, ALL_BYTES)
    assert sub.recv_packet() == sent
    assert sub.recv_packet() == FENCE_PACKET


def test_150_kib_message_arrives_intact(connect: Callable[[], RawClient]) -> None:
    sub, pub = connect(), connect()
    sub.sub(b"big/")
    payload = os.urandom(150 * 1024)
    sent = pub.pub(b"big/one", payload)
    assert sub.recv_packet() == sent


@pytest.mark.parametrize("size", [212_000, 300_000, 409_600])
def test_large_legal_packets_are_forwarded(connect: Callable[[], RawClient], size: int) -> None:
    # protocol.md: up to 409,600 bytes is legal (the reference limit), so a packet of
    # exactly that size -- and anything between the default socket buffer (~208 KiB)
    # and it -- must reach the subscriber intact, and nobody is disconnected.
    sub, pub = connect(), connect()
    pub.grow_sndbuf()
    sub.sub(b"max/")
    head = b"MSG max/x\0"
    sent = pub.pub(b"max/x", os.urandom(size - len(head)))
    assert len(sent) == size
    assert sub.recv_packet() == sent
    sub.sync()
    pub.sync()


@pytest.mark.parametrize("size", [409_601, 1_000_000])
def test_packet_over_409600_bytes_disconnects_only_its_sender(
    connect: Callable[[], RawClient], size: int
) -> None:
    big, sub, other = connect(), connect(), connect()
    fenced(sub, b"")
    big.grow_sndbuf(4 << 20)
    big.pub(b"huge/x", b"\xab" * (size - len(b"MSG huge/x\0")))
    leftovers = big.expect_closed()
    # Nothing but the server's notice of why (docs/protocol.md, "Our extensions").
    assert leftovers == [b"CMSG disconnect\0protocol_error: packet longer than 409600 bytes"]
    # The oversized packet was not forwarded (it would precede the fence)...
    publish_then_fence(other, b"after/big", b"ok")
    assert sub.recv_packet() == b"MSG after/big\0ok"
    assert sub.recv_packet() == FENCE_PACKET
    # ...and everyone else is still served.
    assert sub.whoami()
    assert other.whoami()


# --- junk packets -----------------------------------------------------------------


@pytest.mark.parametrize(
    "junk",
    [b"", b"HELLO world", b"MSG no-nul-here", b"sub x", b"SUB", b"UNSUB", b"CMSG", b"MSGx\0y"],
    ids=["empty", "unknown-verb", "msg-without-nul", "lowercase", "SUB", "UNSUB", "CMSG", "MSGx"],
)
def test_junk_packet_disconnects_only_its_sender(
    connect: Callable[[], RawClient], bus: Any, junk: bytes
) -> None:
    # protocol.md: anything but the four wire forms is a protocol error; the sender is
    # disconnected and nobody else notices.
    sub, bad, other = connect(), connect(), connect()
    fenced(sub, b"")
    bad.sync()  # proves "bad" was fine before the junk
    bad.send(junk)
    assert bad.expect_closed()[-1].startswith(b"CMSG disconnect\0protocol_error")
    publish_then_fence(other, b"after/junk", b"ok")
    assert sub.recv_packet() == b"MSG after/junk\0ok"
    assert sub.recv_packet() == FENCE_PACKET
    assert bus.proc.poll() is None
    with RawClient(bus.address) as fresh:
        assert fresh.whoami()


# --- control messages ----------------------------------------------------------


def test_cmsg_is_never_forwarded(connect: Callable[[], RawClient]) -> None:
    sender = connect()
    watchers = [fenced(connect(), p) for p in (b"", b"*", b"*/", b"c/", b"c/k")]
    sender.sub(b"")  # the sender must not get its own CMSGs back either
    for packet in (
        b"CMSG c/k\0payload",
        b"CMSG c/k",
        b"CMSG \0x",
        b"CMSG echo/on\0x",
        b"CMSG blocking/soft/queue",
        b"CMSG no/such/control\0x",  # protocol.md: unknown control messages are ignored
    ):
        sender.send(packet)
    sender.pub(FENCE, b"end")
    for watcher in watchers:
        assert watcher.recv_packet() == FENCE_PACKET
    assert sender.recv_packet() == FENCE_PACKET
    sender.sync()  # and the sender is still connected


@pytest.mark.parametrize("form", [b"CMSG !/cred/whoami", b"CMSG !/cred/whoami\0"])
def test_whoami_answers_with_peer_credentials(
    connect: Callable[[], RawClient], form: bytes
) -> None:
    gid, uid, pid = own_creds()
    client = connect()
    client.send(form)
    expected = b"CMSG " + WHOAMI + b"\0!/cred/%d/%d/%d" % (gid, uid, pid)
    assert client.recv_packet() == expected
    client.expect_nothing(0.2)


def test_whoami_answer_goes_only_to_the_asker(connect: Callable[[], RawClient]) -> None:
    asker, watcher = connect(), connect()
    fenced(watcher, b"", b"*/", b"*")
    asker.cmsg(WHOAMI)
    assert asker.recv_packet().startswith(b"CMSG !/cred/whoami\0")
    asker.pub(FENCE, b"end")
    assert watcher.recv_packet() == FENCE_PACKET


def test_closed_client_is_forgotten(connect: Callable[[], RawClient], bus: Any) -> None:
    # A client that goes away must not break delivery to the rest.
    pub, sub = connect(), connect()
    fenced(sub, b"gone/")
    for _ in range(20):
        with RawClient(bus.address) as leaver:
            leaver.sub(b"gone/")
    sent = publish_then_fence(pub, b"gone/x")
    assert sub.recv_packet() == sent
    assert sub.recv_packet() == FENCE_PACKET


def test_helper_sees_eof_as_closed() -> None:
    # The disconnect tests rely on the helper telling EOF from silence.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with RawClient(None, sock=a) as client:
        with pytest.raises(TimeoutError):
            client.recv_packet(0.05)
        b.close()
        with pytest.raises(Closed):
            client.recv_packet(1.0)
