"""Client and AsyncClient against real buses: ours, plain and batched, and the
reference C sbusd (batched delivery detected as unknown, one packet per message)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from sbus_relay.client import AsyncClient, BufferFull, BusClosed, Client, UsageError
from tests.client.conftest import WAIT, Master
from tests.relay.conftest import Hierarchy

pytestmark = pytest.mark.timeout(60)

#: Messages per delivery test: more than two packed batches (256 each).
MESSAGES = 600


#: Messages in flight at once: the reference sbusd sends with a blocking send,
#: so a subscriber that is not read while hundreds wait stalls the whole bus.
CHUNK = 100


def blocking_round_trip(address: str, batch: bool) -> tuple[list[bytes], bool, bool]:
    """MESSAGES published (one by one, and many at once) and received; in order?"""
    with (
        Client(address, timeout=WAIT, batch=batch) as sub,
        Client(address, timeout=WAIT, batch=batch) as pub,
    ):
        sub.subscribe("t/")
        sub.whoami()
        pub.whoami()  # its handshake is over: publish_many may pack
        got: list[bytes] = []
        for start in range(0, MESSAGES, CHUNK):
            middle = start + CHUNK // 2
            for i in range(start, middle):
                pub.publish(f"t/{i}", b"%d" % i)
            pub.publish_many((f"t/{i}", b"%d" % i) for i in range(middle, start + CHUNK))
            got += [sub.receive().payload for _ in range(CHUNK)]
        return got, sub.stats.batched, sub.stats.batch_refused


async def async_round_trip(address: str, batch: bool) -> tuple[list[bytes], bool, bool]:
    async with (
        AsyncClient(address, timeout=WAIT, batch=batch) as sub,
        AsyncClient(address, timeout=WAIT, batch=batch) as pub,
    ):
        await sub.subscribe("t/")
        await sub.whoami()
        await pub.whoami()
        got: list[bytes] = []
        for start in range(0, MESSAGES, CHUNK):
            for i in range(start, start + CHUNK):
                await pub.publish(f"t/{i}", b"%d" % i)
            async for message in sub.messages():
                got.append(message.payload)
                if len(got) == start + CHUNK:
                    break
        return got, sub.stats.batched, sub.stats.batch_refused


EXPECTED = [b"%d" % i for i in range(MESSAGES)]


@pytest.mark.parametrize("batch", [False, True])
def test_blocking_client_delivers_in_order(sbusd: object, batch: bool) -> None:
    got, batched, refused = blocking_round_trip(sbusd.address, batch)  # type: ignore[attr-defined]
    assert got == EXPECTED
    assert (batched, refused) == (batch, False)


@pytest.mark.parametrize("batch", [False, True])
def test_async_client_delivers_in_order(sbusd: object, batch: bool) -> None:
    got, batched, refused = asyncio.run(async_round_trip(sbusd.address, batch))  # type: ignore[attr-defined]
    assert got == EXPECTED
    assert (batched, refused) == (batch, False)


def test_the_reference_daemon_is_detected_and_both_clients_fall_back(
    reference_bus: str,
) -> None:
    got, batched, refused = blocking_round_trip(reference_bus, True)
    assert got == EXPECTED and not batched and refused
    got, batched, refused = asyncio.run(async_round_trip(reference_bus, True))
    assert got == EXPECTED and not batched and refused


def test_request_and_reply_through_the_secret_inbox(sbusd: object) -> None:
    address = sbusd.address  # type: ignore[attr-defined]

    async def main() -> None:
        async with AsyncClient(address, timeout=WAIT) as responder:
            await responder.subscribe("svc/double")
            await responder.whoami()

            async def serve() -> None:
                async for request in responder.messages():
                    _, body = request.payload.split(b"\0", 1)
                    await responder.reply(request, b"%d" % (2 * int(body)))

            task = asyncio.create_task(serve())
            with Client(address, timeout=WAIT) as asker:
                inbox_before = None
                for n in (1, 21):
                    answer = await asyncio.to_thread(asker.request, "svc/double", b"%d" % n)
                    assert answer.payload == b"%d" % (2 * n)
                    me = asker.whoami()
                    assert answer.key.startswith(me.encode() + b"/inbox/")
                    inbox_before = inbox_before or answer.key
            async with AsyncClient(address, timeout=WAIT) as asker2:
                answer = await asker2.request("svc/double", b"4")
                assert answer.payload == b"8"
            task.cancel()

    asyncio.run(main())


def test_both_clients_raise_the_same_errors(sbusd: object, master: Master) -> None:
    address = sbusd.address  # type: ignore[attr-defined]
    with Client(address, timeout=WAIT) as client:
        with pytest.raises(UsageError):
            client.flood("blocking/soft/maybe")
        client.subscribe("!/x")  # reserved: the bus refuses it for good
        with pytest.raises(BusClosed) as blocking_error:
            client.receive()
    assert blocking_error.value.reason == "reserved_pattern"

    async def main() -> BusClosed:
        async with AsyncClient(address, timeout=WAIT) as aclient:
            with pytest.raises(UsageError):
                await aclient.flood("blocking/soft/maybe")
            await aclient.subscribe("!/x")
            with pytest.raises(BusClosed) as error:
                await aclient.receive()
            return error.value

    assert asyncio.run(main()).reason == "reserved_pattern"


def test_a_full_buffer_while_the_bus_is_away_is_an_error_in_both(master: Master) -> None:
    with Client(master.address, timeout=WAIT, buffer_messages=3) as client:
        client.whoami()
        master.kill()
        for i in range(3):
            client.publish("k", b"%d" % i)
        with pytest.raises(BufferFull):
            client.publish("k", "3")
        assert client.stats.buffered == 3
    assert client.stats.unsent == 3  # closed with them still waiting: counted as lost
    master.start()

    async def main() -> None:
        async with AsyncClient(master.address, timeout=WAIT, buffer_messages=3) as aclient:
            await aclient.whoami()
            master.kill()
            with pytest.raises((BusClosed, TimeoutError)):
                await aclient.whoami(0.5)  # notices the loss
            for i in range(3):
                await aclient.publish("k", b"%d" % i)
            with pytest.raises(BufferFull):
                await aclient.publish("k", "3")

    asyncio.run(main())


def test_no_reconnect_makes_a_lost_bus_final(master: Master) -> None:
    client = Client(master.address, timeout=WAIT, reconnect=False)
    client.subscribe("k")
    client.whoami()
    master.kill()
    with pytest.raises(BusClosed):
        client.receive()
    with pytest.raises(BusClosed):
        client.publish("k", "after")
    assert client.closed
    client.close()
    assert not os.path.exists(master.address) or True


def test_batched_delivery_through_a_relay(tree: Hierarchy) -> None:
    """A relay is a bus like any other: it packs for a client that asks."""
    top = tree.bus("m")
    relay = tree.bus("r", upstream=top)
    with (
        Client(relay.address, timeout=WAIT, batch=True) as sub,
        Client(top.address, timeout=WAIT, batch=True) as pub,
    ):
        sub.subscribe("v/")
        sub.whoami()
        pub.whoami()
        deadline = time.monotonic() + WAIT
        while True:  # the relay's pattern reaches the master a moment later
            pub.publish("v/probe", "")
            try:
                sub.receive(0.2)
                break
            except TimeoutError:
                assert time.monotonic() < deadline
        while sub.buffered:
            sub.receive()
        pub.publish_many((f"v/{i}", b"%d" % i) for i in range(300))
        got = []
        while len(got) < 300:
            message = sub.receive()
            if message.key != b"v/probe":
                got.append(message.payload)
        assert got == [b"%d" % i for i in range(300)]
        assert sub.stats.batched and pub.stats.batched


def test_both_clients_have_the_same_names_and_arguments() -> None:
    import inspect

    def public(cls: type) -> dict[str, inspect.Signature | None]:
        out: dict[str, inspect.Signature | None] = {}
        for name, value in vars(cls).items():
            if name.startswith("_") and name != "__init__":
                continue
            out[name] = inspect.signature(value) if callable(value) else None
        return out

    blocking, asynchronous = public(Client), public(AsyncClient)
    #: what only one of them has, and why: a blocking client's descriptor,
    #: raw packets for tests and gevent's switch; asyncio's explicit connect
    only_blocking = {"send_raw", "fileno", "iter_messages"}
    only_async = {"connect"}
    assert set(blocking) - only_blocking == set(asynchronous) - only_async
    for name, signature in blocking.items():
        if name in only_blocking or signature is None:
            continue
        theirs = asynchronous[name]
        assert theirs is not None
        ours_params = [p for p in signature.parameters if p != "cooperative"]
        assert ours_params == list(theirs.parameters), name


def test_async_no_reconnect_makes_a_lost_bus_final_after_what_arrived(master: Master) -> None:
    async def main() -> None:
        async with AsyncClient(master.address, timeout=WAIT, reconnect=False) as client:
            await client.subscribe("k")
            await client.whoami()
            await client.publish("k", "last")
            await client.flush()
            assert (await client.receive()).payload == b"last"
            master.kill()
            with pytest.raises(BusClosed):
                await client.receive()
            with pytest.raises(BusClosed):
                await client.publish("k", "after")
            assert client.closed and client.stats.reconnects == 0

    asyncio.run(main())
