"""Delivery through a hierarchy of real processes (docs/protocol.md): down, up, sideways,
exactly once; SUB/UNSUB propagation; whoami and secret keys at every level."""

from __future__ import annotations

import os

import pytest

from tests.relay.conftest import Hierarchy
from tests.relay.helpers import Bus, Peer, copies, identity, wait_until

pytestmark = pytest.mark.timeout(60)

STORED = "sbus_patterns_stored"
INTEREST = "sbus_upstream_interest_patterns"
MSGS_IN = 'sbus_packets_received_total{type="msg"}'
UP = 'sbus_upstream_forwarded_messages_total{direction="up"}'


def interest_snapshot(peer: Peer) -> set[bytes]:
    """Ask for interest (like a relay) and read the snapshot up to ``interest/ready``."""
    peer.send(b"CMSG interest/on")
    patterns: set[bytes] = set()
    while True:
        packet = peer.recv()
        if packet == b"CMSG interest/ready\0":
            return patterns
        assert packet.startswith(b"CMSG interest/add\0"), packet
        patterns.add(packet.split(b"\0", 1)[1])


def test_down_up_and_sideways_exactly_once(tree: Hierarchy) -> None:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    b = tree.bus("b", upstream=master)
    # Receivers, each with its own subscription; a1 holds two overlapping patterns
    # and a2 shares a relay with it, so duplicates would show at either level.
    m1, a1, a2, b1 = tree.peer(master), tree.peer(a), tree.peer(a), tree.peer(b)
    m1.sub(b"t/*")
    a1.sub(b"t/")
    a1.sub(b"t/*")
    a2.sub(b"t/x")
    b1.sub(b"*/x")
    # The master holds m1's pattern plus one SUB per distinct pattern of each relay,
    # and each relay's interest is what the others want: wait for all of it.
    master.wait_metric(STORED, 5)
    a.wait_metric(INTEREST, 2)  # t/*, */x
    b.wait_metric(INTEREST, 3)  # t/*, t/, t/x
    # Publishers hold no patterns, so every copy they get would be a bug.
    pm, pa, pb = tree.peer(master), tree.peer(a), tree.peer(b)
    sent = [
        pm.pub(b"t/x", b"down"),
        pa.pub(b"t/x", b"up-and-sideways-from-a"),
        pb.pub(b"t/x", b"up-and-sideways-from-b"),
    ]
    # "t/y" is wanted on the master and on relay a only
    sent_y = pb.pub(b"t/y", b"not-for-b1")
    for receiver in (m1, a1):
        got = receiver.messages(4)
        assert copies(got) == copies([*sent, sent_y])
    for receiver in (a2, b1):
        assert copies(receiver.messages(3)) == copies(sent)
    for publisher in (pm, pa, pb):
        assert publisher.messages(0) == []


def test_each_relay_forwards_each_message_up_once(tree: Hierarchy) -> None:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    a.wait_log("upstream.interest_ready")
    watcher = tree.peer(master)
    watcher.sub(b"k/")
    a.wait_metric(INTEREST, 1)
    pa = tree.peer(a)
    before = master.metric(MSGS_IN)
    for i in range(20):
        pa.pub(b"k/%d" % i)
    assert len(watcher.messages(20)) == 20
    assert master.metric(MSGS_IN) - before == 20
    assert a.metric(UP) == 20


def test_unsubscribe_goes_up_only_when_the_last_local_subscriber_leaves(
    tree: Hierarchy,
) -> None:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    # An interest listener on the master sees exactly what a relay sends up,
    # since every pattern it hears of is held by another client (relay a).
    observer = tree.peer(master)
    assert interest_snapshot(observer) == set()
    a1, a2 = tree.peer(a), tree.peer(a)
    a1.sub(b"u/x")
    assert observer.recv() == b"CMSG interest/add\0u/x"
    a2.sub(b"u/x")
    a2.sub(b"u/x")  # duplicates count (docs/protocol.md): one UNSUB leaves one
    a1.unsub(b"u/x")
    a2.unsub(b"u/x")
    observer.sync()
    assert observer.messages(0) == []
    assert master.metric(STORED) == 1, "the relay sent a second SUB or an early UNSUB"
    # the remaining subscription still works end to end
    sender = tree.peer(master)
    packet = sender.pub(b"u/x", b"still")
    assert a2.messages(1) == [packet]
    a2.unsub(b"u/x")
    assert observer.recv() == b"CMSG interest/remove\0u/x"
    master.wait_metric(STORED, 0)
    # a client that disconnects counts as leaving
    a1.sub(b"u/y")
    assert observer.recv() == b"CMSG interest/add\0u/y"
    a1.close()
    assert observer.recv() == b"CMSG interest/remove\0u/y"


def test_three_levels_whoami_and_delivery(tree: Hierarchy) -> None:
    master = tree.bus("m")
    r1 = tree.bus("r1", upstream=master)
    r2 = tree.bus("r2", upstream=r1)
    me = os.getpid()
    c0, c1, c2 = tree.peer(master), tree.peer(r1), tree.peer(r2)
    # protocol.md: each level prefixes its own identity as its upstream states it
    assert c0.whoami() == identity(me)
    assert c1.whoami() == identity(r1.pid, me)
    assert c2.whoami() == identity(r1.pid, r2.pid, me)
    for i, peer in enumerate((c0, c1, c2)):
        peer.sub(b"lvl/%d" % i)
    master.wait_metric(STORED, 3)  # c0's, and lvl/1 and lvl/2 via r1
    r1.wait_metric(STORED, 2)  # c1's, and lvl/2 from r2
    r2.wait_metric(INTEREST, 2)  # lvl/0 from the master, lvl/1 re-advertised by r1
    down = c0.pub(b"lvl/2", b"two levels down")
    up = c2.pub(b"lvl/0", b"two levels up")
    middle = c2.pub(b"lvl/1", b"one up")
    assert c2.messages(1) == [down]
    assert c0.messages(1) == [up]
    assert c1.messages(1) == [middle]
    assert r2.metric(UP) == 2


def test_a_message_nobody_outside_wants_does_not_go_up(tree: Hierarchy) -> None:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    a.wait_log("upstream.interest_ready")
    local = tree.peer(a)
    local.sub(b"local/")
    other = tree.peer(master)
    other.sub(b"wanted/")
    a.wait_metric(INTEREST, 1)
    before = master.metric(MSGS_IN)
    publisher = tree.peer(a)
    kept = [publisher.pub(b"local/%d" % i) for i in range(10)]
    assert local.messages(10) == kept
    # a wanted message afterwards proves the link was live while the others stayed
    wanted = publisher.pub(b"wanted/1")
    assert other.messages(1) == [wanted]
    assert master.metric(MSGS_IN) - before == 1
    assert a.metric(UP) == 1


def secret_setup(tree: Hierarchy) -> tuple[Bus, Bus, Bus, Peer, bytes]:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    b = tree.bus("b", upstream=master)
    owner = tree.peer(a)
    me = owner.whoami()
    assert me == identity(a.pid, os.getpid())
    owner.sub(me + b"/secret/")  # protocol.md: a relay's client subscribes with its whoami
    return master, a, b, owner, me


def test_secret_end_to_end_through_relays(tree: Hierarchy) -> None:
    master, a, b, owner, me = secret_setup(tree)
    snoopers = [tree.peer(bus) for bus in (master, a, b)]
    for snooper in snoopers:
        snooper.sub(b"")  # "" matches every key, but never a secret one (docs/protocol.md)
    master.wait_metric(STORED, 4)  # the secret pattern, and "" from each bus
    # b must know that someone above wants the secret pattern (a's owner)
    wait_until(lambda: b.metric(INTEREST) >= 1, "b's interest in the secret pattern")
    sent = [
        tree.peer(master).pub(me + b"/secret/from-master"),
        tree.peer(b).pub(me + b"/secret/from-b"),
        tree.peer(a).pub(me + b"/secret/from-a"),
    ]
    assert copies(owner.messages(3)) == copies(sent)
    for snooper in snoopers:
        assert snooper.messages(0) == []


def test_secret_pattern_of_one_relay_is_refused_on_the_other(tree: Hierarchy) -> None:
    _master, _a, b, _owner, me = secret_setup(tree)
    thief = tree.peer(b)
    thief.send(b"SUB " + me + b"/secret/")
    assert thief.is_closed(), "relay b accepted a pattern with relay a's prefix"
    assert "secret_refused" in b.log()
    # b's own clients may use b's prefix (the refusal is about the prefix, not relays)
    honest = tree.peer(b)
    mine = honest.whoami()
    honest.sub(mine + b"/secret/")
    assert not honest.is_closed(0.2)


def test_subscribe_to_everything_on_one_relay_sees_publishes_from_another(
    tree: Hierarchy,
) -> None:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    b = tree.bus("b", upstream=master)
    a.wait_log("upstream.interest_ready")  # from here on, a forwards by interest only
    everything = tree.peer(b)
    everything.sub(b"")  # protocol.md: "" matches every key
    master.wait_metric(STORED, 1)
    wait_until(lambda: a.metric(INTEREST) == 1, "relay a to hear of b's empty pattern", 1.5)
    packet = tree.peer(a).pub(b"any/key", b"sideways")
    assert everything.messages(1) == [packet]
