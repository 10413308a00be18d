"""A NATS link's hand-over to a new link process, without a server: what the
record carries and how each part goes on from it (docs/nats.md, "A live
upgrade's link"), and the host name shared warning that must not be a false
alarm."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sbus_relay.link import gossip as gossip_module
from sbus_relay.link.gossip import TWIN_SECONDS, Gossip
from sbus_relay.protocol import linkwire, natsinterest, natsorigins
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.natsenvelope import prefix
from sbus_relay.protocol.natsledger import Ledger
from sbus_relay.protocol.natsmap import SubjectMap
from sbus_relay.protocol.natssubs import UNSUB_GRACE, Subscriptions


def test_local_interest_goes_on_under_the_same_incarnation() -> None:
    old = natsinterest.LocalInterest(7)
    old.change(b"a/", True)
    old.delta()
    old.change(b"b/", True)  # pending at the hand-over
    new = natsinterest.LocalInterest(7)
    new.restore(old.export())
    assert new.patterns == {b"a/", b"b/"} and new.seq == 1
    (a,) = new.delta()
    assert (a.seq, a.changes) == (2, [(True, b"b/")])  # the old sequence goes on
    with pytest.raises(ValueError):
        natsinterest.LocalInterest(8).restore(old.export())


class Watcher:
    def __init__(self) -> None:
        self.said: list[tuple[str, Any]] = []

    def view(self, host: str, incarnation: int, seq: int) -> None:
        self.said.append(("view", (host, incarnation, seq)))

    def pattern(self, host: str, present: bool, pattern: bytes) -> None:
        self.said.append(("pattern", (host, present, pattern)))

    def silent(self, host: str) -> None:
        self.said.append(("silent", host))

    def heard(self, host: str) -> None:
        pass

    def gone(self, host: str) -> None:
        pass


def test_remote_views_are_taken_up_and_only_a_new_setting_changes_the_holds() -> None:
    old = natsinterest.RemoteInterest(always=(b"s/",))
    old.receive("x", natsinterest.Announcement("S", 1, 3, changes=[(True, b"k/")]), 100.0)
    old.receive("y", natsinterest.Announcement("S", 2, 5, changes=[(True, b"s/")]), 100.0)
    old.expire(100.0 + natsinterest.HOST_SILENT + 1)  # both silent now
    record = old.export()
    w = Watcher()
    # the new link publishes p/ always, no longer s/: the bus holds old's union
    new = natsinterest.RemoteInterest(always=(b"p/",), watchers=(w,))
    changes = new.restore(record)
    assert changes == [(True, b"p/")]  # s/ is still held: y wants it
    assert new.union == {b"k/": 1, b"s/": 1, b"p/": 1}
    assert ("view", ("x", 1, 3)) in w.said and ("pattern", ("x", True, b"k/")) in w.said
    assert ("silent", "x") in w.said and new.live == 0


def test_subscriptions_are_taken_up_exactly_under_their_numbers() -> None:
    old = Subscriptions(16)
    for p in (b"a/", b"a/b", b"c/"):
        old.change(p, True, 0.0)
    old.change(b"c/", False, 1.0)  # in its grace at the hand-over
    sids = {r: old.sid(r) for r in (b"a/", b"a/b", b"c/")}
    new = Subscriptions(16)
    made = new.restore(old.export(2.0), 10.0)
    assert made == sorted((sid, r) for r, sid in sids.items())
    assert new.decide(b"a/x") == (sids[b"a/"], True, (b"a/",))
    assert new.decide(b"c/x") == (sids[b"c/"], False, (b"c/",))  # counted, not delivered
    assert new.due(10.0 + UNSUB_GRACE - 1.0 - 0.01) == []  # its grace goes on, not anew
    assert new.due(10.0 + UNSUB_GRACE - 1.0) == [(sids[b"c/"], b"c/")]
    assert new.change(b"d/", True, 20.0) == b"d/" and new.sid(b"d/") > max(sids.values())


def test_what_the_old_link_took_is_dropped_from_what_the_new_one_held() -> None:
    record = {"origins": {"b 5": ["b", 5, "b", 40, 38], "c 6": ["c", 6, "c", 0, 12]}}
    places = natsorigins.positions(record)
    assert natsorigins.covered(places, "b 5 40", False)
    assert not natsorigins.covered(places, "b 5 41", False)
    assert natsorigins.covered(places, "b 5 38", True)  # the count after 38 came
    assert not natsorigins.covered(places, "b 5 40", True)  # the count after 40 did not
    assert natsorigins.covered(places, "c 6 12", True) and not natsorigins.covered(
        places, "c 6 13", False
    )
    assert not natsorigins.covered(places, "d 1 1", False)  # an origin it never heard
    assert not natsorigins.covered(places, "garbage", False)


def test_a_record_goes_in_parts_and_comes_back_whole() -> None:
    doc = {"big": "x" * (linkwire.RECORD_PART * 2 + 10), "n": 1}
    packets = linkwire.encode_record(linkwire.FINAL, doc)
    assert len(packets) == 3
    record = linkwire.Record()
    parts = [linkwire.control(p)[1] for p in packets]  # type: ignore[index]
    assert [linkwire.last_part(p) for p in parts] == [False, False, True]
    got = [record.add(p) for p in parts]
    assert got[:2] == [None, None] and got[2] == doc
    with pytest.raises(PeerError):
        linkwire.Record().add(b"?junk")
    with pytest.raises(PeerError):
        linkwire.Record().add(b".not json")


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append(("warning", event))

    def debug(self, event: str, **fields: Any) -> None:
        self.lines.append(("debug", event))


class Writer:
    def tell(self, pattern: bytes, present: bool) -> None:
        pass


async def _publish(batch: list[Any]) -> int:
    return 0


def _gossip(log: Log) -> Gossip:
    ledger = Ledger("h", 1)
    return Gossip(
        SubjectMap("sbus"), "h", False, _publish, Writer(), log,  # type: ignore[arg-type]
        incarnation=1, always=(), ledger=ledger, watchers=(), subs=Subscriptions(16),
        counts=lambda counts: None,
    )  # fmt: skip


def test_host_name_shared_is_said_only_of_another_process_that_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(gossip_module.time, "monotonic", lambda: now[0])
    log = Log()
    subject = SubjectMap("sbus").interest_of("h")

    async def hear(g: Gossip, kind: str, incarnation: int) -> None:
        a = natsinterest.Announcement(kind, incarnation)
        await g.on_interest(subject, natsinterest.encode(a))

    async def run() -> None:
        g = _gossip(log)
        # a restart's or an upgrade's other process: heard for a few seconds, then gone
        for _ in range(3):
            await hear(g, "H", 0)
            now[0] += 2.0
        await hear(g, "B", 0)
        assert log.lines == []
        # another host with our name: heartbeats on and on
        for _ in range(int(TWIN_SECONDS / 2) + 2):
            await hear(g, "H", 9)
            now[0] += 2.0
        assert log.lines == [("warning", "nats.host_name_shared")]  # said once
        # what a new link takes up of it: the same, without saying it again
        g2 = _gossip(log)
        g2.restore({**g.export(), "local": g2.local.export()})
        await hear(g2, "H", 9)
        assert log.lines == [("warning", "nats.host_name_shared")]

    asyncio.run(run())


def test_own_messages_are_known_by_their_prefix() -> None:
    assert prefix("h", 5) == "h 5 "
