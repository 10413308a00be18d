"""SubscriptionIndex against a reference matcher written from the README's words."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sbus_relay.protocol.index import SubscriptionIndex, canonical

pytestmark = pytest.mark.timeout(60)


def same(pattern: bytes) -> bytes:
    """Patterns that match the same keys are one pattern: '*' is greedy, so a
    run of them is one (written apart from the index's own ``canonical``)."""
    return re.sub(rb"\*+", b"*", pattern)


def ref_match(pattern: bytes, key: bytes) -> bool:
    """the protocol's routing rule, byte by byte, plus protocol.md's secret rule."""
    if key.startswith(b"!/cred/") and not pattern.startswith(b"!/cred/"):
        return False
    if pattern == b"":
        return True
    p = k = 0
    while p < len(pattern):
        c = pattern[p]
        if c == ord("*"):
            while k < len(key) and key[k] != ord("/"):
                k += 1  # '*' matches until the next '/' or the end
            p += 1
        elif c == ord("/") and p == len(pattern) - 1:
            return k < len(key) and key[k] == ord("/")  # trailing '/': that '/' and anything
        elif k < len(key) and key[k] == c:
            p += 1
            k += 1
        else:
            return False
    return k == len(key)


README_CASES = [
    (b"a/*/c/", b"a/b/c/", True),
    (b"a/*/c/", b"a/b/c/d/e", True),
    (b"a/*/c/", b"a/b/c", False),
    (b"a/*/c/", b"a/c/d", False),
    (b"", b"anything/at/all", True),
    (b"", b"", True),
    (b"*", b"", True),
    (b"*", b"abc", True),
    (b"*", b"a/b", False),
    (b"a/*", b"a/", True),
    (b"a/*", b"a/b/c", False),
    (b"a/", b"a/", True),
    (b"a/", b"a", False),
    (b"ab*/x", b"abc/x", True),
    (b"ab*/x", b"ac/x", False),
    (b"a*b", b"axb", False),  # '*' is greedy, as in the reference
    (b"*/", b"a/b", True),
    (b"/", b"/x", True),
    (b"/", b"x", False),
    (b"a/b", b"a/b/", False),
    (b"", b"!/cred/1/2/3/x", False),
    (b"*/", b"!/cred/1/2/3/x", False),
    (b"*", b"!/cred/1/2/3/x", False),
    (b"!/cred/1/2/3/", b"!/cred/1/2/3/x", True),
    (b"!/cred/1/2/3/x", b"!/cred/1/2/3/x", True),
    (b"!/cred/1/2/3/*", b"!/cred/1/2/3/x/y", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), README_CASES)
def test_readme_cases(pattern: bytes, key: bytes, expected: bool) -> None:
    ix: SubscriptionIndex = SubscriptionIndex()
    ix.add("c", pattern)
    assert bool(ix.match(key)) is expected
    assert ref_match(pattern, key) is expected


alphabet = st.sampled_from([b"a", b"b", b"/", b"*", b"ab", b"!/cred/1/2/3/"])
patterns = st.lists(alphabet, max_size=6).map(b"".join)
keys = st.lists(st.sampled_from([b"a", b"b", b"/", b"ab", b"!/cred/1/2/3/"]), max_size=6).map(
    b"".join
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), patterns), max_size=12), st.lists(keys, max_size=8))
def test_match_equals_reference(subs: list[tuple[int, bytes]], probe: list[bytes]) -> None:
    ix: SubscriptionIndex = SubscriptionIndex(cache_size=4)
    for client, pattern in subs:
        ix.add(client, pattern)
    for key in probe:
        expected = {c for c, p in subs if ref_match(p, key)}
        got = ix.match(key)
        assert set(got) == expected
        assert len(got) == len(set(got)), "one copy per client"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2), patterns), max_size=30), keys)
def test_add_remove_sequences(ops: list[tuple[bool, int, bytes]], key: bytes) -> None:
    """Counted duplicates, first/last callbacks and the cache stay consistent."""
    events: list[tuple[str, bytes]] = []
    ix: SubscriptionIndex = SubscriptionIndex(
        on_first=lambda p: events.append(("+", p)), on_last=lambda p: events.append(("-", p))
    )
    model: dict[tuple[int, bytes], int] = {}
    for add, client, pattern in ops:
        ix.match(key)  # fill the cache between changes
        name = same(pattern)
        if add:
            ix.add(client, pattern)
            model[client, name] = model.get((client, name), 0) + 1
        else:
            held = model.get((client, name), 0)
            assert ix.remove(client, pattern) is bool(held)
            if held > 1:
                model[client, name] = held - 1
            elif held:
                del model[client, name]
    assert len(ix) == sum(model.values())
    live = {p for (_, p) in model}
    assert ix.distinct == len(live)
    assert set(ix.match(key)) == {c for (c, p) in model if ref_match(p, key)}
    # the callbacks describe exactly the live set
    state: set[bytes] = set()
    for verb, p in events:
        assert (p in state) is (verb == "-")
        (state.add if verb == "+" else state.discard)(p)
    assert state == live
    for client in (0, 1, 2):
        mine = {p: n for (c, p), n in model.items() if c == client}
        assert ix.patterns_of(client) == mine
        assert ix.distinct_of(client) == len(mine)
        for p in {same(p) for _, _, p in ops}:
            assert ix.count_of(client, p) == mine.get(p, 0)
    assert set(ix.patterns()) == live
    for client in (0, 1, 2):
        drop_client(ix, client)
    assert len(ix) == 0 and ix.distinct == 0 and not ix.match(key)


# One step of a client's life on a bus: subscribe, unsubscribe, publish
# (a match), or go away (every subscription dropped, as the server does).
steps = st.one_of(
    st.tuples(st.just("sub"), st.integers(0, 3), patterns),
    st.tuples(st.just("unsub"), st.integers(0, 3), patterns),
    st.tuples(st.just("match"), st.just(0), keys),
    st.tuples(st.just("gone"), st.integers(0, 3), st.just(b"")),
)


#: Keys of every shape the patterns can tell apart, matched between changes.
SHAPES = [b"", b"a", b"ab", b"a/", b"/", b"a/b", b"a/ab", b"ab/", b"a/b/", b"ab/a/b"]
SHAPES.append(b"!/cred/1/2/3/a")


@settings(max_examples=500, deadline=None)
@given(st.lists(steps, max_size=60), st.sampled_from([3, 64]), st.lists(keys, max_size=4))
@example([("sub", 1, b"*/a")], 64, [])  # a literal segment is not a prefix: a/ab
@example([("sub", 1, b"a*/")], 64, [])  # a tail wants more after it: not ab
def test_the_cache_answers_as_a_fresh_match_whatever_the_interleaving(
    ops: list[tuple[str, int, bytes]], size: int, more: list[bytes]
) -> None:
    """Subscriptions, unsubscriptions, matches and departures in any order,
    wildcards, trailing '/', '' and secret keys included: every answer the
    cache gives is the one a fresh match gives, and the reference's (the
    same clients, each once), and the cache stays within its bound (a small
    one is emptied and refilled as it goes; a large one keeps every key)."""
    ix: SubscriptionIndex = SubscriptionIndex(cache_size=size)
    model: dict[tuple[int, bytes], int] = {}

    def check(key: bytes) -> None:
        got = ix.match(key)
        assert len(got) == len(set(got)), "one copy per client"
        assert set(got) == set(ix.lookup(key)) == {c for (c, p) in model if ref_match(p, key)}
        assert len(ix.cache) <= size

    for verb, client, arg in ops:
        if verb == "sub":
            ix.add(client, arg)
            model[client, same(arg)] = model.get((client, same(arg)), 0) + 1
        elif verb == "unsub":
            held = model.get((client, same(arg)), 0)
            assert ix.remove(client, arg) is bool(held)
            if held > 1:
                model[client, same(arg)] = held - 1
            elif held:
                del model[client, same(arg)]
        elif verb == "gone":
            drop_client(ix, client)
            model = {(c, p): n for (c, p), n in model.items() if c != client}
        else:
            check(arg)
        for key in SHAPES + more:  # matched between every change: the cache is full of them
            check(key)
    for key in list(ix.cache):
        assert set(ix.cache[key]) == set(ix.lookup(key))


def test_a_change_leaves_the_keys_it_does_not_match_cached() -> None:
    """Clients coming and going on patterns that do not match the hot keys
    leave their cached answers alone; one that matches updates them."""
    ix: SubscriptionIndex = SubscriptionIndex()
    ix.add("reader", b"hot/")
    hot = [b"hot/%d" % i for i in range(100)] + [b"!/cred/1/2/3/hot"]
    ix.add("spy", b"!/cred/1/2/3/hot")
    for key in hot:
        ix.match(key)
    cached = {key: ix.cache[key] for key in hot}
    for pattern in (b"cold/1", b"cold/", b"hot/*/x", b"*/*/x/", b"hot/x*/", b"a*b", b"hot/1/"):
        ix.add("churn", pattern)
        ix.remove("churn", pattern)
    assert {key: ix.cache.get(key) for key in hot} == cached, "untouched by the churn"
    ix.add("late", b"hot/*")  # matches every public hot key: joins their answers
    assert all(ix.cache[key] == ("reader", "late") for key in hot[:-1])
    assert ix.cache[hot[-1]] == ("spy",), "no wildcard sees a secret key"
    ix.add("all", b"")
    assert all(ix.cache[key] == ("reader", "late", "all") for key in hot[:-1])
    assert ix.cache[hot[-1]] == ("spy",)
    ix.remove("late", b"hot/*")  # leaves: the answers that named it are dropped
    assert not any(key in ix.cache for key in hot[:-1]) and hot[-1] in ix.cache
    assert ix.match(b"hot/7") == ("reader", "all")
    ix.add("exact", b"hot/7")  # one key: one lookup
    assert ix.cache[b"hot/7"] == ("reader", "all", "exact")
    ix.remove("exact", b"hot/7")
    assert b"hot/7" not in ix.cache and ix.match(b"hot/7") == ("reader", "all")


rule_patterns = st.lists(
    st.sampled_from([b"a", b"b", b"/", b"*", b"**", b"ab", b"!/cred/1/2/3/"]), max_size=7
).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(st.lists(rule_patterns, max_size=4), st.lists(keys, max_size=20))
def test_the_cached_keys_a_pattern_matches_are_the_references(
    changed: list[bytes], cached: list[bytes]
) -> None:
    """What a subscription change touches, found without a scan, is every
    cached key the pattern matches and nothing else."""
    ix: SubscriptionIndex = SubscriptionIndex()
    ix.add("c", b"never")
    for key in SHAPES + cached:
        ix.match(key)
    ix.cache.pop(b"a/b", None)  # a key that has left the cache is not touched
    for pattern in changed:
        found = ix.cached(canonical(pattern))
        assert sorted(found) == sorted(k for k in ix.cache if ref_match(pattern, k))


def drop_client(ix: SubscriptionIndex, client: Any) -> None:
    """Remove every subscription of ``client``, as the server does when it goes."""
    for pattern, count in ix.patterns_of(client).items():
        for _ in range(count):
            assert ix.remove(client, pattern)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2), patterns), max_size=30))
def test_the_quiet_holder_never_fires_the_callbacks(ops: list[tuple[bool, int, bytes]]) -> None:
    """Holder 0 is quiet (a relay's upstream link): the callbacks follow the
    other holders only, whatever the quiet one holds meanwhile."""
    events: list[tuple[str, bytes]] = []
    ix: SubscriptionIndex = SubscriptionIndex(
        on_first=lambda p: events.append(("+", p)), on_last=lambda p: events.append(("-", p))
    )
    ix.quiet = 0
    for add, client, pattern in ops:
        if add:
            ix.add(client, pattern)
        else:
            ix.remove(client, pattern)
    heard = {p for c in (1, 2) for p in ix.patterns_of(c)}
    assert ix.distinct == len(heard)
    assert len(ix) == sum(n for c in (1, 2) for n in ix.patterns_of(c).values())
    state: set[bytes] = set()
    for verb, p in events:
        assert (p in state) is (verb == "-")
        (state.add if verb == "+" else state.discard)(p)
    assert state == heard


def test_a_client_that_leaves_and_comes_back_to_many_patterns_is_counted_right() -> None:
    """Left patterns stay in a client's list until it is compacted: counts,
    listings and removals never see them, however they interleave."""
    ix: SubscriptionIndex = SubscriptionIndex()
    held: set[bytes] = set()
    for round_ in range(5):
        for i in range(200):
            pattern = b"p/%d" % i
            if (i + round_) % 3:
                if pattern not in held:
                    ix.add("c", pattern)
                    held.add(pattern)
            elif pattern in held:
                assert ix.remove("c", pattern)
                held.discard(pattern)
            assert not ix.remove("c", b"never")
        assert ix.distinct_of("c") == len(held) == ix.distinct
        assert set(ix.patterns_of("c")) == held
        assert all(ix.count_of("c", p) == 1 for p in held)
        owned = getattr(ix, "_owned", None)  # (private to the compiled class: the pure pass)
        if owned is not None:
            assert len(owned.get("c", ())) <= 2 * len(held) + 1, "compacted as it goes"
    drop_client(ix, "c")
    assert ix.distinct == 0 and not ix.patterns_of("c") and not ix.match(b"p/1")


def test_duplicates_counted_and_unknown_remove() -> None:
    ix: SubscriptionIndex = SubscriptionIndex()
    ix.add("c", b"x")
    ix.add("c", b"x")
    assert ix.distinct_of("c") == 1 and ix.distinct_of("nobody") == 0
    assert ix.remove("c", b"x")
    assert ix.match(b"x") == ("c",)
    assert ix.remove("c", b"x")
    assert ix.match(b"x") == ()
    assert not ix.remove("c", b"x")
    assert not ix.remove("c", b"never")


def test_cache_is_bounded() -> None:
    ix: SubscriptionIndex = SubscriptionIndex(cache_size=8)
    ix.add("c", b"")
    for i in range(100):
        ix.match(b"k%d" % i)
    assert len(ix.cache) <= 8


def test_trie_pruned_after_removal() -> None:
    ix: SubscriptionIndex = SubscriptionIndex()
    for i in range(50):
        ix.add("c", b"a/%d/b*/*/" % i)
    drop_client(ix, "c")
    assert ix._public.empty()


@pytest.mark.parametrize("pattern", [b"", b"a/b", b"a/", b"a/*/c", b"a*b"])
def test_holders_for_every_kind_of_pattern(pattern: bytes) -> None:
    """Interest notices are built from holders(): every kind must answer."""
    ix: SubscriptionIndex = SubscriptionIndex()
    ix.add("c", pattern)
    ix.add("d", pattern)
    assert set(ix.holders(pattern)) == {"c", "d"}
    drop_client(ix, "c")
    assert ix.holders(pattern) == ("d",)


def test_equivalent_spellings_are_one_pattern() -> None:
    """'*' and '**' match the same keys: one pattern, counted twice, so the relay's
    upstream UNSUB waits for the last of them (docs/protocol.md)."""
    events: list[tuple[str, bytes]] = []
    ix: SubscriptionIndex = SubscriptionIndex(
        on_first=lambda p: events.append(("+", p)), on_last=lambda p: events.append(("-", p))
    )
    ix.add("c", b"a/*")
    ix.add("c", b"a/**")
    assert ix.distinct == 1 and len(ix) == 2 and ix.count_of("c", b"a/***") == 2
    assert ix.match(b"a/b") == ("c",)
    assert ix.remove("c", b"a/*")
    assert events == [("+", b"a/*")]  # still held through 'a/**'
    assert ix.remove("c", b"a/**")
    assert events == [("+", b"a/*"), ("-", b"a/*")]


def test_the_cache_stops_filling_with_keys_that_never_repeat() -> None:
    """An id in every key: once a full cache proves useless, one miss in
    MATCH_CACHE_SAMPLE is stored; when keys repeat again it fills in full."""
    from sbus_relay.protocol.limits import MATCH_CACHE_SAMPLE

    ix = SubscriptionIndex(cache_size=64)
    ix.add("c", b"k/")
    for i in range(64):  # fills the cache once, never hit
        ix.match(b"k/%d" % i)
    for i in range(64, 64 + 10 * MATCH_CACHE_SAMPLE):
        assert ix.match(b"k/%d" % i) == ("c",)
    assert len(ix.cache) <= 11  # sampled: one entry per MATCH_CACHE_SAMPLE keys
    hot = [b"k/hot%d" % i for i in range(8)]
    for _ in range(MATCH_CACHE_SAMPLE * 4):  # keys that repeat end up cached, and hit
        for key in hot:
            ix.match(key)
    assert all(key in ix.cache for key in hot)
    for _ in range(64):  # the hits count: a cache that fills up again is kept filling
        for i in range(64):
            ix.match(b"k/more%d" % i)
    assert len(ix.cache) > 32
