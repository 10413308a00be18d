"""A container's relay crashing, or the whole container going away, harms no one else.

To the master a container is one connection, its relay's: losing it is an
ordinary close, the other containers keep their traffic, and nothing is left
behind that stops the container from starting again (docs/deploy.md,
"Containers as Linux namespaces").
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.namespaces.conftest import Lab
from tests.namespaces.helpers import (
    MASTER_SOCKET_NAME,
    Container,
    host_messages,
    host_mounts,
    log_events,
    relay_rows,
)
from tests.relay.helpers import Bus, wait_until

pytestmark = pytest.mark.timeout(60)

STORED = "sbus_patterns_stored"
INTEREST = "sbus_upstream_interest_patterns"
CONNECTED = "sbus_clients_connected"
BOX_A_CONNECTIONS = 'sbus_relay_connections{relay="box-a"}'
BOX_A_DISCONNECTS = 'sbus_relay_disconnects_total{relay="box-a"}'


def closed_by_master(master: Bus, pid: int) -> dict[str, Any]:
    """The master's log line for the end of the connection of process ``pid``."""

    def find() -> dict[str, Any] | None:
        for event in log_events(master.log(), "client.disconnected"):
            if event.get("pid") == pid:
                return event
        return None

    event: dict[str, Any] = wait_until(find, f"the master to log the close of pid {pid}")
    return event


def assert_only_ordinary_disconnects(master: Bus) -> None:
    """The master closed no one for a reason of its own: every disconnect was a close."""
    reasons = {
        name: value
        for name, value in master.metrics().items()
        if name.startswith("sbus_disconnects_total{") and value
    }
    assert set(reasons) <= {'sbus_disconnects_total{reason="closed"}'}, reasons
    warnings = [e for e in log_events(master.log()) if e.get("level") != "info"]
    assert warnings == [], warnings


def test_a_relay_restart_leaves_the_master_and_the_other_container_unharmed(
    lab: Lab, hosted: tuple[Bus, Container, Container]
) -> None:
    master, a, b = hosted
    host_sub = lab.peer(master.address)
    host_sub.sub(b"demo/")
    b_sub = b.agent()
    b_sub.sub("demo/")
    a_client = a.agent()
    a_client.sub("demo/")
    master.wait_metric(STORED, 3)
    a.wait_relay_metric(INTEREST, 1)
    a_client.pub("demo/before", "a")
    assert host_messages(host_sub, 1) == [("demo/before", "a")]
    assert b_sub.messages(1) == [("demo/before", "a")]
    assert a_client.messages(1) == [("demo/before", "a")]  # its own, echoed
    host_pub = lab.peer(master.address)
    connected = master.metric(CONNECTED)
    assert master.metric(BOX_A_CONNECTIONS) == 1

    assert a.relay is not None
    old = a.relay
    old.kill()  # SIGKILL: a crash; its socket file stays on the container's /run
    event = closed_by_master(master, old.pid)
    assert (event["reason"], event["level"]) == ("closed", "info")
    master.wait_metric(CONNECTED, connected - 1)
    master.wait_metric(STORED, 2)  # relay a's demo/ is forgotten with its connection
    master.wait_metric(BOX_A_CONNECTIONS, 0)
    assert master.metric(BOX_A_DISCONNECTS) == 0  # a close, not a disconnect for a reason
    assert "closed" in a_client.recv()  # its bus went away, and it is told so

    # box-b and the host carry on, both ways
    b.agent().pub("demo/during", "b")
    host_pub.pub(b"demo/during", b"host")
    during = [("demo/during", "b"), ("demo/during", "host")]
    assert host_messages(host_sub, 2) == during
    assert sorted(b_sub.messages(2)) == during

    # the same relay, same config, same container: the stale socket is no obstacle
    new = a.start_relay()
    assert new.pid != old.pid
    a_again = a.agent()
    assert a_again.whoami() == f"!/cred/0/0/{new.pid}/!/cred/0/0/{a_again.pid}"
    a.wait_relay_metric(INTEREST, 1)
    a_again.pub("demo/after", "a again")
    assert host_messages(host_sub, 1) == [("demo/after", "a again")]
    assert b_sub.messages(1) == [("demo/after", "a again")]
    assert master.metric(CONNECTED) == connected
    assert master.metric(BOX_A_CONNECTIONS) == 1
    assert relay_rows(master.port)["box-a"]["pid"] == new.pid
    assert_only_ordinary_disconnects(master)


def test_tearing_a_container_down_leaves_the_rest_unharmed_and_it_starts_again(
    lab: Lab, hosted: tuple[Bus, Container, Container]
) -> None:
    master, a, b = hosted
    host_sub = lab.peer(master.address)
    host_sub.sub(b"demo/")
    a_sub, b_sub = a.agent(), b.agent()
    a_sub.sub("demo/")
    b_sub.sub("demo/")
    master.wait_metric(STORED, 3)
    host_pub = lab.peer(master.address)
    connected = master.metric(CONNECTED)
    assert a.relay is not None
    inside = [a.init_pid, a.relay.pid, a_sub.host_pid]

    a.destroy()  # SIGKILL of the container's pid 1: the kernel kills all inside
    assert not a.alive()
    assert [pid for pid in inside if os.path.exists(f"/proc/{pid}")] == []
    event = closed_by_master(master, inside[1])
    assert (event["reason"], event["level"]) == ("closed", "info")
    master.wait_metric(CONNECTED, connected - 1)
    master.wait_metric(STORED, 2)
    master.wait_metric(BOX_A_CONNECTIONS, 0)
    assert set(relay_rows(master.port)) == {"box-b"}
    # nothing left behind: no mount on the host, only the master's socket in its directory
    assert a.tmpfs_source not in host_mounts()
    assert os.listdir(os.path.dirname(master.address)) == [MASTER_SOCKET_NAME]

    # box-b and the host carry on, both ways
    b.wait_relay_metric(INTEREST, 1)
    b.agent().pub("demo/during", "b")
    host_pub.pub(b"demo/during", b"host")
    during = [("demo/during", "b"), ("demo/during", "host")]
    assert host_messages(host_sub, 2) == during
    assert sorted(b_sub.messages(2)) == during

    # a new container of the same name on the same master directory
    again = lab.container("box-a", master)
    again_client = again.agent()
    again.wait_relay_metric(INTEREST, 1)
    again_client.pub("demo/again", "new box-a")
    assert host_messages(host_sub, 1) == [("demo/again", "new box-a")]
    assert b_sub.messages(1) == [("demo/again", "new box-a")]
    assert master.metric(CONNECTED) == connected
    assert again.relay is not None
    assert relay_rows(master.port)["box-a"]["pid"] == again.relay.pid
    assert master.metric(BOX_A_DISCONNECTS) == 0
    assert_only_ordinary_disconnects(master)
