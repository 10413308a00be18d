"""A relay of a container's relay, in the same container: pids repeat across
namespaces, so an identity chain may hold one number twice without a cycle,
and a real cycle may hold no repeated number at all."""

from __future__ import annotations

import os

import pytest

from tests.namespaces.conftest import Lab
from tests.namespaces.helpers import Container, NsServer, host_messages, parse_metrics
from tests.relay.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

NESTED = "/run/nested.sock"
#: the nested relay's metrics, in the container's own network beside the relay's 9801
NESTED_METRICS = 9802


def nested_relay(lab: Lab, box: Container, pid: int | None = None) -> NsServer:
    """A relay of ``box``'s relay inside ``box``, at pid ``pid`` of its namespace."""
    if pid is not None:
        done = box.run("sh", "-c", f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid")
        assert done.returncode == 0, done.stderr
    args = ["-f", "-a", NESTED, "--upstream", "/run/sbus.socket", "--log-format", "json"]
    args += ["--instance", "nested", "--metrics", f"127.0.0.1:{NESTED_METRICS}"]
    server = NsServer(box, *args, ready=("listening", "metrics.listening"))
    lab.servers.append(server)
    return server


def test_a_nested_relay_may_have_the_pid_its_parent_has_on_the_host(lab: Lab) -> None:
    master = lab.master()
    a = lab.container("box-a", master)
    assert a.relay is not None
    parent = a.relay.pid  # the container's relay, as the master sees it
    nested = nested_relay(lab, a, pid=parent)
    assert nested.wait_event("listening")["pid"] == parent  # the same number, in box-a
    # "!/cred/0/0/<parent>/!/cred/0/0/<parent>" is two processes, not a cycle
    ready = nested.wait_event("upstream.ready")
    assert ready["identity"] == f"!/cred/0/0/{parent}/!/cred/0/0/{parent}"
    assert nested.events("upstream.refused") == []

    host_sub = lab.peer(master.address)
    host_sub.sub(b"deep/")
    client = a.agent(address=NESTED)
    assert client.whoami() == f"{ready['identity']}/!/cred/0/0/{client.pid}"

    # messages cross both relays once the host's interest has come down to the nested one
    def interest() -> bool:
        text = a.http_get(f"http://127.0.0.1:{NESTED_METRICS}/metrics")
        return parse_metrics(text).get("sbus_upstream_interest_patterns") == 1

    wait_until(interest, "deep/ in the nested relay's interest")
    client.pub("deep/x", "two levels down")
    assert host_messages(host_sub, 1) == [("deep/x", "two levels down")]


def test_a_cycle_through_a_container_is_refused(lab: Lab) -> None:
    master = lab.master()
    a = lab.container("box-a", master)
    assert a.relay is not None
    relay = a.relay
    identity = relay.wait_event("upstream.ready")["identity"]
    nested = nested_relay(lab, a)
    nested.wait_event("upstream.ready")
    # The master dies and its socket path, in the directory box-a mounts, now
    # leads to the nested relay: box-a's relay reconnects to its own child.
    # Its pid in the chain is its host pid, never the one it knows itself by.
    master.kill()
    socket_path = master.address
    os.unlink(socket_path)
    os.symlink(NESTED, socket_path)
    refused = relay.wait_event("upstream.refused", timeout=15)
    assert refused["reason"] == "relay cycle detected"
    assert refused["identity"].startswith(identity + "/")
    # it never took a chain with itself in it as its identity
    assert [e["identity"] for e in relay.events("upstream.ready")] == [identity]
    assert not relay.log().count('"relay.identity_changed"')
