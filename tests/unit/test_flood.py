"""Every flood-control decision (protocol.flood), table-driven, without a server."""

from __future__ import annotations

import itertools

import pytest

from sbus_relay.protocol import flood
from sbus_relay.protocol.flood import (
    REPLY_SLACK,
    Action,
    OutboundQueue,
    decide,
    decide_reply,
    parse_flood_control,
    shedding_ends,
    still_blocked,
)
from sbus_relay.protocol.quota import Account, Quota

pytestmark = pytest.mark.timeout(30)

LIMIT = 2


def drain(q: OutboundQueue) -> list[bytes]:
    """Everything queued, in sending order, two at a time with one put back
    each round (a socket that takes half of what it is offered)."""
    out: list[bytes] = []
    while q.count:
        packets, times = q.take(2)
        out.append(packets[0])
        q.put_back(packets[1:], times[1:])
    return out


def queue(soft: str = "queue", hard: str = "discard", queued: int = 0) -> OutboundQueue:
    q = OutboundQueue(max_bytes=1000, max_messages=LIMIT)
    q.soft, q.hard = soft, hard
    for i in range(queued):
        q.push(b"%d" % i, 0.0)
    return q


#: (soft mode, hard mode, over the hard limit?) -> the action: the whole policy.
DECISIONS = {
    ("queue", "discard", False): Action.QUEUE,
    ("queue", "block", False): Action.QUEUE,
    ("queue", "error", False): Action.QUEUE,
    ("queue", "discard", True): Action.DROP_HARD,
    ("queue", "block", True): Action.QUEUE_AND_WAIT_BELOW,
    ("queue", "error", True): Action.DISCONNECT,
    ("block", "discard", False): Action.QUEUE_AND_WAIT_EMPTY,
    ("block", "block", False): Action.QUEUE_AND_WAIT_EMPTY,
    ("block", "error", False): Action.QUEUE_AND_WAIT_EMPTY,
    ("block", "discard", True): Action.DROP_HARD,
    ("block", "block", True): Action.QUEUE_AND_WAIT_BELOW,
    ("block", "error", True): Action.DISCONNECT,
    ("discard", "discard", False): Action.DROP_SOFT,
    ("discard", "block", False): Action.DROP_SOFT,
    ("discard", "error", False): Action.DROP_SOFT,
    ("discard", "discard", True): Action.DROP_SOFT,
    ("discard", "block", True): Action.DROP_SOFT,
    ("discard", "error", True): Action.DROP_SOFT,
    ("error", "discard", False): Action.DISCONNECT,
    ("error", "block", False): Action.DISCONNECT,
    ("error", "error", False): Action.DISCONNECT,
    ("error", "discard", True): Action.DISCONNECT,
    ("error", "block", True): Action.DISCONNECT,
    ("error", "error", True): Action.DISCONNECT,
}


def test_the_table_covers_every_mode_pair() -> None:
    assert set(DECISIONS) == set(
        itertools.product(flood.SOFT_MODES, flood.HARD_MODES, (False, True))
    )


@pytest.mark.parametrize(("modes", "action"), DECISIONS.items(), ids=str)
def test_decide(modes: tuple[str, str, bool], action: Action) -> None:
    soft, hard, full = modes
    assert decide(queue(soft, hard, LIMIT if full else 0)) is action


@pytest.mark.parametrize(
    ("action", "queued", "blocked"),
    [
        (Action.QUEUE_AND_WAIT_EMPTY, 1, True),  # soft/block: until the socket took it all
        (Action.QUEUE_AND_WAIT_EMPTY, 0, False),
        (Action.QUEUE_AND_WAIT_BELOW, LIMIT, True),  # hard/block: until below the limit
        (Action.QUEUE_AND_WAIT_BELOW, LIMIT - 1, False),
    ],
)
def test_still_blocked(action: Action, queued: int, blocked: bool) -> None:
    assert still_blocked(action, queue(queued=queued)) is blocked


@pytest.mark.parametrize(
    ("reason", "soft", "queued", "ends"),
    [
        ("soft_discard", "discard", 0, True),  # the socket drained
        ("soft_discard", "discard", 1, False),  # (queued before the mode changed)
        ("soft_discard", "queue", 1, True),  # the mode changed away from discard
        ("hard_discard", "queue", LIMIT, False),  # still at the hard limit
        ("hard_discard", "queue", LIMIT - 1, True),
    ],
)
def test_shedding_ends(reason: str, soft: str, queued: int, ends: bool) -> None:
    assert shedding_ends(reason, queue(soft, queued=queued)) is ends


def test_blocking_set() -> None:
    assert {Action.QUEUE_AND_WAIT_EMPTY, Action.QUEUE_AND_WAIT_BELOW} == flood.BLOCKING


@pytest.mark.parametrize("hard", flood.HARD_MODES)
def test_replies_queue_past_the_limit_within_a_slack_and_never_disconnect(hard: str) -> None:
    q = queue(hard=hard, queued=LIMIT)
    assert decide_reply(q) is Action.QUEUE
    for i in range(REPLY_SLACK - 1):
        q.push(b"r%d" % i, 0.0)
    assert decide_reply(q) is Action.QUEUE
    q.push(b"last", 0.0)
    assert decide_reply(q) is Action.DROP_HARD


@pytest.mark.parametrize(
    ("count", "size", "action"),
    [
        (0, 1, Action.QUEUE),
        (9, 11, Action.QUEUE),
        (10, 1, Action.DROP_UPWARD),  # message bound
        (1, 100, Action.DROP_UPWARD),  # byte bound
    ],
)
def test_the_upward_queue_drops_past_its_bound(count: int, size: int, action: Action) -> None:
    """A relay's queue for its upstream: queued within the bound, else dropped
    (never a block, never a disconnect: the local bus never waits for it)."""
    q = OutboundQueue(max_bytes=100, max_messages=10, upward=True)
    for _ in range(count):
        q.push(b"x" * size, 0.0)
    assert decide(q) is action
    if action is Action.DROP_UPWARD:
        assert not shedding_ends(action.value, q)


def test_a_users_queued_bytes_count_against_every_one_of_its_queues() -> None:
    account = Account(Quota(queued_bytes=10))
    a = OutboundQueue(max_bytes=1000, max_messages=100, account=account)
    b = OutboundQueue(max_bytes=1000, max_messages=100, account=account)
    a.push(b"x" * 10, 0.0)
    assert b.count == 0 and b.over_limit()  # the user's share is used up by a
    assert decide(b) is Action.DROP_HARD
    a.take(1)
    assert not b.over_limit() and account.nbytes == 0
    b.push(b"yy", 0.0)
    assert b.clear() == 1 and account.nbytes == 0


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


@pytest.mark.parametrize("order", flood.ORDERS)
def test_take_and_put_back_keep_order_and_sums(order: str) -> None:
    q = OutboundQueue(10**6, 10**6)
    q.set_order(order)
    for i, n in enumerate((3, 1, 4, 1, 5, 9, 2, 6)):
        q.push(b"%d" % i * n, float(i))
    whole = drain_copy(q)
    packets, times = q.take(5)
    assert packets == whole[:5] and q.count == 3
    q.put_back(packets[2:], times[2:])  # the socket took two
    assert q.count == 6 and q.nbytes == sum(map(len, whole[2:]))
    assert drain(q) == whole[2:]
    assert q.nbytes == 0 and q.account.nbytes == 0


def drain_copy(q: OutboundQueue) -> list[bytes]:
    """The sending order, leaving the queue as it was."""
    packets, times = q.take(q.count)
    q.put_back(packets, times)
    return packets


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


@pytest.mark.parametrize("order", ["queue", "stack"])
def test_a_long_queue_drained_in_small_bites_keeps_order(order: str) -> None:
    """Thousands queued, sent a few at a time with some put back: the sent head
    is cut off along the way, and nothing is lost, doubled or reordered."""
    q = OutboundQueue(10**9, 10**9)
    q.set_order(order)
    packets = [b"p%d" % i for i in range(5000)]
    for i, p in enumerate(packets):
        q.push(p, float(i))
    sent: list[bytes] = []
    while q.count:
        got, times = q.take(7)
        assert [float(p[1:]) for p in got] == times
        sent += got[:3]
        q.put_back(got[3:], times[3:])
    assert sent == (packets if order == "queue" else packets[::-1])
    assert q.nbytes == 0 and q.account.nbytes == 0
