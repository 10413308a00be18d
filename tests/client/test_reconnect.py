"""Reconnecting: a master killed (-9) and started again, a live upgrade, a relay
restarted (our identity changes), and a relay whose upstream's identity changes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sbus_relay.client import AsyncClient, Client, Outage
from tests.client.conftest import WAIT, Master
from tests.relay.conftest import Hierarchy
from tests.relay.helpers import wait_until
from tests.support import run_cli

pytestmark = pytest.mark.timeout(90)


def delivered(client: Client, publisher: Client, key: str, payload: bytes) -> bytes:
    """Publish until ``client`` receives it: a relay's patterns reach its upstream
    a moment after the relay itself has them."""
    deadline = time.monotonic() + WAIT
    while True:
        publisher.publish(key, payload)
        try:
            return client.receive(0.2).payload
        except TimeoutError:
            assert time.monotonic() < deadline, f"nothing reached {key}"


def test_blocking_client_comes_back_after_kill_9_with_its_state(master: Master) -> None:
    downs: list[str] = []
    ups: list[Outage] = []
    with (
        Client(master.address, timeout=WAIT, batch=True) as sub,
        Client(master.address, timeout=WAIT, on_disconnected=downs.append) as pub,
    ):
        sub.on_reconnected = ups.append
        sub.subscribe("k/")
        sub.subscribe("k/")  # held twice: one UNSUB later must leave one
        sub.unsubscribe("k/")
        sub.echo(False)
        sub.flood("blocking/hard/block")
        sub.whoami()
        pub.publish("k/0", "before")
        assert sub.receive().payload == b"before"

        master.kill()
        for i in range(1, 6):  # the first send meets the dead socket; all are kept
            pub.publish(f"k/{i}", b"%d" % i)
        assert pub.stats.buffered >= 4
        master.start()

        sub.whoami()  # drives its reconnect: subscribed again once answered
        assert len(ups) == 1 and ups[0].reason == "closed" and 0 < ups[0].seconds < WAIT
        pub.flush(WAIT)  # reconnects, sends the buffer in order (without its grace)
        assert downs == ["closed"]
        got = [sub.receive().payload for _ in range(5)]
        assert got == [b"1", b"2", b"3", b"4", b"5"]
        assert pub.stats.reconnects == 1 and pub.stats.buffered == 0
        assert pub.stats.buffered_total == 5 and pub.stats.unsent == 0
        assert sub.stats.batched  # asked again on the new connection
        sub.publish("k/echo", "mine")  # echo off was set again: not received
        pub.publish("k/x", "theirs")
        assert sub.receive().payload == b"theirs"


def test_async_client_comes_back_after_kill_9_with_its_state(master: Master) -> None:
    async def main() -> None:
        ups: list[Outage] = []
        downs: list[str] = []
        async with (
            AsyncClient(master.address, timeout=WAIT, batch=True, on_reconnected=ups.append) as sub,
            AsyncClient(master.address, timeout=WAIT, on_disconnected=downs.append) as pub,
        ):
            await sub.subscribe("k/")
            await sub.whoami()
            await pub.publish("k/0", "before")
            assert (await sub.receive()).payload == b"before"
            master.kill()
            # both notice at once (their readers see the end) and start reconnecting
            await asyncio.to_thread(wait_until, lambda: downs and not sub.connected, "loss")
            for i in range(1, 6):
                await pub.publish(f"k/{i}", b"%d" % i)
            assert pub.stats.buffered == 5
            await asyncio.to_thread(master.start)
            await sub.whoami()
            await pub.whoami()
            got = [(await sub.receive()).payload for _ in range(5)]
            assert got == [b"1", b"2", b"3", b"4", b"5"]
            assert len(ups) == 1 and sub.stats.batched and pub.stats.reconnects == 1

    asyncio.run(main())


def test_a_live_upgrade_is_not_even_a_gap(tmp_path: Path, master: Master) -> None:
    with (
        Client(master.address, timeout=WAIT, batch=True) as sub,
        Client(master.address, timeout=WAIT) as pub,
    ):
        sub.subscribe("u/")
        sub.whoami()
        done = run_cli("upgrade", "-a", master.address, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        pub.publish_many([("u/1", "a"), ("u/2", "b")])
        assert [sub.receive().payload for _ in range(2)] == [b"a", b"b"]
        assert sub.stats.reconnects == 0 and pub.stats.reconnects == 0
        assert sub.stats.batched  # the new process packs for it as the old one did
    # the new process is not the one Master started: stop it by its address
    import os
    import signal

    from sbus_relay.ops.addresses import parse_address
    from sbus_relay.ops.supervisor import listener_pid

    pid = listener_pid(parse_address(master.address))
    if pid:
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not listener_pid(parse_address(master.address)), "the upgraded bus")


def test_a_restarted_relay_gives_a_new_identity_and_secret_patterns_follow(
    tree: Hierarchy,
) -> None:
    top = tree.bus("m")
    relay = tree.bus("r", upstream=top)
    with Client(relay.address, timeout=WAIT) as client, Client(top.address, timeout=WAIT) as far:
        before = client.whoami()
        inbox = before + "/inbox/"
        client.subscribe(inbox)
        client.whoami()
        assert delivered(client, far, inbox + "1", b"first") == b"first"

        relay.kill()
        relay2 = tree.bus("r", "-r", upstream=top)
        after = client.whoami()  # reconnects; the relay's pid, so our prefix, changed
        assert after != before and after.endswith(before.rsplit("!/cred/", 1)[1])
        assert client.stats.outages[-1].renamed == 1
        assert delivered(client, far, after + "/inbox/2", b"second") == b"second"
        assert relay2.address == relay.address


def test_a_relay_whose_upstream_identity_changes(tree: Hierarchy) -> None:
    """master <- A <- B <- client: A restarts, so B's identity changes; B renames our
    secret pattern itself, and the client follows at its next whoami."""
    top = tree.bus("m")
    a = tree.bus("a", upstream=top)
    b = tree.bus("b", upstream=a)
    with Client(b.address, timeout=WAIT) as client, Client(top.address, timeout=WAIT) as far:
        before = client.whoami()
        client.subscribe(before + "/inbox/")
        client.whoami()
        a.kill()
        tree.bus("a", "-r", upstream=top)

        def renamed() -> bool:
            return client.whoami() != before

        wait_until(renamed, "a new identity through B")
        after = client.whoami()
        assert client.session.patterns == [(after + "/inbox/").encode()]
        assert delivered(client, far, after + "/inbox/x", b"through") == b"through"
        assert client.stats.reconnects == 0  # B kept us connected


def test_a_cooperative_client_reconnects_without_blocking_other_greenlets(
    master: Master,
) -> None:
    import gevent

    ticks: list[float] = []

    def ticker() -> None:  # runs only if the client's waits yield
        for _ in range(200):
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    with Client(master.address, timeout=WAIT, cooperative=True) as client:
        client.subscribe("g/")
        client.whoami()
        master.kill()
        background = gevent.spawn(ticker)
        with pytest.raises(TimeoutError):
            client.receive(0.5)  # the bus is away: it retries, yielding meanwhile
        assert len(ticks) >= 10
        master.start()
        client.whoami()  # back, subscribed again
        assert client.stats.reconnects == 1
        with Client(master.address, timeout=WAIT) as pub:
            pub.publish("g/1", "after")
        assert client.receive().payload == b"after"
        background.kill()
