"""Peers outside the server's pid namespace: the kernel reports their pid as 0.

The master runs inside a pid namespace and its clients connect from the host,
so ``SO_PEERCRED`` gives every one of them pid 0: one identity for all the
peers of a user.  Such a peer holds no secret pattern (docs/protocol.md,
"Credentials and secret keys"), so no two of them can read each other's
secrets; everything else works for it.
"""

from __future__ import annotations

import os
import urllib.request
from typing import Any

import pytest

from tests.namespaces.conftest import Lab
from tests.namespaces.helpers import Agent, NsServer, log_events, ns_pids, parse_metrics, relay_rows
from tests.relay.helpers import Peer, wait_until

pytestmark = pytest.mark.timeout(60)

STORED = "sbus_patterns_stored"
FORWARDED_UP = 'sbus_upstream_forwarded_messages_total{direction="up"}'
PID0 = b"!/cred/0/0/0"
DISCONNECT = b"CMSG disconnect\0"


def refusal(peer: Peer, pattern: bytes) -> bytes:
    """Subscribe to ``pattern``; the server's disconnect notice, once it has closed us."""
    peer.send(b"SUB " + pattern)
    notice = peer.recv()
    assert peer.is_closed(), "the server kept a refused client"
    return notice


def disconnects(server: NsServer, reason: str) -> list[dict[str, Any]]:
    return [e for e in server.events("client.disconnected") if e.get("reason") == reason]


def test_pid0_clients_hold_no_secret_and_keep_plain_traffic(lab: Lab) -> None:
    ns = lab.namespace("master-ns")
    master, address, port = lab.master_in(ns)
    p1, p2 = lab.peer(address), lab.peer(address)
    assert p1.whoami() == p2.whoami() == PID0

    # plain traffic works for pid-0 peers
    p2.sub(b"demo/")
    sent = p1.pub(b"demo/x", b"plain")
    assert p2.messages(1) == [sent]

    # a client inside the master's pid namespace has a pid there: its secrets work
    inner = Agent(lab.tmp_path, address, ns=ns)
    lab.agents.append(inner)
    assert ns_pids(inner.host_pid)[-1] == inner.pid
    me = inner.whoami()
    assert me == f"!/cred/0/0/{inner.pid}"
    inner.sub(f"{me}/inbox/")
    # ... and a pid-0 peer may still write to it
    p2.pub(f"{me}/inbox/from-outside".encode(), b"s")
    assert inner.messages(1) == [(f"{me}/inbox/from-outside", "s")]

    # the shared identity: spelt out, or with the fields left to the server
    for peer, pattern in ((p1, PID0 + b"/inbox/"), (p2, b"!/cred///inbox/")):
        notice = refusal(peer, pattern)
        assert notice.startswith(DISCONNECT + b"secret_refused: pid 0"), notice
    refused = disconnects(master, "secret_refused")
    assert len(refused) == 2, master.log()
    for event in refused:
        assert (event["pid"], event["uid"], event["level"]) == (0, 0, "warning")
        assert "pid 0" in event["detail"]
    assert _scrape(port)['sbus_disconnects_total{reason="secret_refused"}'] == 2

    # nothing else was hurt: a fresh pid-0 peer still publishes to the inner client
    lab.peer(address).pub(b"%s/inbox/again" % me.encode(), b"t")
    assert inner.messages(1) == [(f"{me}/inbox/again", "t")]
    assert inner.whoami() == me


def test_relays_outside_the_masters_pid_namespace_keep_their_link(lab: Lab) -> None:
    ns = lab.namespace("master-ns")
    master, address, port = lab.master_in(ns)

    def master_metric(name: str) -> float:
        return _scrape(port).get(name, 0.0)

    # two relays on the host: to the master both are pid 0, the same identity
    names = ("host-relay-1", "host-relay-2")
    relays = [lab.relay_on_host(address, "--instance", name) for name in names]
    for relay in relays:
        relay.wait_log("upstream.interest_ready")
        ready = log_events(relay.log(), "upstream.ready")
        assert ready[-1]["identity"] == PID0.decode()
    # their names still tell them apart in the master's accounting
    rows = wait_until(lambda: len(relay_rows(port)) == 2 and relay_rows(port), "two named relays")
    assert sorted(rows) == sorted(names)
    assert {(row["pid"], row["identity"]) for row in rows.values()} == {(0, PID0.decode())}
    one, two = (lab.peer(relay.address) for relay in relays)
    # a relay sees its host clients' real pids, so the chains collide too: this
    # test process is the client of both
    me = one.whoami()
    assert me == two.whoami() == PID0 + b"/!/cred/0/0/%d" % os.getpid()

    # each relay accepts the secret from its own client; the master refuses it
    # and keeps the relay, which still carries plain patterns
    for peer in (one, two):
        peer.sub(me + b"/inbox/")
        peer.sub(b"demo/")
    wait_until(
        lambda: len(_pattern_refusals(master)) == 2, "the master to refuse both secret patterns"
    )
    for event in _pattern_refusals(master):
        assert event["pid"] == 0 and "pid 0" in event["detail"]
    wait_until(lambda: master_metric(STORED) == 2, "demo/ of each relay on the master")
    assert master_metric('sbus_disconnects_total{reason="secret_refused"}') == 0
    for relay in relays:
        assert relay.metric("sbus_upstream_connected") == 1
        assert "upstream.lost" not in relay.log()
        assert "upstream.disconnected_us" not in relay.log()

    # relay two's client cannot read what relay one's client is sent, from
    # either side; plain messages flow both ways
    outside = lab.peer(address)
    outside.pub(me + b"/inbox/from-master", b"secret")
    local = lab.peer(relays[0].address)
    local.pub(me + b"/inbox/local", b"local secret")
    down = outside.pub(b"demo/down", b"plain")
    local_secret = b"MSG " + me + b"/inbox/local\0local secret"
    assert sorted(one.messages(2)) == sorted([local_secret, down])
    assert two.messages(1) == [down]
    # relay one kept its local secret to itself: the master wants no secret
    assert relays[0].metric(FORWARDED_UP) == 0
    up = lab.peer(relays[1].address).pub(b"demo/up", b"plain")
    for peer in (one, two):
        assert peer.messages(1) == [up]


def _pattern_refusals(server: NsServer) -> list[dict[str, Any]]:
    return [
        e for e in server.events("client.pattern_refused") if e.get("reason") == "secret_refused"
    ]


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return parse_metrics(response.read().decode())
