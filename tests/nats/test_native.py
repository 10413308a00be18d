"""Native NATS clients as peers of the hosts' buses, on a real 3-node cluster:
a native subscriber gets what the buses publish that it matches (the keys the
``nats.publish`` setting names, and whatever another host wants), exactly
once and byte for byte; a native publisher reaches sbus subscribers on every
host once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from sbus_relay.client import Client
from sbus_relay.link.natspy_private import write_held
from tests.nats.cluster import Cluster, Host, drain, joined, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def hosts(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Host]]:
    tmp = tmp_path_factory.mktemp("native")
    config = tmp / "publish.yaml"
    config.write_text(
        yaml.safe_dump({"nats": {"servers": [cluster.urls(0)], "publish": ["sensors/"]}})
    )
    with joined(
        [
            lambda: Host(tmp, "hosta", cluster.urls(0), "-C", str(config)),
            lambda: Host(tmp, "hostb", cluster.urls(1)),
        ]
    ) as made:
        yield made


#: Seconds of quiet that end a drain in these tests.
QUIET = 0.7


class Native:
    """nats-py subscribers on one member, in a thread of their own loop."""

    def __init__(self, url: str, subjects: list[str]) -> None:
        self.url, self.subjects = url, subjects
        self.got: dict[str, list[Any]] = {s: [] for s in subjects}

    async def run(self, action: Any, settle: float = 1.5) -> None:
        import nats

        nc = await nats.connect(self.url)
        for subject in self.subjects:

            async def cb(msg: Any, subject: str = subject) -> None:
                self.got[subject].append((msg.subject, msg.data, msg.headers))

            await nc.subscribe(subject, cb=cb)
        await write_held(nc, 10)  # (nats-py's flush alone may overtake the subscriptions)
        await nc.flush()
        await asyncio.get_running_loop().run_in_executor(None, action)
        await asyncio.sleep(settle)
        await nc.close()


def test_a_native_subscriber_gets_the_published_keys_exactly_once(
    hosts: list[Host], cluster: Cluster
) -> None:
    a, b = hosts
    native = Native(cluster.servers[2].url, ["sbus.k.sensors.>", "sbus.k.>"])

    def publish() -> None:
        with Client(b.master.address, timeout=5) as at_b, Client(a.relay.address) as pub:
            at_b.subscribe(b"sensors/hall")  # another host wants part of them too
            wait_until(lambda: a.link()["remote_patterns"] >= 2, 10, "b's interest at a")
            for i in range(50):
                pub.publish(b"sensors/hall" if i % 2 else b"sensors/roof", b"%d" % i)
            pub.publish(b"private/x", b"nobody wants it")
            assert [p for _, p in drain(at_b, QUIET)] == [b"%d" % i for i in range(1, 50, 2)]

    asyncio.run(native.run(publish))
    for subject in native.subjects:
        got = native.got[subject]
        assert [d for _, d, _ in got] == [b"%d" % i for i in range(50)], subject
        assert {s for s, _, _ in got} == {"sbus.k.sensors.hall", "sbus.k.sensors.roof"}
        # the payload is exactly what was published; the envelope is a header
        assert all(h and h["Sbus-Origin"].startswith("hosta ") for _, _, h in got)


def test_without_the_setting_only_what_a_host_wants_leaves(
    hosts: list[Host], cluster: Cluster
) -> None:
    a, b = hosts
    native = Native(cluster.servers[2].url, ["sbus.k.>"])

    def publish() -> None:
        with Client(a.master.address, timeout=5) as at_a, Client(b.relay.address) as pub:
            at_a.subscribe(b"wanted/")
            wait_until(lambda: b.link()["remote_patterns"] >= 1, 10, "a's interest at b")
            time.sleep(0.3)
            for i in range(10):
                pub.publish(b"wanted/x" if i < 5 else b"sensors/b", b"%d" % i)
            assert len(drain(at_a, QUIET)) == 5

    asyncio.run(native.run(publish))
    assert [d for _, d, _ in native.got["sbus.k.>"]] == [b"%d" % i for i in range(5)]


def test_a_native_publisher_reaches_every_host_once(hosts: list[Host], cluster: Cluster) -> None:
    import nats

    a, b = hosts
    with (
        Client(a.relay.address, timeout=5) as at_a,
        Client(b.master.address, timeout=5) as at_b,
    ):
        at_a.subscribe(b"cmd/")
        at_a.subscribe(b"cmd/*/go")  # overlapping: still once
        at_b.subscribe(b"cmd/")
        wait_until(
            lambda: a.link()["subscriptions"] >= 2 and b.link()["subscriptions"] >= 1,
            10,
            "subscribed on NATS",
        )
        time.sleep(0.3)

        async def publish() -> None:
            nc = await nats.connect(cluster.servers[2].url)
            for i in range(20):
                await nc.publish("sbus.k.cmd.pump.go", b"%d" % i)
            await nc.flush()
            await nc.close()

        asyncio.run(publish())
        want = [(b"cmd/pump/go", b"%d" % i) for i in range(20)]
        assert drain(at_a, QUIET) == want
        assert drain(at_b, QUIET) == want
