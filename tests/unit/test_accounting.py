"""Per-relay and per-user accounting: bounded series whose counters never go down."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbus_relay.protocol.accounting import (
    COUNTERS,
    OTHER,
    Tally,
    credentials_label,
    relay_name,
)

pytestmark = pytest.mark.timeout(120)
N = len(COUNTERS)


def row(msgs_in: int = 0, dropped: int = 0, queued_bytes: int = 0) -> tuple[list[int], list[int]]:
    counters = [msgs_in, 0, msgs_in * 10, 0, dropped, 0]
    return counters, [queued_bytes // 10, queued_bytes, 1]


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (b"web", "web"),
        (b"ctr-1.example:9@x_y", "ctr-1.example:9@x_y"),
        (b"", None),
        (b"a" * 65, None),
        (b"has space", None),
        (b"caf\xc3\xa9", None),
        (b"other", None),  # reserved: the label of everyone outside the top
        (b"local", None),  # reserved: clients connected directly
        (b"new\nline", None),
    ],
)
def test_relay_names(raw: bytes, name: str | None) -> None:
    assert relay_name(raw) == name


def test_credentials_label() -> None:
    assert credentials_label(1, 2, 3) == "cred:1/2/3"


def test_top_is_bounded() -> None:
    with pytest.raises(ValueError, match="top"):
        Tally(0)
    with pytest.raises(ValueError, match="top"):
        Tally(1001)
    with pytest.raises(ValueError, match="top"):
        Tally(5).set_top(0)


def test_a_smaller_top_applies_at_the_next_scrape() -> None:
    tally = Tally(3, rank_interval=3600)  # no re-ranking due for an hour
    live = {"a": row(5), "b": row(50), "c": row(500), "d": row(1)}
    assert [label for label, _, _ in tally.rows(live, now=1)] == ["a", "b", "c", OTHER]
    tally.set_top(1)
    live["c"] = row(900)  # the busiest since
    rows = tally.rows(live, now=2)
    assert [label for label, _, _ in rows] == ["c", OTHER]
    # a's and b's series end with what they showed; other takes their increments from now
    assert rows[-1][1][0] == 1
    tally.set_top(2)
    live["b"] = row(70)
    rows = tally.rows(live, now=3)
    assert [label for label, _, _ in rows] == ["b", "c", OTHER]
    assert rows[0][1][0] == 20 and rows[-1][1][0] == 1


def test_the_busiest_keys_are_named_and_the_rest_are_other() -> None:
    tally = Tally(2, rank_interval=0)
    live = {"a": row(msgs_in=5), "b": row(msgs_in=50), "c": row(msgs_in=500), "d": row()}
    rows = {label: (c, g) for label, c, g in tally.rows(live, now=1)}
    assert set(rows) == {"b", "c", OTHER}
    assert rows["c"][0][0] == 500 and rows["b"][0][0] == 50  # at the first scrape: whole
    assert rows[OTHER][0][0] == 5
    assert rows[OTHER][1][2] == 2  # connections of a and d
    live = {"a": row(msgs_in=6), "b": row(msgs_in=60), "c": row(msgs_in=600), "e": row(9)}
    rows = {label: (c, g) for label, c, g in tally.rows(live, now=2)}
    assert rows["c"][0][0] == 600 and rows["b"][0][0] == 60 and rows[OTHER][0][0] == 6 + 9


def test_a_key_entering_the_top_later_starts_from_what_other_has_not_shown() -> None:
    tally = Tally(1, rank_interval=0)
    first = dict((label, c[0]) for label, c, _ in tally.rows({"a": row(9), "b": row(5)}, now=1))
    assert first == {"a": 9, OTHER: 5}
    later = dict((label, c[0]) for label, c, _ in tally.rows({"a": row(9), "b": row(50)}, now=2))
    assert later == {"b": 45, OTHER: 5}  # b's first 5 were shown in other already


def test_a_dropper_and_a_deep_queue_are_named_even_when_quiet() -> None:
    tally = Tally(3, rank_interval=0)
    live = {f"p{i}": row(msgs_in=1000 + i) for i in range(10)}
    live["dropper"] = row(dropped=1)
    live["deep"] = row(queued_bytes=10_000)
    labels = {label for label, _, _ in tally.rows(live, now=1)}
    assert labels == {"p9", "dropper", "deep", OTHER}


def test_closed_connections_keep_counting_for_their_key() -> None:
    tally = Tally(5, rank_interval=0)
    tally.closed("web", row(msgs_in=7)[0])
    rows = {label: c for label, c, _ in tally.rows({"web": row(msgs_in=3)}, now=1)}
    assert rows["web"][0] == 10 and rows[OTHER][0] == 0
    tally.closed("web", row(msgs_in=4)[0])  # the live one closed with 4
    rows = {label: c for label, c, _ in tally.rows({}, now=2)}
    assert rows["web"][0] == 11


def test_a_key_change_keeps_the_old_key_whole() -> None:
    tally = Tally(5, rank_interval=0)
    first = {label: c for label, c, _ in tally.rows({"cred:1/1/1": row(msgs_in=2)}, now=1)}
    tally.moved("cred:1/1/1", "web", row(msgs_in=2)[0])
    later = {label: c for label, c, _ in tally.rows({"web": row(msgs_in=9)}, now=2)}
    assert later["cred:1/1/1"][0] == first["cred:1/1/1"][0]  # neither up nor down
    assert sum(c[0] for c in later.values()) == 9  # every message once
    last = {label: c for label, c, _ in tally.rows({"web": row(msgs_in=12)}, now=3)}
    assert last["web"][0] - later["web"][0] == 3  # what came after the name


def test_trim_forgets_unused_keys_but_not_their_counts() -> None:
    tally = Tally(1, rank_interval=0)
    for i in range(100):
        tally.closed(f"k{i}", row(msgs_in=1)[0])
    tally.rows({}, now=1)
    tally.trim(live=[])
    assert tally.tracked() <= 1  # only the exported key keeps its closed totals
    rows = tally.rows({}, now=2)
    assert sum(c[0] for _, c, _ in rows) == 100  # forgotten keys still count in other


def test_ten_thousand_keys_give_top_plus_one_series() -> None:
    tally = Tally(10, rank_interval=0)
    rng = random.Random(7)
    live: dict[str, tuple[list[int], list[int]]] = {}
    for i in range(10_000):
        live[f"relay-{i}"] = row(msgs_in=rng.randrange(1000), dropped=rng.randrange(3))
    rows = tally.rows(live, now=1)
    assert len(rows) == 11
    assert sum(g[2] for _, _, g in rows) == 10_000  # every connection counted once


# The property: whatever keys come, grow, close and change, every exported
# counter only ever goes up, the series stay bounded, and the sum over the
# rows equals the sum of everything counted.
step = st.tuples(
    st.sampled_from(["grow", "close", "move", "scrape", "trim", "top"]),
    st.integers(0, 11),
    st.integers(0, 11),
    st.integers(0, 50),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.lists(step, max_size=60))
def test_counters_never_go_down(top: int, steps: list[tuple[str, int, int, int]]) -> None:
    tally = Tally(top, rank_interval=0)
    conns: dict[int, tuple[str, list[int]]] = {}  # conn id -> (key, counters)
    seen: dict[str, list[int]] = {}
    gone = [0] * N  # the last values of series that went away
    everything = [0] * N
    now = 0.0
    for op, a, b, n in steps:
        now += 1
        if op == "grow":
            key, counts = conns.setdefault(a, (f"k{b}", [0] * N))
            counts[0] += n
            counts[4] += n % 3
            everything[0] += n
            everything[4] += n % 3
        elif op == "close" and a in conns:
            key, counts = conns.pop(a)
            tally.closed(key, counts)
        elif op == "move" and a in conns:
            key, counts = conns[a]
            tally.moved(key, f"k{b}", counts)
            conns[a] = (f"k{b}", counts)
        elif op == "trim":
            tally.trim(key for key, _ in conns.values())
        elif op == "top":  # a reload changes accounting_top
            top = b % 4 + 1
            tally.set_top(top)
        live: dict[str, tuple[list[int], list[int]]] = {}
        for key, counts in conns.values():
            total, gauges = live.setdefault(key, ([0] * N, [0, 0, 0]))
            for i in range(N):
                total[i] += counts[i]
            gauges[2] += 1
        rows = tally.rows(live, now)
        assert len(rows) <= top + 1
        assert rows[-1][0] == OTHER
        shown = {label: counts for label, counts, _ in rows}
        for label in [k for k in seen if k not in shown]:  # a series went away
            last = seen.pop(label)
            for i in range(N):
                gone[i] += last[i]
        for label, counts in shown.items():
            before = seen.get(label)
            if before is not None:
                assert all(x >= y for x, y in zip(counts, before, strict=True)), label
            seen[label] = counts
        # every increment is in exactly one series (or in one that went away)
        for i in range(N):
            assert sum(c[i] for c in shown.values()) + gone[i] == everything[i], (rows, gone)
