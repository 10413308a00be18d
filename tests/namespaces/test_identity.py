"""Identities across pid namespaces, and secret keys that reach only their owner.

The master runs in the host's pid namespace, so it sees each container's relay
by its host pid; the relay runs in the container's pid namespace, so it sees
its clients by their pids there (docs/deploy.md, "Containers as Linux
namespaces").  Clients drop to uid 1000, gid 1001, so that a swapped field shows.
"""

from __future__ import annotations

import pytest

from tests.namespaces.conftest import Lab
from tests.namespaces.helpers import MASTER_DIR_IN_NS, MASTER_SOCKET_NAME, Container, ns_pids
from tests.relay.helpers import Bus

pytestmark = pytest.mark.timeout(60)

USER = (1000, 1001)  # uid, gid
STORED = "sbus_patterns_stored"
INTEREST = "sbus_upstream_interest_patterns"
MASTER_IN_NS = f"{MASTER_DIR_IN_NS}/{MASTER_SOCKET_NAME}"


def test_whoami_nests_the_relays_host_pid_and_the_clients_namespace_pid(
    hosted: tuple[Bus, Container, Container],
) -> None:
    _, a, b = hosted
    for box in (a, b):
        assert box.relay is not None
        relay_pid = box.relay.pid
        # the relay itself is in the container's pid namespace, one level down
        relay_pids = ns_pids(relay_pid)
        assert relay_pids[0] == relay_pid and len(relay_pids) == 2
        assert box.relay.wait_event("listening")["pid"] == relay_pids[1]
        assert box.relay.wait_event("upstream.ready")["identity"] == f"!/cred/0/0/{relay_pid}"

        client = box.agent(user=USER)
        # what the client calls os.getpid() is its pid in the container, not the host's
        assert ns_pids(client.host_pid) == [client.host_pid, client.pid]
        assert client.pid < client.host_pid
        assert client.whoami() == f"!/cred/0/0/{relay_pid}/!/cred/1001/1000/{client.pid}"

        # the same program on the mounted master socket: the master sees host pids
        direct = box.agent(user=USER, address=MASTER_IN_NS)
        assert direct.whoami() == f"!/cred/1001/1000/{direct.host_pid}"


def test_a_secret_key_reaches_only_its_owner(
    lab: Lab, hosted: tuple[Bus, Container, Container]
) -> None:
    master, a, b = hosted
    owner = a.agent(user=USER)
    me = owner.whoami()
    owner.sub(f"{me}/inbox/")
    # wildcards at every level: beside the owner on its relay, and on the master
    a_wild = a.agent(user=USER)
    a_wild.sub("")
    host_wild = lab.peer(master.address)
    host_wild.sub(b"")
    master.wait_metric(STORED, 3)  # relay a: the secret and ""; the host's ""
    b_pub = b.agent(user=USER)
    b.wait_relay_metric(INTEREST, 2)  # box-b forwards what the secret and "" want

    host_pub = lab.peer(master.address)
    host_pub.pub(f"{me}/inbox/from-host".encode(), b"s1")
    b_pub.pub(f"{me}/inbox/from-b", "s2")
    host_pub.pub(b"demo/after", b"plain")

    assert sorted(owner.messages(2)) == [
        (f"{me}/inbox/from-b", "s2"),
        (f"{me}/inbox/from-host", "s1"),
    ]
    # "" sees the plain message that was sent after the secrets, and no secret
    assert a_wild.messages(1) == [("demo/after", "plain")]
    assert host_wild.messages(1) == [b"MSG demo/after\0plain"]


def test_no_one_else_may_subscribe_to_a_secret_key(
    hosted: tuple[Bus, Container, Container],
) -> None:
    _, a, b = hosted
    owner = a.agent(user=USER)
    me = owner.whoami()
    owner.sub(f"{me}/inbox/")
    # Give a client of box-b the owner's pid in its own namespace: the same
    # uid, gid and pid, told apart only by the relay above it.
    done = b.run("sh", "-c", f"echo {owner.pid - 1} > /proc/sys/kernel/ns_last_pid")
    assert done.returncode == 0, done.stderr
    twin = b.agent(user=USER)
    assert twin.pid == owner.pid
    assert twin.whoami() != me
    assert twin.call("sub", pattern=f"{me}/inbox/")["closed"].startswith("secret_refused")
    # nor on the master directly (through the mounted socket), nor beside the owner
    for thief in (b.agent(user=USER, address=MASTER_IN_NS), a.agent(user=USER)):
        assert thief.call("sub", pattern=f"{me}/inbox/")["closed"].startswith("secret_refused")
    # the owner is unaffected
    assert owner.whoami() == me
