"""Who did it: per-relay and per-user series and ``/clients`` on real hierarchies."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.relay.conftest import Hierarchy
from tests.relay.helpers import Bus, wait_until

pytestmark = pytest.mark.timeout(120)


def clients(bus: Bus, query: str = "") -> dict[str, Any]:
    url = f"http://127.0.0.1:{bus.port}/clients{query}"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"] == "application/json"
        doc: dict[str, Any] = json.load(response)
    return doc


def series(bus: Bus, family: str) -> dict[str, float]:
    """``{label value: sample}`` of one per-who family."""
    out = {}
    for name, value in bus.metrics().items():
        m = re.fullmatch(re.escape(family) + r'\{(?:relay|uid)="([^"]*)"\}', name)
        if m:
            out[m.group(1)] = value
    return out


def test_the_master_names_each_container_relay_and_counts_its_traffic(
    tree: Hierarchy,
) -> None:
    master = tree.bus("m", "--instance", "master")
    web = tree.bus("web", "--instance", "web", upstream=master)
    db = tree.bus("db", "--instance", "db", upstream=master)
    host = tree.peer(master)
    host.sub(b"jobs/")
    master.wait_metric("sbus_upstream_interest_patterns", 0)  # master exports none
    wait_until(lambda: web.metric("sbus_upstream_interest_patterns") == 1, "web sees jobs/")
    wait_until(lambda: db.metric("sbus_upstream_interest_patterns") == 1, "db sees jobs/")
    app = tree.peer(web)
    for i in range(30):
        app.pub(b"jobs/%d" % i, b"x" * 10)
    assert len(host.messages(30)) == 30

    doc = clients(master)
    assert doc["server"]["instance"] == "master" and doc["server"]["role"] == "master"
    by_label = {row["relay"]: row for row in doc["clients"]}
    assert set(by_label) == {"web", "db", "local"}
    assert by_label["web"]["is_relay"] and by_label["db"]["is_relay"]
    assert by_label["web"]["pid"] == web.pid and by_label["db"]["pid"] == db.pid
    assert by_label["web"]["msgs_in"] == 30 and by_label["db"]["msgs_in"] == 0
    assert by_label["local"]["msgs_out"] == 30 and by_label["local"]["patterns"] == 1
    assert doc["clients"][0]["relay"] == "web"  # sorted by msgs_in, busiest first

    # the relays were named at the first scrape, before any traffic: every message counts
    assert series(master, "sbus_relay_messages_in_total")["web"] == 30
    for i in range(20):
        app.pub(b"jobs/more/%d" % i)
    host.messages(20)
    assert series(master, "sbus_relay_messages_in_total")["web"] == 50
    totals = series(master, "sbus_relay_messages_in_total")
    assert sum(totals.values()) == master.metric('sbus_packets_received_total{type="msg"}')
    assert series(master, "sbus_relay_connections") == {"db": 1, "local": 1, "web": 1, "other": 0}
    # the relay reports its own clients the same way
    web_doc = clients(web)
    assert web_doc["server"]["role"] == "relay" and web_doc["server"]["upstream_connected"]
    assert [r["relay"] for r in web_doc["clients"]] == ["local"]
    assert web_doc["clients"][0]["msgs_in"] == 50


def test_drops_and_queues_name_the_client_and_its_user(tree: Hierarchy) -> None:
    master = tree.bus("m")
    db = tree.bus("db", "--instance", "db", "--hard-limit-messages", "5", upstream=master)
    stalled = tree.peer(db)
    stalled.sub(b"")
    stalled.send(b"CMSG blocking/hard/discard")
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    publisher = tree.peer(db)
    for i in range(3000):
        publisher.pub(b"k/%d" % i, b"y" * 200)
    wait_until(lambda: db.metric('sbus_messages_dropped_total{reason="hard_discard"}') > 0, "drops")
    me = str(os.getuid())
    dropped = series(db, "sbus_user_dropped_messages_total")
    queued = series(db, "sbus_user_queued_messages")
    assert set(dropped) == {me, "other"} and queued[me] >= 5
    doc = clients(db, "?sort=dropped&limit=1")
    assert doc["total"] == 2 and len(doc["clients"]) == 1
    worst = doc["clients"][0]
    assert worst["pid"] == os.getpid() and worst["dropped"] > 0 and worst["queued_messages"] >= 5
    # the drops so far are in other (the series began at the first scrape); new ones are named
    before = series(db, "sbus_user_dropped_messages_total")[me]
    for i in range(3000):
        publisher.pub(b"k/%d" % i, b"y" * 200)
    wait_until(lambda: series(db, "sbus_user_dropped_messages_total")[me] > before, "named drops")
    assert series(db, "sbus_relay_dropped_messages_total")["local"] > 0


def test_clients_queries_are_checked_and_bounded(tree: Hierarchy) -> None:
    master = tree.bus("m")
    peers = [tree.peer(master) for _ in range(5)]
    for i, peer in enumerate(peers):
        for _ in range(i):
            peer.pub(b"x")
    wait_until(lambda: clients(master)["server"]["clients"] == 5, "5 clients")
    doc = clients(master, "?sort=msgs_in&order=asc&limit=2&offset=1")
    assert [r["msgs_in"] for r in doc["clients"]] == [1, 2] and doc["total"] == 5
    assert clients(master, "?uid=%d" % os.getuid())["total"] == 5
    assert clients(master, "?relay=nobody")["total"] == 0
    for bad in ("?sort=pid", "?limit=0", "?limit=1001", "?order=up", "?offset=-1", "?x=1"):
        with pytest.raises(urllib.error.HTTPError) as info:
            clients(master, bad)
        assert info.value.code == 400
        assert json.load(info.value)["error"]


def test_a_client_cannot_pose_as_a_named_relay_without_being_one(tree: Hierarchy) -> None:
    master = tree.bus("m")
    plain, fake = tree.peer(master), tree.peer(master)
    plain.send(b"CMSG relay/name\0web")  # not a relay: ignored, logged
    fake.send(b"CMSG interest/on")
    fake.send(b"CMSG relay/name\0other")  # a reserved label: falls back to credentials
    master.wait_log("client.relay_name_refused")
    labels = sorted(r["relay"] for r in clients(master)["clients"])
    assert labels == [f"cred:{os.getgid()}/{os.getuid()}/{os.getpid()}", "local"]


def test_ten_thousand_distinct_clients_keep_the_series_bounded(tree: Hierarchy) -> None:
    master = tree.bus("m", "--accounting-top", "5", "--max-clients", "2000")
    families = ("sbus_relay_messages_in_total", "sbus_relay_connections", "sbus_user_queued_bytes")
    for wave in range(10):
        socks = []
        for i in range(1000):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(master.address)
            s.sendall(b"CMSG interest/on")
            s.sendall(b"CMSG relay/name\0relay-%d" % (wave * 1000 + i))
            s.sendall(b"MSG k/%d\0" % i)
            socks.append(s)
        wait_until(lambda: clients(master)["server"]["clients"] == 1000, "a wave connected")
        for family in families:
            assert 1 <= len(series(master, family)) <= 6, family
        for s in socks:
            s.close()
        wait_until(lambda: clients(master)["server"]["clients"] == 0, "a wave gone")
    for family in families:
        assert len(series(master, family)) <= 6, family
    assert series(master, "sbus_relay_connections")["other"] == 0
    received = master.metric('sbus_packets_received_total{type="msg"}')
    assert received == 10_000
    rss = master.metric("process_resident_memory_bytes")
    assert rss < 200 * 1024 * 1024  # nothing per departed client is kept


def _publish_as(uid: int, address: str) -> int:
    """Fork a child that becomes ``uid``, publishes once and exits; its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.connect(address)
                s.sendall(b"MSG from/%d\0" % uid)
                s.sendall(b"CMSG !/cred/whoami")  # answered after the MSG was handled
                s.settimeout(5)
                s.recv(1024)
            code = 0
        finally:
            os._exit(code)
    return pid


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as many users")
def test_many_users_keep_the_user_series_bounded(tree: Hierarchy) -> None:
    master = tree.bus("m", "--accounting-top", "5", "--other-access")
    os.chmod(tree.dir, 0o755)
    uids = range(20_000, 20_040)
    for uid in uids:
        pid = _publish_as(uid, master.address)
        assert os.waitpid(pid, 0)[1] == 0, f"child as uid {uid} failed"
        if uid % 10 == 0:
            assert len(series(master, "sbus_user_messages_in_total")) <= 6
    totals = series(master, "sbus_user_messages_in_total")
    assert len(totals) <= 6 and "other" in totals
    assert all(label == "other" or int(label) in uids for label in totals)
    assert master.metric('sbus_packets_received_total{type="msg"}') == 40
