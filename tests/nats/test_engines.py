"""The link's two NATS engines (link/engine.py) against a real nats-server, the
same checks for each: messages with and without their envelope both ways
(and a native client's other headers), in order
(across subscriptions with nats.c, per subscription with nats-py), a round
trip, an unsubscribe, no server said and retried."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from sbus_relay.link import choice
from sbus_relay.link.engine import NATS_C, NATS_PY, EngineSettings, Envelope
from sbus_relay.link.natspy_private import write_held
from tests.nats.cluster import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    c = Cluster(tmp_path_factory.mktemp("engines"), n=1)
    yield c.servers[0].url
    c.stop()


#: nats.c kept to its public API, as on a libnats whose private parts the
#: link does not know (link/natsc_private.h)
NATS_C_PUBLIC = "nats.c public"


def engines() -> list[Any]:
    built = pytest.mark.skipif(not choice.nats_c_built(), reason="nats.c engine not built")
    return [NATS_PY, pytest.param(NATS_C, marks=built), pytest.param(NATS_C_PUBLIC, marks=built)]


@pytest.fixture(autouse=True)
def _private_parts_again() -> Iterator[None]:
    yield
    if choice.nats_c_built():
        from sbus_relay.link import _natsc  # type: ignore[attr-defined]

        _natsc.keep_to_public_api(False)


def make(name: str, settings: EngineSettings) -> Any:
    """The engine ``name`` (nats.c kept to its public API for ``NATS_C_PUBLIC``)."""
    if name.startswith(NATS_C):
        from sbus_relay.link import _natsc  # type: ignore[attr-defined]

        _natsc.keep_to_public_api(name == NATS_C_PUBLIC)
        return choice.make(NATS_C, settings)
    return choice.make(name, settings)


class Sink:
    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.messages: list[tuple[int, bytes, Envelope, bytes]] = []
        self.errors: list[str] = []
        self.came = asyncio.Event()

    def on_connected(self, server: str, again: bool) -> None:
        assert ":" in server and "://" not in server and not again
        self.connected.set()

    def on_disconnected(self) -> None:
        pass

    def on_error(self, text: str) -> None:
        self.errors.append(text)

    def on_slow_consumer(self, dropped: int) -> None:
        self.errors.append(f"slow {dropped}")

    def on_message(self, sid: int, subject: bytes, envelope: Envelope, payload: bytes) -> None:
        self.messages.append((sid, subject, envelope, payload))
        self.came.set()


async def until(what: Any, timeout: float = 10) -> None:
    async def poll() -> None:
        while not what():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


@pytest.mark.parametrize("name", engines())
def test_an_engine_both_ways(name: str, server: str) -> None:
    async def run() -> None:
        sink = Sink()
        engine = make(name, EngineSettings(servers=(server,), name="test " + name))
        await engine.subscribe(16, b"eng.a.>", True)
        await engine.start(sink)
        await asyncio.wait_for(sink.connected.wait(), 10)
        await engine.subscribe(17, b"eng.b.*", False)
        assert await engine.round_trip(5) is not None  # the server has both subscriptions
        # no_echo: our own messages never come back, so a second engine publishes
        other = Sink()
        peer = choice.make(NATS_PY, EngineSettings(servers=(server,), name="peer"))
        await peer.start(other)
        await asyncio.wait_for(other.connected.wait(), 10)
        batch = [
            (b"eng.a.x", None, b"1"),
            (b"eng.b.y", "hosta 7 1", b"2"),
            (b"eng.a.z", "hosta 7 2", b"3" * 100_000),
        ]
        assert await peer.publish(batch) == 0
        assert await peer.round_trip(5) is not None
        await until(lambda: len(sink.messages) == 3)
        if name == NATS_PY:  # in order per subscription only (each has a task of its own)
            sink.messages.sort(key=lambda m: m[0])
        assert sink.messages == [
            (16, b"eng.a.x", None, b"1"),
            *([] if name == NATS_PY else [(17, b"eng.b.y", "hosta 7 1", b"2")]),
            (16, b"eng.a.z", "hosta 7 2", b"3" * 100_000),
            *([(17, b"eng.b.y", "hosta 7 1", b"2")] if name == NATS_PY else []),
        ]
        # a native client's headers: the envelope among others is read the
        # general way, others alone are none of the link's business
        native = await nats.connect(server)
        await native.publish("eng.a.n1", b"n1", headers={"K": "v", "Sbus-Origin": "hostn 1 5"})
        await native.publish("eng.a.n2", b"n2", headers={"K": "v"})
        await native.publish("eng.a.n3", b"n3", headers={"Sbus-Origin": "  hostn 1 6  "})
        await native.flush()
        await until(lambda: len(sink.messages) == 6)
        assert sink.messages[3:] == [
            (16, b"eng.a.n1", "hostn 1 5", b"n1"),
            (16, b"eng.a.n2", None, b"n2"),
            (16, b"eng.a.n3", "hostn 1 6", b"n3"),
        ]
        del sink.messages[3:]
        # and the other way, from the engine under test: the envelope, alone
        back: list[Any] = []

        async def took(msg: Any) -> None:
            back.append((msg.subject, msg.headers, msg.data))

        await native.subscribe("eng.back.>", cb=took)
        # the subscription read by the server before the engine publishes
        # (nats-py's flush alone may overtake it: write_held)
        await write_held(native, 5)
        await native.flush()
        assert await engine.publish([(b"eng.back.1", "hosta 7 3", b"b")]) == 0
        assert await engine.publish([(b"eng.back.2", None, b"c")]) == 0
        await until(lambda: len(back) == 2)
        assert back == [
            ("eng.back.1", {"Sbus-Origin": "hosta 7 3"}, b"b"),
            ("eng.back.2", None, b"c"),
        ]
        await native.close()
        # an unsubscribed sid hears nothing more
        await engine.unsubscribe(16)
        assert await engine.round_trip(5) is not None
        await peer.publish([(b"eng.a.gone", None, b"x"), (b"eng.b.here", None, b"y")])
        await until(lambda: len(sink.messages) == 4)
        assert sink.messages[3][:2] == (17, b"eng.b.here")
        await engine.close(1)
        await peer.close(1)
        assert sink.errors == [] and other.errors == []

    asyncio.run(run())


@pytest.mark.parametrize("name", engines())
def test_no_server_is_said_and_retried(name: str, tmp_path: Path) -> None:
    async def run() -> None:
        sink = Sink()
        from tests.support import free_port

        engine = make(
            name, EngineSettings(servers=(f"nats://127.0.0.1:{free_port()}",), name="nobody")
        )
        await engine.start(sink)
        await until(lambda: bool(sink.errors), 10)
        assert not sink.connected.is_set()
        await engine.close(0.5)

    asyncio.run(run())
