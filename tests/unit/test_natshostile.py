"""The receiving side of a bus's NATS link, without a server, driven with
arbitrary bytes on every subject under the prefix: the mapping
(``natsmap``), the interest announcements (``natsinterest``), the envelopes
and counts (``natsenvelope``, ``natsorigins``) and the subscriptions
(``natssubs``), put together as the bridge puts them.  Nothing raises,
nothing grows past its bound, and what is delivered is in each origin's
order."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbus_relay.protocol import natsinterest as ni
from sbus_relay.protocol import natsorigins as no
from sbus_relay.protocol.natsenvelope import HEADER, prefix, split
from sbus_relay.protocol.natsledger import Ledger
from sbus_relay.protocol.natsmap import MappingError, SubjectMap, decode_token
from sbus_relay.protocol.natssubs import Subscriptions

pytestmark = pytest.mark.timeout(300)

M = SubjectMap("sbus")


class Receiving:
    """What the bridge does with a message from NATS, without the I/O."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.local = ni.LocalInterest(incarnation=77)
        self.subs = Subscriptions()
        self.ledger = Ledger("me", 77)
        self.origins = no.Origins("me", 77, self.subs)
        self.remote = ni.RemoteInterest(watchers=(self.ledger, self.origins))
        for p in (b"", b"a/", b"a/*/c", b"ab*/x"):
            self.subs.change(p, True, self.now)
            self.local.change(p, True)
        self.subs.announced(self.local.snapshot())
        self.delivered: list[Any] = []
        self.reported: list[tuple[str, dict[str, Any]]] = []

    def take(self, subject: bytes, headers: dict[str, str] | None, payload: bytes) -> None:
        if subject.startswith(b"sbus._i."):
            try:
                host = decode_token(subject[len(b"sbus._i.") :]).decode("utf-8", "replace")
            except MappingError:
                return
            a = ni.decode(payload)
            if a is not None and host != "me":
                self.remote.receive(host, a, self.now)
                self.ledger.cuts()
        elif subject == b"sbus._q":
            self.local.answer(self.now)
        elif subject == M.ledger_of("me"):
            self.origins.count((headers or {}).get(HEADER), payload, self.now)
        elif subject == M.long:
            key, nul, _ = payload.partition(b"\0")
            if nul and key and headers and HEADER in headers:
                self.origins.arrive(headers[HEADER], None, True, headers[HEADER], self.now)
        else:
            try:
                key = M.key(subject)
            except MappingError:
                key = M.lenient_key(subject)  # type: ignore[assignment]
                if key is not None:
                    for r in list(self.subs.subs):
                        self.subs.taker(r, key)
                return
            for r in list(self.subs.subs):
                took = self.subs.taker(r, key)
                if took is not None and headers and HEADER in headers:
                    self.origins.arrive(
                        headers[HEADER], took[1], took[0], headers[HEADER], self.now
                    )

    def turn(self, seconds: float) -> None:
        for value in self.origins.release(self.now):
            self.delivered.append(value)
        self.now += seconds
        self.remote.expire(self.now)
        self.subs.due(self.now)
        self.ledger.due(self.now)
        self.origins.tick(self.now)
        self.reported.extend(self.origins.reports())


heads = st.sampled_from(
    ["sbus.k.", "sbus.c.%21.cred.1.2.3.", "sbus._i.", "sbus._s.", "sbus._l", "sbus._q", "sbus.k.a."]
)
tokens = st.one_of(
    st.sampled_from(["a", "me", "other", "%zz", "x.y", "ab", "c", "%", "%FF"]),
    st.text(min_size=0, max_size=6),
)
origins_text = st.one_of(
    st.sampled_from([prefix("other", 5), prefix("me", 77), prefix("x", 1), "o 1 ", "%zz 1 "]),
    st.text(max_size=12),
)
values = st.one_of(
    st.builds(lambda o, n: o + str(n), origins_text, st.integers(-2, 1 << 64)),
    st.text(max_size=30),
)
headers = st.one_of(st.none(), st.builds(lambda v: {HEADER: v}, values), st.just({"Other": "x"}))
payloads = st.one_of(
    st.binary(max_size=80),
    st.sampled_from([b"S 5 1 0 1\n+a/\0", b"D 5 2 0 1\n-a/\0+b\0", b"H 5 9 0 1\n", b"B 5 1 0 1\n"]),
    st.builds(lambda a, b, c, d: b"%d %d %d %d" % (a, b, c, d), *[st.integers(0, 99)] * 4),
)
messages = st.tuples(
    st.builds(
        lambda h, t: (h + ".".join(t)).encode("utf-8", "replace"),
        heads,
        st.lists(tokens, max_size=3),
    ),
    headers,
    payloads,
)


def per_origin(delivered: list[Any]) -> Iterator[list[int]]:
    by: dict[str, list[int]] = {}
    for value in delivered:
        got = split(value)
        assert got is not None
        by.setdefault(got[0], []).append(got[1])
    yield from by.values()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(messages, st.floats(0, 10)), max_size=80))
def test_arbitrary_bytes_on_every_subject(events: list[Any]) -> None:
    r = Receiving()
    for event in events:
        if isinstance(event, float):
            r.turn(event)
        else:
            r.take(*event)
    r.turn(0)
    for seqs in per_origin(r.delivered):
        assert seqs == sorted(set(seqs))  # each origin in its order, each once
    assert len(r.origins.origins) <= no.ORIGINS_MAX
    assert r.remote.stored <= ni.PATTERNS_MAX


def test_floods_stay_within_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # the compiled module reads its own globals (sbus_relay.accel): both are set
    for module in {no, sys.modules[no.Origins.__module__]}:
        monkeypatch.setattr(module, "ORIGINS_MAX", 16)
        monkeypatch.setattr(module, "LABELS", 4)
        monkeypatch.setattr(module, "STRANGER_LABELS", 2)
        monkeypatch.setattr(module, "EPISODES_MAX", 3)
    monkeypatch.setattr(ni, "HOSTS_MAX", 8)
    monkeypatch.setattr(ni, "PATTERNS_MAX", 50)
    monkeypatch.setattr(ni, "ASKED_MAX", 10)
    r = Receiving()
    r.remote.receive("real", ni.LocalInterest(3).snapshot()[0], r.now)  # a real host, known
    r.take(b"sbus.k.a.b", {HEADER: prefix("real", 3) + "1"}, b"first")
    for i in range(500):
        # new origins, each with a loss made up by a forged count
        origin = prefix("forged%d" % i, 1)
        r.take(b"sbus.k.a.b", {HEADER: origin + "1"}, b"x")
        r.take(M.ledger_of("me"), {HEADER: origin + "1"}, b"77 0 1 0")
        r.take(M.ledger_of("me"), {HEADER: origin + "2"}, b"77 0 1 9")
        # announcements of ever new hosts, with many patterns
        snap = b"S 1 1 0 1\n" + b"".join(b"+p/%d/%d\0" % (i, j) for j in range(20))
        r.take(b"sbus._i.h%d" % i, None, snap)
        r.take(b"sbus._i.n%d" % i, None, b"H 1 1 0 1\n")  # unknown: asked of
        if i % 50 == 0:
            r.turn(0.1)
    r.turn(2)
    rows = r.origins.rows()
    assert len(r.origins.origins) <= 16 and len(rows) <= 4 + 2 + 1  # labels, strangers, other
    assert "real" in rows  # announced: its label is its own, whatever came after
    assert r.origins.evicted > 0
    assert prefix("real", 3)[:-1] in r.origins.origins  # the known host's origin stayed
    assert len(r.remote.hosts) <= 8 and r.remote.stored <= 50 and r.remote.refused > 0
    assert len(r.remote._asked) <= 10
    # each loss episode said once: 3 origins apart, the others together
    episodes = [f["origin"] for e, f in r.reported if e == "nats.loss"]
    assert set(episodes) <= {"forged0", "forged1", "forged2", "other"}
    assert len(episodes) == len(set(episodes)) and "other" in episodes
