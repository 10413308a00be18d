"""The mapping against a real nats-server: what it delivers for drawn patterns
and keys is what the model of its rules and the bus's own matcher say."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from sbus_relay.link.natspy_private import write_held
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.natsmap import SubjectMap, relaxed
from tests.nats.cluster import NatsServer
from tests.natsmodel import nats_match
from tests.support import free_port

pytestmark = pytest.mark.timeout(60)

SEGMENTS = [b"", b"a", b"b", b"ab", b"a.b", b" ", b">", b"%", b"\xff", b"*x"]
PATTERN_SEGMENTS = [b"", b"a", b"ab", b"a.b", b" ", b"\xff", b"*", b"a*"]


def draw(rng: random.Random) -> tuple[list[bytes], list[bytes]]:
    keys = {b"/".join(rng.choice(SEGMENTS) for _ in range(rng.randint(1, 4))) for _ in range(60)}
    patterns = {b""} | {
        b"/".join(rng.choice(PATTERN_SEGMENTS) for _ in range(rng.randint(1, 3)))
        + (b"/" if rng.random() < 0.3 else b"")
        for _ in range(40)
    }
    return sorted(keys), sorted(patterns)


async def deliveries(
    url: str, m: SubjectMap, keys: list[bytes], patterns: list[bytes], expected: int
) -> set:
    import nats

    got: set[tuple[bytes, bytes]] = set()
    sub_nc = await nats.connect(url)
    pub_nc = await nats.connect(url)
    try:
        for p in patterns:
            subject = m.subscription(p)
            if subject is None:
                continue

            async def cb(msg, p: bytes = p) -> None:  # type: ignore[no-untyped-def]
                got.add((p, m.key(msg.subject.encode())))

            await sub_nc.subscribe(subject.decode(), cb=cb)
        # the subscriptions read by the server before anything is published
        # (nats-py's flush alone may overtake them: write_held)
        await write_held(sub_nc, 10)
        await sub_nc.flush()
        for k in keys:
            await pub_nc.publish(m.subject(k).decode(), b"")
        await write_held(pub_nc, 10)
        await pub_nc.flush()
        for _ in range(200):  # until what the model expects came (or 10 s), then a bit more
            if len(got) >= expected:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
    finally:
        await sub_nc.close()
        await pub_nc.close()
    return got


def test_real_server_delivers_what_the_model_and_the_bus_say(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, "match", free_port(), free_port(), [])
    try:
        m = SubjectMap("sbus")
        keys, patterns = draw(random.Random(20261127))
        model, bus = expectations(m, keys, patterns)
        got = asyncio.run(deliveries(server.url, m, keys, patterns, len(model)))
    finally:
        server.stop()
    assert got == model
    assert got == bus
    assert len(got) > 50  # the draw exercises real matches


def expectations(
    m: SubjectMap, keys: list[bytes], patterns: list[bytes]
) -> tuple[set[tuple[bytes, bytes]], set[tuple[bytes, bytes]]]:
    """(pattern, key) pairs the model of NATS says are delivered, and the bus's."""
    model = set()
    bus = set()
    for p in patterns:
        sub = m.subscription(p)
        r = relaxed(p)
        ix: SubscriptionIndex = SubscriptionIndex()
        if r is not None:
            ix.add(0, r)
        for k in keys:
            if sub is not None and nats_match(sub, m.subject(k)):
                model.add((p, k))
            if ix.match(k):
                bus.add((p, k))
    return model, bus
