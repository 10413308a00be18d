"""Keys and patterns as NATS subjects: both ways, against the bus's own
matcher (``SubscriptionIndex``) and a model of NATS's matching rules
(tests/natsmodel.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.limits import MAX_PACKET
from sbus_relay.protocol.natsmap import (
    MappingError,
    SubjectMap,
    check_prefix,
    decode_token,
    encode_segment,
    exact,
    relaxed,
)
from tests.natsmodel import nats_match, valid_subject

pytestmark = pytest.mark.timeout(120)

M = SubjectMap("sbus")

#: segments with every kind of awkward byte: '.', spaces, '*', '>', '%',
#: bytes that are not UTF-8, the empty segment
odd_segments = st.one_of(
    st.sampled_from([b"", b"a", b"b", b"ab", b".", b" ", b"*x", b">", b"%", b"%25", b"\xff\xfe"]),
    st.binary(max_size=6).map(lambda b: b.replace(b"/", b"").replace(b"\0", b"")),
)
keys = st.one_of(
    st.lists(odd_segments, min_size=1, max_size=6).map(b"/".join),
    st.lists(odd_segments, min_size=1, max_size=4).map(lambda s: b"!/cred/1/2/3/" + b"/".join(s)),
)
pattern_segments = st.one_of(
    odd_segments.map(lambda s: s.replace(b"*", b"")),
    st.sampled_from([b"*", b"a*", b"ab*", b"a*b", b"**"]),
)


def _pattern(segs: list[bytes], tail: bool) -> bytes:
    return b"/".join(segs) + (b"/" if tail else b"")


patterns = st.one_of(
    st.just(b""),
    st.builds(_pattern, st.lists(pattern_segments, min_size=1, max_size=5), st.booleans()),
    st.builds(
        lambda segs, tail: b"!/cred/1/2/3/" + _pattern(segs, tail),
        st.lists(pattern_segments, min_size=1, max_size=3),
        st.booleans(),
    ),
)


def bus_match(pattern: bytes, key: bytes) -> bool:
    ix: SubscriptionIndex = SubscriptionIndex()
    ix.add("c", pattern)
    return bool(ix.match(key))


@settings(max_examples=600, deadline=None)
@given(keys)
def test_every_key_has_a_valid_subject_and_comes_back(key: bytes) -> None:
    subject = M.subject(key)
    assert valid_subject(subject, wildcards=False)
    assert subject.isascii()
    assert M.key(subject) == key


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=8))
def test_every_segment_is_one_token_and_back(segment: bytes) -> None:
    segment = segment.replace(b"/", b"")
    token = encode_segment(segment)
    assert valid_subject(token, wildcards=False) and b"." not in token
    assert decode_token(token) == segment


@settings(max_examples=1500, deadline=None)
@given(patterns, keys)
def test_subscription_matches_what_the_bus_matches(pattern: bytes, key: bytes) -> None:
    """Exact patterns: NATS delivers a key iff the bus matches it.  Relaxed
    ones (``ab*``): NATS carries a superset, exactly the relaxed pattern's keys."""
    sub = M.subscription(pattern)
    wanted = bus_match(pattern, key)
    if sub is None:
        assert not wanted  # a pattern that can match nothing
        return
    assert valid_subject(sub, wildcards=True)
    carried = nats_match(sub, M.subject(key))
    r = relaxed(pattern)
    assert r is not None
    assert carried == bus_match(r, key)
    if exact(pattern):
        assert carried == wanted
    else:
        assert carried or not wanted  # a superset: never less than wanted


def test_the_longest_key_maps() -> None:
    longest = b"x/" * ((MAX_PACKET - 6) // 2)
    subject = M.subject(longest)
    assert M.key(subject) == longest
    assert valid_subject(subject, wildcards=False)


@pytest.mark.parametrize(
    ("pattern", "subscription"),
    [
        (b"", b"sbus.k.>"),
        (b"a/b", b"sbus.k.a.b"),
        (b"a/", b"sbus.k.a.>"),
        (b"a/*/c/", b"sbus.k.a.*.c.>"),
        (b"*", b"sbus.k.*"),
        (b"ab*/x", b"sbus.k.*.x"),
        (b"a.b c", b"sbus.k.a%2Eb%20c"),
        (b"a//b", b"sbus.k.a.%.b"),
        (b"/", b"sbus.k.%.>"),
        (b"a*b", None),
        (b"!/cred/1/2/3/x/", b"sbus.c.%21.cred.1.2.3.x.>"),
    ],
)
def test_mapping_table(pattern: bytes, subscription: bytes | None) -> None:
    """The table in docs/nats.md."""
    assert M.subscription(pattern) == subscription


def test_keys_table() -> None:
    assert M.subject(b"") == b"sbus.k.%"
    assert M.subject(b"a/") == b"sbus.k.a.%"
    assert M.subject(b"*/>") == b"sbus.k.%2A.%3E"
    assert M.subject(b"\xff") == b"sbus.k.%FF"


@pytest.mark.parametrize(
    "subject",
    [b"other.k.a", b"sbus.k.a%", b"sbus.k.a%zz", b"sbus.k.%61", b"sbus.k.a b", b"sbus.c.a"],
)
def test_subjects_no_key_maps_to(subject: bytes) -> None:
    with pytest.raises(MappingError):
        M.key(subject)


@pytest.mark.parametrize(
    ("prefix", "ok"),
    [("sbus", True), ("a.b", True), ("", False), ("a..b", False), ("a.*", False), ("a b", False)],
)
def test_prefixes(prefix: str, ok: bool) -> None:
    assert (check_prefix(prefix) == "") is ok


bad_tokens = st.one_of(
    st.sampled_from([b"%zz", b"%2", b"%41", b"a/b", b"\xff", b"?", b"%", b"x%"]),
    st.binary(min_size=1, max_size=5).map(lambda b: b.replace(b".", b"-").replace(b" ", b"-")),
)


@settings(max_examples=1500, deadline=None)
@given(patterns, st.lists(st.one_of(odd_segments.map(encode_segment), bad_tokens), min_size=1,
                          max_size=5), st.booleans())  # fmt: skip
def test_a_subject_no_key_maps_to_is_matched_as_nats_matches_it(
    pattern: bytes, tokens: list[bytes], secret: bool
) -> None:
    """So that the one subscription that takes it can be found (and a bad
    message counted once, not once per subscription NATS gave it to)."""
    head = b"sbus.c.%21.cred.1.2.3." if secret else b"sbus.k."
    subject = head + b".".join(t if t else b"%" for t in tokens)
    sub = M.subscription(pattern)
    other = M.lenient_key(subject)
    if sub is None or other is None:
        return
    r = relaxed(pattern)
    assert r is not None
    assert nats_match(sub, subject) == bus_match(r, other), (sub, subject, other)
