"""Messages between containers (Linux namespaces) and the host, through real relays.

Each container is a pid + mount + UTS + network namespace whose relay runs the
shipped configs/relay.yaml unchanged, with the host master's socket directory
bind-mounted at /run/sbus-master (docs/deploy.md, "Containers as Linux
namespaces").
"""

from __future__ import annotations

import pytest

from tests.namespaces.conftest import Lab
from tests.namespaces.helpers import RELAY_METRICS_PORT, SBUS_RELAY, Container
from tests.relay.helpers import Bus

pytestmark = pytest.mark.timeout(60)

STORED = "sbus_patterns_stored"
INTEREST = "sbus_upstream_interest_patterns"


def test_messages_cross_between_containers_and_host(
    lab: Lab, hosted: tuple[Bus, Container, Container]
) -> None:
    master, a, b = hosted
    host_sub = lab.peer(master.address)
    host_sub.sub(b"demo/")
    a_sub, b_sub = a.agent(), b.agent()
    a_sub.sub("demo/")
    b_sub.sub("demo/")
    # the master holds the host's pattern and one per relay; each relay has been
    # told that someone outside wants demo/, so it sends its publishes up
    master.wait_metric(STORED, 3)
    a.wait_relay_metric(INTEREST, 1)
    b.wait_relay_metric(INTEREST, 1)

    a.agent().pub("demo/from-a", "container a")
    b.agent().pub("demo/from-b", "container b")
    lab.peer(master.address).pub(b"demo/from-host", b"the host")
    # an unchanged program in a container: the CLI on the default /run/sbus.socket
    done = a.run(SBUS_RELAY, "pub", "demo/from-cli", "sbus-relay pub in a")
    assert done.returncode == 0, done.stderr

    sent = {
        ("demo/from-a", "container a"),
        ("demo/from-b", "container b"),
        ("demo/from-host", "the host"),
        ("demo/from-cli", "sbus-relay pub in a"),
    }
    # everyone gets every message once: up, down and sideways
    for name, got in (("a", a_sub.messages(4)), ("b", b_sub.messages(4))):
        assert sorted(got) == sorted(sent), name
    host_got = [tuple(p.decode().removeprefix("MSG ").split("\0", 1)) for p in host_sub.messages(4)]
    assert sorted(host_got) == sorted(sent)


def test_each_container_serves_metrics_in_its_own_network(
    hosted: tuple[Bus, Container, Container],
) -> None:
    master, a, b = hosted
    # configs/relay.yaml binds 0.0.0.0:9801 in both containers: each has its own network
    for box in (a, b):
        text = box.http_get(f"http://127.0.0.1:{RELAY_METRICS_PORT}/metrics")
        # the relay names itself after the container's hostname (its UTS namespace)
        info = [line for line in text.splitlines() if line.startswith("sbus_build_info{")]
        assert len(info) == 1, info
        assert 'role="relay"' in info[0]
        assert f'name="{box.name}"' in info[0]
        assert box.relay_metrics()["sbus_upstream_connected"] == 1
    # the master sees both relays as clients
    assert master.metric("sbus_clients_connected") == 2
