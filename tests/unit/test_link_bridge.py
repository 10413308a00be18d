"""The link process's bridge with a stand-in engine, on a real socket pair:
``link/synced`` follows only a round trip that succeeded; messages cross
both ways as packed batches; a bus that closes its end stops the link."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import structlog

from sbus_relay.link.bridge import Bridge
from sbus_relay.link.engine import Outgoing, Sink
from sbus_relay.protocol import codec, linkwire

pytestmark = pytest.mark.timeout(30)


class Engine:
    """Connects at once; its round trips fail ``failing`` times, then succeed."""

    name = "fake"

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.trips = 0
        self.published: list[Outgoing] = []
        self.subscribed: dict[int, bytes] = {}
        self.sink: Sink | None = None

    async def start(self, sink: Sink) -> None:
        self.sink = sink
        sink.on_connected("n1:4222", False)

    async def publish(self, batch: list[Outgoing]) -> int:
        self.published.extend(batch)
        return 0

    async def subscribe(self, sid: int, subject: bytes, bounded: bool) -> None:
        self.subscribed[sid] = subject

    async def unsubscribe(self, sid: int) -> None:
        self.subscribed.pop(sid, None)

    async def round_trip(self, timeout: float) -> float | None:
        self.trips += 1
        if self.trips <= self.failing:
            return None
        return 0.001

    async def close(self, timeout: float) -> None:
        pass


async def packets(sock: socket.socket, wanted: Any, timeout: float = 5) -> list[bytes]:
    """What the link sent, until ``wanted(packets)``."""
    loop = asyncio.get_running_loop()
    got: list[bytes] = []
    deadline = loop.time() + timeout
    while not wanted(got):
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout} s: {got!r}")
        try:
            got.append(sock.recv(1 << 20))
        except BlockingIOError:
            await asyncio.sleep(0.01)
    return got


async def until(done: Any, timeout: float = 5) -> None:
    """Wait until ``done()``, at most ``timeout`` seconds (the link works in its own time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.01)


def test_synced_only_after_a_round_trip_that_succeeded() -> None:
    async def run() -> None:
        bus, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        bus.setblocking(False)
        engine = Engine(failing=2)
        hello = linkwire.Hello(host="a", servers=["nats://n1:4222"])
        bridge = Bridge(theirs, hello, engine, structlog.get_logger("test"))
        running = asyncio.ensure_future(bridge.run())
        bus.send(codec.encode_sub(b"k/"))
        bus.send(codec.encode_cmsg(linkwire.READY, b""))
        got = await packets(bus, lambda p: linkwire.SYNCED_PACKET in p)
        assert engine.trips >= 3  # two failed, then the one it answers after (more may follow)
        assert got.count(linkwire.SYNCED_PACKET) == 1
        assert 16 in engine.subscribed and engine.subscribed[16] == b"sbus.k.k.>"
        # a message from the bus goes to NATS on its subject ...
        bus.send(
            codec.encode_batch([codec.encode_msg(b"k/1", b"p1"), codec.encode_msg(b"k/2", b"p2")])
        )
        # ... each with its envelope: this link's origin, one sequence (docs/nats.md)

        def data() -> list[tuple[bytes, Any, bytes]]:
            return [(s, h, p) for s, h, p in engine.published if s.startswith(b"sbus.k.")]

        await until(lambda: len(data()) == 2)
        assert [(s, p) for s, _, p in data()] == [(b"sbus.k.k.1", b"p1"), (b"sbus.k.k.2", b"p2")]
        envelopes = [e for _, e, _ in data() if e is not None]
        assert [e.rpartition(" ")[2] for e in envelopes] == ["1", "2"]
        assert all(e.startswith("a ") for e in envelopes)
        # ... and one from NATS to the bus, once
        assert engine.sink is not None
        engine.sink.on_message(16, b"sbus.k.k.3", None, b"p3")
        engine.sink.on_message(16, b"sbus.k.k.4", None, b"p4")
        got = await packets(bus, lambda p: any(b"p4" in x for x in p))
        frame = next(x for x in got if b"p4" in x)
        assert linkwire.messages(frame) == ([b"k/3", b"k/4"], [b"p3", b"p4"])
        bus.close()  # the bus goes: the link ends
        await asyncio.wait_for(running, 5)

    asyncio.run(run())


def test_no_synced_while_every_round_trip_fails() -> None:
    async def run() -> None:
        bus, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        bus.setblocking(False)
        engine = Engine(failing=1 << 30)
        hello = linkwire.Hello(host="a", servers=["nats://n1:4222"])
        bridge = Bridge(theirs, hello, engine, structlog.get_logger("test"))
        running = asyncio.ensure_future(bridge.run())
        bus.send(codec.encode_sub(b"k/"))
        bus.send(codec.encode_cmsg(linkwire.READY, b""))
        await until(lambda: engine.trips >= 3)
        got: list[bytes] = []
        while True:
            try:
                got.append(bus.recv(1 << 20))
            except BlockingIOError:
                break
        assert linkwire.SYNCED_PACKET not in got
        bus.close()
        await asyncio.wait_for(running, 5)

    asyncio.run(run())
