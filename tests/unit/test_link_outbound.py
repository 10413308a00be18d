"""The link's way out (``Outbound``) and its way to the bus (``BusWriter``),
on whichever path this process runs (compiled or ``SBUS_PURE_PYTHON=1``):
a MSG and a packed batch are taken whole or not at all, each kept message
numbered and counted; messages to the bus leave in order, in packed batches,
bounded."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sbus_relay import accel
from sbus_relay.link import outbound, tobus
from sbus_relay.link.engine import Outgoing
from sbus_relay.protocol import codec, frames
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.natsledger import Ledger
from sbus_relay.protocol.natsmap import SubjectMap

pytestmark = pytest.mark.timeout(30)


def test_the_path_taken_is_the_one_accel_chose() -> None:
    compiled = accel.compiled()
    assert (outbound.Outbound.__module__ == "sbus_relay.link._c_outbound") == compiled
    assert (tobus.BusWriter.__module__ == "sbus_relay.link._c_tobus") == compiled


def make() -> outbound.Outbound:
    return outbound.Outbound(SubjectMap("sbus"), [b"pub/"], b"!/cred/A/", Ledger("A", 1))


def test_a_msg_and_a_packed_batch_are_taken_message_by_message() -> None:
    o, out = make(), []  # type: ignore[var-annotated]
    assert o.take(out, codec.encode_msg(b"pub/x", b"p0"))
    keys = [b"pub/y", b"home/z", b"pub/x"]
    batch = codec.encode_batch([codec.encode_msg(k, b"q%d" % i) for i, k in enumerate(keys)])
    assert o.take(out, batch)
    assert [(e, p) for _, e, p in out] == [("A 1 1", b"p0"), ("A 1 2", b"q0"), ("A 1 3", b"q2")]
    assert out[0][0] == out[2][0] != out[1][0]  # one subject per key, kept
    assert o.drops == {"not_exported": 1, "secret": 0}
    assert o.payload_bytes == 6
    assert not o.take(out, codec.encode_sub(b"pub/"))  # not a message: not taken


def test_a_malformed_batch_is_taken_not_at_all() -> None:
    o, out = make(), []  # type: ignore[var-annotated]
    good = codec.encode_batch([codec.encode_msg(b"pub/a", b"x")] * 2)
    with pytest.raises(PeerError):
        o.take(out, good[:-1])  # cut short
    assert out == [] and o.payload_bytes == 0 and o.ledger.seq == 0


def test_long_keys_and_secrets() -> None:
    o, out = make(), []  # type: ignore[var-annotated]
    long_key = b"pub/" + b"k" * outbound.SUBJECT_MAX
    o.add(out, long_key, b"x")
    o.add(out, b"!/cred/B/k", b"y")  # another host's identity: never leaves
    o.add(out, b"!/cred/A/k", b"z")  # this host's, prefixed on the way out: crosses
    got: list[Outgoing] = out
    assert got[0][0] == SubjectMap("sbus").long and got[0][2] == long_key + b"\0x"
    assert o.drops["secret"] == 1 and len(got) == 2
    assert o.payload_bytes == len(long_key) + 2 + 1


def test_the_bus_gets_messages_in_order_in_packed_batches_bounded() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    theirs.setblocking(False)

    async def run() -> list[bytes]:
        w = tobus.BusWriter(ours, asyncio.get_running_loop())
        n = 3000  # more than one frame holds
        for i in range(n):
            assert w.put(codec.msg_head(b"k/%d" % i), b"p%03d" % (i % 1000))
        assert w.queued == n
        got: list[bytes] = []
        deadline = asyncio.get_running_loop().time() + 10
        while len(got) < n and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0)
            try:
                frame = theirs.recv(1 << 20)
            except BlockingIOError:
                continue
            packets, _ = frames.unpack(frame)
            got.extend(packets)
        w.stop()
        return got

    try:
        got = asyncio.run(run())
    finally:
        ours.close()
        theirs.close()
    assert got == [codec.encode_msg(b"k/%d" % i, b"p%03d" % (i % 1000)) for i in range(3000)]
