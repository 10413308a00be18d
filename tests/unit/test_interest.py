"""The interest extension's bookkeeping (docs/protocol.md): others' patterns only."""

from __future__ import annotations

import pytest

from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.interest import ADD, REMOVE, InterestTracker

pytestmark = pytest.mark.timeout(30)


def change(ix: SubscriptionIndex, tr: InterestTracker[str], who: str, p: bytes, add: bool):
    before = tr.before(p)
    (ix.add if add else ix.remove)(who, p)
    return list(tr.after(p, before))


def test_listener_never_sees_its_own_patterns() -> None:
    ix: SubscriptionIndex = SubscriptionIndex()
    tr = InterestTracker(ix)
    tr.listeners["relay"] = None
    assert change(ix, tr, "relay", b"x", True) == []
    assert change(ix, tr, "alice", b"x", True) == [("relay", ADD, b"x")]
    assert change(ix, tr, "bob", b"x", True) == []  # already visible
    assert change(ix, tr, "alice", b"x", False) == []
    assert change(ix, tr, "bob", b"x", False) == [("relay", REMOVE, b"x")]
    assert tr.snapshot("relay") == []


def test_two_relays_see_each_other() -> None:
    ix: SubscriptionIndex = SubscriptionIndex()
    tr = InterestTracker(ix)
    tr.listeners["a"] = None
    tr.listeners["b"] = None
    assert change(ix, tr, "a", b"p", True) == [("b", ADD, b"p")]
    assert change(ix, tr, "b", b"p", True) == [("a", ADD, b"p")]
    assert tr.snapshot("a") == [b"p"] and tr.snapshot("b") == [b"p"]


def test_upstream_interest_is_readvertised() -> None:
    """On a relay the upstream link holds what the upstream wants: one more
    holder, so our own relays hear of it like of any other client's pattern."""
    ix: SubscriptionIndex = SubscriptionIndex()
    ix.quiet = "up"
    tr = InterestTracker(ix)
    tr.listeners["sub"] = None
    assert change(ix, tr, "up", b"u", True) == [("sub", ADD, b"u")]
    assert tr.snapshot("sub") == [b"u"]
    ix.add("sub", b"u")
    assert change(ix, tr, "up", b"u", False) == [("sub", REMOVE, b"u")]
