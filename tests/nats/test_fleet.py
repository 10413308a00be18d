"""Three hosts (each a master joined to a 3-node NATS cluster, with a relay):
every copy counted at every client, only wanted traffic crossing, identities
staying home."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest

from sbus_relay.client import Client
from tests.nats.cluster import Cluster, Host, drain, three_hosts, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def hosts(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Host]]:
    with three_hosts(cluster, tmp_path_factory.mktemp("hosts")) as made:
        yield made


def settle(hosts: list[Host], patterns: dict[str, int]) -> None:
    """Wait until each host's link holds at least ``patterns[host]`` remote patterns."""
    wait_until(
        lambda: all(h.link()["remote_patterns"] >= patterns.get(h.name, 0) for h in hosts),
        20,
        f"interest announced: {patterns}",
    )


def crossed(pub: Client, sub: Client, key: bytes) -> None:
    """Publish ``key`` until ``sub`` gets it (what it subscribed to before is
    known at the publisher's host by then: interest deltas arrive in order),
    then drain what else came."""
    for _ in range(100):
        pub.publish(key, b"probe")
        try:
            if bytes(sub.receive(timeout=0.2).key) == key:
                drain(sub, 0.3)
                return
        except TimeoutError:
            continue
    raise AssertionError(f"{key!r} never crossed")


def test_healthz_says_the_link_is_up(hosts: list[Host]) -> None:
    text = hosts[0].healthz()
    assert text.startswith("ok\n") and "nats: up connected 127.0.0.1:" in text


def test_every_copy_exactly_once_and_no_loops(hosts: list[Host]) -> None:
    """A publish on host A's relay reaches every matching client of every host
    once, however their patterns overlap, and never comes back to A twice."""
    a, b, c = hosts
    # overlapping patterns on masters and relays of every host
    layout = {
        "b-master": (b.master.address, [b"fleet/", b"fleet/*/x", b""]),
        "b-relay": (b.relay.address, [b"fleet/one/x", b"fl*/one/"]),
        "c-master": (c.master.address, [b"fleet/one/*"]),
        "c-relay": (c.relay.address, [b"fleet/two/x"]),  # wants none of them
        "a-master": (a.master.address, [b"fleet/"]),
        "a-relay2": (a.relay.address, [b"fleet/*/x"]),
    }
    clients = {}
    try:
        for name, (address, patterns) in layout.items():
            cl = Client(address, timeout=5)
            for p in patterns:
                cl.subscribe(p)
            clients[name] = cl
        # b: fleet/, fleet/*/x, '', fleet/one/x, fl*/one/ ; c: fleet/one/*, fleet/two/x
        settle(hosts, {"hosta": 7})
        time.sleep(0.3)
        n = 200
        with Client(a.relay.address, timeout=5) as pub:
            for i in range(n):
                pub.publish(b"fleet/one/x", b"%d" % i)
            pub.publish(b"other/key", b"unwanted-by-a-and-c")
        for name, cl in clients.items():
            got = drain(cl)
            counts = Counter(p for k, p in got if k == b"fleet/one/x")
            if name == "c-relay":
                assert not counts, name
                continue
            assert len(counts) == n, (name, len(counts))
            assert set(counts.values()) == {1}, (name, counts.most_common(3))
            assert [p for k, p in got if k == b"fleet/one/x"] == [b"%d" % i for i in range(n)]
    finally:
        for cl in clients.values():
            cl.close()


def test_nothing_leaves_a_host_nobody_else_wants(hosts: list[Host], cluster: Cluster) -> None:
    """With nobody elsewhere subscribed, a host's publishes stay home: the NATS
    servers' own counters do not move beyond the hosts' heartbeats."""
    a = hosts[0]
    with Client(a.master.address, timeout=5) as local:
        local.subscribe(b"private/")
        time.sleep(0.5)
        sent_before = a.count("sent")
        in_before, _ = cluster.msgs()
        with Client(a.relay.address, timeout=5) as pub:
            for i in range(2000):
                pub.publish(b"private/%d" % i, b"x" * 100)
        got = drain(local)
        assert len(got) == 2000
        in_after, _ = cluster.msgs()
    assert a.count("sent") == sent_before
    # heartbeats: 3 hosts, one per 2 s each, plus their round-trip pings
    assert in_after - in_before < 50, (in_before, in_after)


def test_one_subscriber_gets_exactly_the_matching_messages(
    hosts: list[Host], cluster: Cluster
) -> None:
    a, b, _ = hosts
    with Client(b.relay.address, timeout=5) as sub, Client(a.master.address, timeout=5) as pub:
        sub.subscribe(b"only/this")
        sub.subscribe(b"probe/only")
        crossed(pub, sub, b"probe/only")
        sent_before = a.count("sent")
        for i in range(300):
            pub.publish(b"only/this" if i % 3 == 0 else b"only/that", b"%d" % i)
        got = drain(sub)
        assert [p for _, p in got] == [b"%d" % i for i in range(0, 300, 3)]
        assert a.count("sent") - sent_before == 100


def test_identities_stay_on_their_host(hosts: list[Host]) -> None:
    """A secret key crosses neither through '' nor through a relay."""
    a, b, c = hosts
    with (
        Client(b.master.address, timeout=5) as everything_b,
        Client(c.relay.address, timeout=5) as everything_c,
        Client(a.relay.address, timeout=5) as owner,
    ):
        everything_b.subscribe(b"")
        everything_c.subscribe(b"")
        me = owner.whoami()
        owner.subscribe(me.encode() + b"/")
        with Client(a.relay.address, timeout=5) as pub:
            crossed(pub, everything_b, b"probe/b")
            crossed(pub, everything_c, b"probe/c")
            for i in range(50):
                pub.publish(me.encode() + b"/secret", b"%d" % i)
            pub.publish(b"public/marker", b"m")
        assert len(drain(owner)) == 50
        for cl in (everything_b, everything_c):
            got = drain(cl)
            assert (b"public/marker", b"m") in got
            assert not [k for k, _ in got if k.startswith(b"!/")]
    for h in hosts:
        assert h.link()["subscriptions"] < 20


def test_native_nats_clients_and_what_the_link_refuses(hosts: list[Host], cluster: Cluster) -> None:
    """A native NATS client publishes on a key's subject and the bus delivers
    it; a payload too large for an sbus packet and a subject no key maps to
    are dropped and counted, and the link carries on."""
    import asyncio

    import nats

    b = hosts[1]

    async def publish() -> None:
        nc = await nats.connect(cluster.servers[0].url)
        await nc.publish("sbus.k.native.big", b"x" * 500_000)
        await nc.publish("sbus.k.native.bad%zz", b"never")
        await nc.publish("sbus.k.native.ok", b"from a native client")
        await nc.flush()
        await nc.close()

    with Client(b.master.address, timeout=5) as sub:
        sub.subscribe(b"native/")
        wait_until(lambda: b.link()["subscriptions"] >= 1, 10, "b subscribed on NATS")
        time.sleep(0.3)
        before = b.link()["drops"]
        asyncio.run(publish())
        got = drain(sub)
    assert got == [(b"native/ok", b"from a native client")]
    after = b.link()["drops"]
    assert after["too_large"] == before["too_large"] + 1
    assert after["bad_subject"] == before["bad_subject"] + 1
    assert b.link()["connected"]


def test_a_key_too_long_for_a_subject_crosses(hosts: list[Host]) -> None:
    """The longest keys: a key whose subject would pass NATS's control line
    goes with the key in the payload, once, to the host that wants it."""
    a, b, c = hosts
    long_key = b"long/" + b"." * 3000  # 9,000 bytes as a subject
    with (
        Client(b.relay.address, timeout=5) as sub,
        Client(c.master.address, timeout=5) as other,
        Client(a.master.address, timeout=5) as pub,
    ):
        sub.subscribe(b"long/")
        other.subscribe(b"short/")
        crossed(pub, sub, b"long/probe")
        for i in range(20):
            pub.publish(long_key, b"%d" % i)
        got = drain(sub)
        assert got == [(long_key, b"%d" % i) for i in range(20)]
        assert drain(other) == []  # c's bus keeps what its clients want: nothing of it
