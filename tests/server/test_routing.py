"""Routing, subscriptions and echo against a real server process (docs/protocol.md).

Negative checks use a fence (``rawclient.fenced``) instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.server.rawclient import (
    FENCE,
    FENCE_PACKET,
    RawClient,
    fenced,
    publish_then_fence,
)

pytestmark = pytest.mark.timeout(30)


# --- routing ----------------------------------------------------------------------

ROUTES = [
    # The README's own examples (protocol.md "must hold").
    (b"a/*/c/", b"a/b/c/", True),
    (b"a/*/c/", b"a/b/c/d/e", True),
    (b"a/*/c/", b"a/b/c", False),
    (b"a/*/c/", b"a/c/d", False),
    # Exact keys.
    (b"a/b", b"a/b", True),
    (b"a/b", b"a/bc", False),
    (b"a/b", b"a/b/", False),
    (b"a/b", b"a", False),
    (b"a/b", b"x/a/b", False),
    # '*' is one segment, possibly empty.
    (b"*", b"abc", True),
    (b"*", b"", True),
    (b"*", b"a/b", False),
    (b"a/*", b"a/b", True),
    (b"a/*", b"a/", True),
    (b"a/*", b"a/b/c", False),
    (b"a/*", b"a", False),
    (b"a/*/c", b"a//c", True),
    (b"a/*/c", b"a/b/c", True),
    (b"a/*/c", b"a/b/d", False),
    (b"*/b", b"/b", True),
    (b"*/*/*", b"a/b/c", True),
    (b"*/*/*", b"a/b", False),
    (b"*/*/*", b"a/b/c/d", False),
    # A trailing '/' matches that '/' and anything after it.
    (b"a/", b"a/", True),
    (b"a/", b"a/b/c", True),
    (b"a/", b"a", False),
    (b"a/", b"ab/c", False),
    (b"a/", b"b/a/", False),
    (b"*/", b"x/y", True),
    (b"*/", b"/", True),
    (b"*/", b"x", False),
    # "" matches every key that is not secret.
    (b"", b"anything/at/all", True),
    (b"", b"", True),
    (b"", b"x", True),
    # Bytes beyond ASCII are ordinary.
    (b"\xff/*", b"\xff/\x01 \x80", True),
    (b"\xff/*", b"\xfe/x", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), ROUTES)
def test_routing_table(
    connect: Callable[[], RawClient], pattern: bytes, key: bytes, expected: bool
) -> None:
    sub, pub = connect(), connect()
    fenced(sub, pattern)
    sent = publish_then_fence(pub, key)
    first = sub.recv_packet()
    if expected:
        assert first == sent, f"{pattern!r} should match {key!r}"
        assert sub.recv_packet() == FENCE_PACKET
    else:
        assert first == FENCE_PACKET, f"{pattern!r} should not match {key!r}"


def test_sub_and_unsub_ignore_text_after_nul(connect: Callable[[], RawClient]) -> None:
    # protocol.md: "SUB <pattern>(\0.*)?" -- the part after the NUL is ignored.
    sub, pub = connect(), connect()
    sub.send(b"SUB t/x\0ignored junk")
    fenced(sub)
    sent = publish_then_fence(pub, b"t/x")
    assert sub.recv_packet() == sent
    assert sub.recv_packet() == FENCE_PACKET
    sub.send(b"UNSUB t/x\0more junk")
    sub.sync()
    publish_then_fence(pub, b"t/x")
    assert sub.recv_packet() == FENCE_PACKET


def test_duplicate_subscriptions_are_counted(connect: Callable[[], RawClient]) -> None:
    sub, pub = connect(), connect()
    fenced(sub, b"dup/x", b"dup/x")
    sub.unsub(b"dup/x")
    sent = publish_then_fence(pub, b"dup/x")
    assert sub.recv_packet() == sent, "one UNSUB of two SUBs must leave the client subscribed"
    assert sub.recv_packet() == FENCE_PACKET
    sub.unsub(b"dup/x")
    publish_then_fence(pub, b"dup/x")
    assert sub.recv_packet() == FENCE_PACKET, "the second UNSUB must unsubscribe"


def test_unsub_of_a_pattern_never_held_is_ignored(connect: Callable[[], RawClient]) -> None:
    # protocol.md: log, count, ignore -- the client is NOT disconnected.
    sub, pub = connect(), connect()
    fenced(sub, b"held/")
    sub.unsub(b"never/held")  # syncs: a disconnected client gets no whoami answer
    sub.unsub(b"held/x")  # not the same pattern as "held/"
    sent = publish_then_fence(pub, b"held/y")
    assert sub.recv_packet() == sent
    assert sub.recv_packet() == FENCE_PACKET


def test_one_copy_when_several_patterns_match(connect: Callable[[], RawClient]) -> None:
    sub, pub = connect(), connect()
    fenced(sub, b"m/n", b"m/n", b"m/*", b"m/", b"*/n", b"", b"*/*")
    sent = publish_then_fence(pub, b"m/n")
    assert sub.recv_packet() == sent
    assert sub.recv_packet() == FENCE_PACKET


def test_no_copy_to_clients_without_a_matching_pattern(connect: Callable[[], RawClient]) -> None:
    sub, pub, bystander = connect(), connect(), connect()
    fenced(sub, b"only/this")
    fenced(bystander, b"other/")
    publish_then_fence(pub, b"only/this")
    assert sub.recv_packet().startswith(b"MSG only/this\0")
    assert bystander.recv_packet() == FENCE_PACKET


# --- echo -----------------------------------------------------------------------


def test_echo_is_on_by_default_and_switchable(connect: Callable[[], RawClient]) -> None:
    me, other = connect(), connect()
    fenced(me, b"e/")
    other.sub(b"e/")
    # On by default: both get it.
    sent = me.pub(b"e/1", b"one")
    assert me.recv_packet() == sent
    assert other.recv_packet() == sent
    # Off: the others still get it, the publisher does not.
    me.cmsg(b"echo/off")
    me.sync()
    sent = me.pub(b"e/2", b"two")
    assert other.recv_packet() == sent
    other.pub(FENCE, b"end")  # published after e/2 was routed
    assert me.recv_packet() == FENCE_PACKET, "echo/off: publisher got its own message"
    # Others' messages on the same pattern still reach it.
    sent = other.pub(b"e/3", b"three")
    assert me.recv_packet() == sent
    assert other.recv_packet() == sent
    # On again.
    me.cmsg(b"echo/on", b"")
    me.sync()
    sent = me.pub(b"e/4", b"four")
    assert me.recv_packet() == sent
    assert other.recv_packet() == sent


def test_pattern_limit_per_client(connect: Callable[[], RawClient]) -> None:
    """limits.MAX_PATTERNS_PER_CLIENT bounds one client's memory: one more distinct
    pattern disconnects it; duplicates of a held pattern do not count."""
    from sbus_relay.protocol.limits import MAX_PATTERNS_PER_CLIENT

    greedy, other = connect(), connect()
    for i in range(MAX_PATTERNS_PER_CLIENT):
        greedy.send(b"SUB p/%d" % i)
    greedy.send(b"SUB p/0")  # a duplicate is fine
    greedy.sync(timeout=30)
    greedy.send(b"SUB one/too/many")
    assert greedy.expect_closed()[-1].startswith(b"CMSG disconnect\0too_many_patterns")
    other.sub(b"still")  # nobody else notices
    other.send(b"MSG still\0ok")
    assert other.recv_packet() == b"MSG still\0ok"
