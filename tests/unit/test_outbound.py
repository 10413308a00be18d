"""Flood-control decisions and queue orders (SPEC §4), without a server."""

from __future__ import annotations

import pytest

from sbus_relay.protocol.flood import Action, OutboundQueue, parse_flood_control

pytestmark = pytest.mark.timeout(30)


def drain(q: OutboundQueue) -> list[bytes]:
    out = []
    while q.count:
        out.append(q.peek()[0])
        q.pop()
    return out


@pytest.mark.parametrize(
    ("soft", "hard", "full", "action"),
    [
        ("queue", "discard", False, Action.QUEUE),
        ("queue", "discard", True, Action.DROP_HARD),
        ("queue", "block", True, Action.QUEUE_AND_WAIT_BELOW),
        ("queue", "error", True, Action.DISCONNECT),
        ("discard", "discard", False, Action.DROP_SOFT),
        ("error", "discard", False, Action.DISCONNECT),
        ("block", "discard", False, Action.QUEUE_AND_WAIT_EMPTY),
        ("block", "discard", True, Action.DROP_HARD),
    ],
)
def test_decide(soft: str, hard: str, full: bool, action: Action) -> None:
    q = OutboundQueue(max_bytes=1000, max_messages=2)
    q.soft, q.hard = soft, hard
    if full:
        q.push(b"a", 0.0)
        q.push(b"b", 0.0)
    assert q.decide() is action


def test_orders() -> None:
    q = OutboundQueue(10**6, 10**6)
    packets = [b"x" * n for n in (3, 1, 4, 1, 5)]
    for p in packets:
        q.push(p, 0.0)
    assert drain(q) == packets
    q.set_order("stack")
    for p in packets:
        q.push(p, 0.0)
    assert drain(q) == packets[::-1]
    q.set_order("random")
    for p in packets:
        q.push(p, 0.0)
    assert [len(p) for p in drain(q)] == [5, 4, 3, 1, 1]
    assert q.nbytes == 0


def test_set_order_keeps_contents() -> None:
    q = OutboundQueue(10**6, 10**6)
    for p in (b"aa", b"b", b"ccc"):
        q.push(p, 0.0)
    q.set_order("random")
    q.set_order("stack")
    assert drain(q) == [b"ccc", b"b", b"aa"]


def test_limits_in_bytes_and_messages() -> None:
    q = OutboundQueue(max_bytes=10, max_messages=100)
    q.push(b"x" * 10, 0.0)
    assert q.over_limit()
    assert q.clear() == 1 and not q.over_limit()


def test_parse_flood_control() -> None:
    assert parse_flood_control(b"blocking/soft/discard") == ("soft", "discard")
    assert parse_flood_control(b"blocking/hard/block") == ("hard", "block")
    assert parse_flood_control(b"order/random") == ("order", "random")
    assert parse_flood_control(b"blocking/soft/queue") == ("soft", "queue")
    assert parse_flood_control(b"blocking/soft/nonsense") is None
    assert parse_flood_control(b"echo/off") is None
