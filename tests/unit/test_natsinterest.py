"""The hosts' interest announcements: deltas, snapshots in parts, gaps, silence."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbus_relay.protocol import natsinterest as ni
from sbus_relay.protocol.keys import valid_key

pytestmark = pytest.mark.timeout(60)


def feed(remote: ni.RemoteInterest, host: str, announcements: list[ni.Announcement]) -> bool:
    asked = False
    for a in announcements:
        _, want = remote.receive(host, ni.decode(ni.encode(a)) or a, 0.0)
        asked = asked or want
    return asked


def test_snapshot_then_deltas_build_the_union() -> None:
    a = ni.LocalInterest(incarnation=7)
    remote = ni.RemoteInterest()
    a.change(b"x/", True)
    assert not feed(remote, "A", a.snapshot())
    a.change(b"y", True)
    a.change(b"x/", False)
    assert not feed(remote, "A", a.delta())
    assert set(remote.union) == {b"y"}
    b = ni.LocalInterest(incarnation=8)
    b.change(b"y", True)
    feed(remote, "B", b.snapshot())
    assert remote.union == {b"y": 2}


def test_a_lost_delta_asks_for_a_snapshot() -> None:
    a = ni.LocalInterest(incarnation=1)
    remote = ni.RemoteInterest()
    feed(remote, "A", a.snapshot())
    a.change(b"p", True)
    a.delta()  # lost on the way
    a.change(b"q", True)
    assert feed(remote, "A", a.delta())
    assert feed(remote, "A", [a.heartbeat()]) is False  # asked a moment ago: not again
    feed(remote, "A", a.snapshot())
    assert set(remote.union) == {b"p", b"q"}


def test_unknown_host_and_new_incarnation_ask() -> None:
    remote = ni.RemoteInterest()
    assert feed(remote, "A", [ni.LocalInterest(1).heartbeat()])
    a2 = ni.LocalInterest(2)
    a2.change(b"z", True)
    feed(remote, "A", a2.snapshot())
    assert set(remote.union) == {b"z"}
    feed(remote, "A", [ni.LocalInterest(1).goodbye()])  # an old incarnation's goodbye
    assert set(remote.union) == {b"z"}
    feed(remote, "A", [a2.goodbye()])
    assert remote.union == {}


def test_a_big_snapshot_goes_in_parts_and_a_missing_part_is_noticed() -> None:
    a = ni.LocalInterest(3)
    for i in range(12000):
        a.change(b"some/longer/pattern/%d" % i, True)
    snap = a.snapshot()
    assert len(snap) > 2 and all(len(ni.encode(s)) < ni.ANNOUNCE_BYTES + 4096 for s in snap)
    remote = ni.RemoteInterest()
    assert feed(remote, "A", [snap[0], *snap[2:]])
    assert remote.union == {}
    remote2 = ni.RemoteInterest()
    feed(remote2, "A", snap)
    assert len(remote2.union) == 12000


def test_secret_and_reserved_patterns_are_refused_and_silent_hosts_forgotten() -> None:
    a = ni.LocalInterest(4)
    for p in (b"!/cred/1/2/3/x", b"a/!/b", b"ok"):
        a.change(p, True)
    remote = ni.RemoteInterest()
    feed(remote, "A", a.snapshot())
    assert set(remote.union) == {b"ok"} and remote.refused == 2
    # silent: still in the union (counted for, not sent to), then forgotten
    assert remote.expire(ni.HOST_SILENT + 1) == [] and remote.hosts["A"].silent
    assert remote.live == 0 and set(remote.union) == {b"ok"}
    assert remote.expire(ni.HOST_SILENT + ni.SILENT_KEEP + 2) == [(False, b"ok")]
    assert remote.hosts == {} and remote.stored == 0 and remote.stored_bytes == 0


def test_with_identities_crossing_a_host_holds_secret_patterns_below_its_own_only() -> None:
    a = ni.LocalInterest(5)
    a_id, b_id = ni.host_identity("A"), ni.host_identity("B")
    mine, theirs = a_id + b"!/cred/1/2/3/inbox/", b_id + b"!/cred/1/2/3/inbox/"
    for p in (mine, theirs, b"!/cred/", a_id[:-1], b"ok"):
        a.change(p, True)
    remote = ni.RemoteInterest(secrets=True)
    feed(remote, "A", a.snapshot())
    assert set(remote.union) == {mine, b"ok"} and remote.refused == 3
    assert re.fullmatch(rb"!/cred/0/0/[0-9]+/", a_id) and a_id != b_id
    assert valid_key(mine + b"x") and ni.host_identity("A") == a_id
    assert ni.acceptable(mine, owner=a_id) and not ni.acceptable(mine)
    assert not ni.acceptable(theirs, owner=a_id)


@pytest.mark.parametrize(
    "payload",
    [b"", b"X 1 2 3 4\n", b"D 1 2 3\n", b"D a 1 0 1\n", b"D 1 1 0 1\n+x", b"D 1 1 0 1\nx\0"],
)
def test_malformed(payload: bytes) -> None:
    assert ni.decode(payload) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from([b"a", b"b/", b"*/c", b""])), max_size=40),
    st.integers(1, 5),
)
def test_deltas_in_any_grouping_give_the_senders_set(
    ops: list[tuple[bool, bytes]], every: int
) -> None:
    a = ni.LocalInterest(9)
    remote = ni.RemoteInterest()
    feed(remote, "A", a.snapshot())
    for i, (present, pattern) in enumerate(ops):
        a.change(pattern, present)
        if i % every == 0:
            assert not feed(remote, "A", a.delta())
    feed(remote, "A", a.delta())
    assert set(remote.union) == a.patterns


def test_hosts_and_their_patterns_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ni, "HOSTS_MAX", 2)
    monkeypatch.setattr(ni, "HOST_PATTERNS_MAX", 3)
    remote = ni.RemoteInterest()
    for host in ("A", "B", "C"):
        a = ni.LocalInterest()
        for i in range(5):
            a.change(b"p/%d" % i, True)
        feed(remote, host, a.snapshot())
        a.change(b"q", True)
        feed(remote, host, a.delta())
    assert set(remote.hosts) == {"A", "B"}
    assert all(len(v.patterns) == 3 for v in remote.hosts.values())
    # A and B: two patterns over the bound in the snapshot, one in the delta; C: its snapshot
    assert remote.refused == 2 * 3 + 1


def test_a_newer_link_of_a_host_supersedes_the_older() -> None:
    """A live upgrade: the old and the new process both talk for a moment, in
    any order; the old one's snapshot and goodbye never undo the new one's."""
    old, new = ni.LocalInterest(100), ni.LocalInterest(200)
    old.change(b"x/", True)
    new.change(b"x/", True)
    remote = ni.RemoteInterest()
    feed(remote, "A", old.snapshot())
    feed(remote, "A", new.snapshot())
    assert not feed(remote, "A", [old.heartbeat()])  # no snapshot asked of the old one
    feed(remote, "A", old.snapshot())
    feed(remote, "A", [old.goodbye()])
    assert set(remote.union) == {b"x/"} and remote.hosts["A"].incarnation == 200
