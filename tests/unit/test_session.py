"""A connection's protocol state without a socket (``protocol.session``): what
every packet kind does in every state, in tables, and in any order (hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sbus_relay.protocol import codec, session
from sbus_relay.protocol.errors import PeerError, UsageError
from sbus_relay.protocol.flood import HARD_MODES, ORDERS, SOFT_MODES
from sbus_relay.protocol.keys import WHOAMI

pytestmark = pytest.mark.timeout(120)

# --- the bus's side of a client -----------------------------------------------------

#: packet -> the action ``receive`` returns from a fresh session (no state change asked)
ACTIONS: list[tuple[bytes, Any]] = [
    (b"SUB a/b", codec.Subscribe(b"a/b")),
    (b"UNSUB a/b\0x", codec.Unsubscribe(b"a/b")),
    (b"MSG k\0v", codec.Publish(b"k", b"v", b"MSG k\0v")),
    (codec.encode_batch([b"MSG k\0v"]), session.Batch([b"MSG k\0v"], [b"k"])),
    (b"CMSG " + WHOAMI, session.WHOAMI_ASKED),
    (b"CMSG upgrade/take-over", session.TAKE_OVER),  # an older process: the sockets alone
    (b"CMSG upgrade/take-over\0nats-link/1", session.TakeOver(b"nats-link/1")),
    (b"CMSG drops/count", session.DROPS_COUNT),
    (b"CMSG blocking/soft/block", session.SetFlood("soft", "block")),
    (b"CMSG blocking/hard/error", session.SetFlood("hard", "error")),
    (b"CMSG order/stack", session.SetFlood("order", "stack")),
    (b"CMSG blocking/soft/nonsense", None),  # unknown values are ignored
    (b"CMSG some/thing\0x", None),  # so are unknown control messages
    (b"CMSG relay/name\0edge-1", session.NameRelay(None, "edge-1")),  # not a relay yet
]


@pytest.mark.parametrize(("packet", "action"), ACTIONS)
def test_what_each_packet_asks(packet: bytes, action: Any) -> None:
    s = session.Session()
    assert s.receive(packet) == action
    assert (s.echo, s.relay, s.interest, s.packs, s.follows) == (True, False, False, False, False)


@pytest.mark.parametrize(
    ("what", "value"),
    [("soft", m) for m in SOFT_MODES] + [("hard", m) for m in HARD_MODES]
    + [("order", o) for o in ORDERS],
)  # fmt: skip
def test_every_flood_control_mode_is_asked_for(what: str, value: str) -> None:
    key = b"order/" if what == "order" else b"blocking/" + what.encode() + b"/"
    assert session.Session().receive(b"CMSG " + key + value.encode()) == session.SetFlood(
        what, value
    )


def test_echo_off_and_on() -> None:
    s = session.Session()
    assert s.receive(b"CMSG echo/off") is None and not s.echo
    assert s.receive(b"CMSG echo/on") is None and s.echo
    assert not session.Session(upward=True).echo  # the link never hears itself


def test_interest_makes_a_relay_once_and_listens_until_off() -> None:
    s = session.Session()
    assert s.receive(b"CMSG interest/off") is None  # not listening: nothing to undo
    assert s.receive(b"CMSG interest/on") == session.Listen(True)
    assert s.relay and s.interest
    assert s.receive(b"CMSG interest/on") == session.Listen(False)  # a relay already
    assert s.receive(b"CMSG interest/off") == session.UNLISTEN
    assert s.relay and not s.interest
    assert s.receive(b"CMSG interest/off") is None
    assert s.receive(b"CMSG interest/on") == session.Listen(False)


@pytest.mark.parametrize(
    ("raw", "name"),
    [(b"edge-1", "edge-1"), (b"", None), (b"bad name", None), (b"local", None), (b"x" * 65, None)],
)
def test_a_relay_is_named_with_a_usable_name_only(raw: bytes, name: str | None) -> None:
    s = session.Session()
    s.receive(b"CMSG interest/on")
    action = s.receive(b"CMSG relay/name\0" + raw)
    assert action == session.NameRelay(name, raw[:64].decode())


def test_batch_on_makes_it_read_packed_batches() -> None:
    s = session.Session()
    assert s.receive(b"CMSG batch/on") == session.BATCH_ON
    assert s.packs


def test_identity_follow_makes_it_take_a_new_identity_in_place() -> None:
    s = session.Session()
    s.receive(b"CMSG interest/on")
    assert s.renamed(b"!/cred/1/2/3") is None  # an older relay: it is to be closed
    assert s.receive(b"CMSG identity/follow") is None  # a state change, nothing to do
    assert s.follows
    assert s.renamed(b"!/cred/1/2/3") == b"CMSG identity/changed\0!/cred/1/2/3"
    assert s.receive(b"CMSG identity/follow\0whatever") is None and s.follows


@pytest.mark.parametrize("packet", [b"", b"PUB x", b"MSG k", b"sub x", b"CMSG batch\0\0"])
def test_bad_bytes_are_the_peers_error(packet: bytes) -> None:
    with pytest.raises(PeerError) as info:
        session.Session().receive(packet)
    assert info.value.reason == "protocol_error"


def test_closing_happens_once_and_then_no_packet_is_taken() -> None:
    s = session.Session()
    assert s.end("slow_client")
    assert not s.alive and s.ended == "slow_client"
    assert not s.end("closed")  # the first reason stays
    assert s.ended == "slow_client"
    with pytest.raises(UsageError):
        s.receive(b"SUB a")


@pytest.mark.parametrize(
    ("reason", "detail", "told"),
    [
        ("slow_client", "hard/error", b"CMSG disconnect\0slow_client: hard/error"),
        ("protocol_error", "", b"CMSG disconnect\0protocol_error"),
        ("closed", "", None),  # its peer closed: nobody to tell
    ],
)
def test_the_disconnect_notice(reason: str, detail: str, told: bytes | None) -> None:
    assert session.Session().notice(reason, detail) == told
    assert session.Session(upward=True).notice(reason, detail) is None  # the link is not told


PACKETS = st.sampled_from(
    [p for p, _ in ACTIONS]
    + [
        b"CMSG echo/off",
        b"CMSG echo/on",
        b"CMSG interest/on",
        b"CMSG interest/off",
        b"CMSG batch/on",
        b"CMSG relay/name\0r1",
        b"CMSG identity/follow",
    ]
) | st.binary(max_size=30)


class SessionMachine(RuleBasedStateMachine):
    """Any packets, in any order, closing at any point: the session's state is
    always what a plain model of the table says, and nothing but ``PeerError``
    (bad bytes) or ``UsageError`` (a packet after closing) is raised."""

    def __init__(self) -> None:
        super().__init__()
        self.s = session.Session()
        self.model = {
            "echo": True,
            "relay": False,
            "interest": False,
            "packs": False,
            "follows": False,
        }
        self.open = True

    @precondition(lambda self: self.open)
    @rule(packet=PACKETS)
    def receive(self, packet: bytes) -> None:
        m = self.model
        try:
            action = self.s.receive(packet)
        except PeerError as e:
            assert e.reason == "protocol_error"
            return
        head, _, payload = packet.partition(b"\0")
        if head == b"CMSG echo/off":
            m["echo"] = False
        elif head == b"CMSG echo/on":
            m["echo"] = True
        elif head == b"CMSG interest/on":
            assert action == session.Listen(not m["relay"])
            m["relay"] = m["interest"] = True
        elif head == b"CMSG interest/off":
            assert action == (session.UNLISTEN if m["interest"] else None)
            m["interest"] = False
        elif head == b"CMSG batch/on":
            m["packs"] = True
        elif head == b"CMSG identity/follow":
            assert action is None
            m["follows"] = True
        elif head == b"CMSG relay/name":
            assert isinstance(action, session.NameRelay)
            assert (action.name is not None) == (m["relay"] and payload in (b"r1", b"edge-1"))

    @precondition(lambda self: self.open)
    @rule(reason=st.sampled_from(["closed", "slow_client", "protocol_error"]))
    def close(self, reason: str) -> None:
        assert self.s.end(reason)
        self.open = False

    @precondition(lambda self: not self.open)
    @rule(packet=PACKETS)
    def after_closing(self, packet: bytes) -> None:
        with pytest.raises(UsageError):
            self.s.receive(packet)
        assert not self.s.end("closed")

    @invariant()
    def state_is_the_models(self) -> None:
        s = self.s
        state = {"echo": s.echo, "relay": s.relay, "interest": s.interest, "packs": s.packs}
        assert {**state, "follows": s.follows} == self.model
        assert (s.renamed(b"id") is not None) == s.follows
        assert s.alive == self.open


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


# --- a relay's side of its link -----------------------------------------------------


def test_the_handshake_waits_on_whoami_then_is_ready() -> None:
    link = session.LinkSession()
    assert link.receive(b"CMSG " + WHOAMI + b"\0!/cred/1/2/3") is None  # not connected
    hello = link.hello("edge")
    assert hello == (*session.HELLO, b"CMSG relay/name\0edge")
    assert b"CMSG identity/follow" in hello  # it takes a new identity in place
    assert link.connected and not link.ready  # waiting on whoami
    assert link.receive(b"CMSG " + WHOAMI + b"\0!/cred/1/2/3") == session.Identity(b"!/cred/1/2/3")
    assert not link.ready and link.identity == b"!/cred/1/2/3"
    link.synced()  # the relay took its prefix and sent its patterns
    assert link.ready
    assert link.receive(b"CMSG " + WHOAMI + b"\0!/cred/9/9/9") is None  # one answer counts


def test_a_reply_that_begins_with_our_own_identity_is_a_cycle() -> None:
    link = session.LinkSession()
    link.hello("edge")
    link.receive(b"CMSG " + WHOAMI + b"\0!/cred/1/2/3")
    link.synced()
    link.lost()
    assert link.identity == b"!/cred/1/2/3" and not link.connected
    link.hello("edge")
    chained = b"!/cred/1/2/3/!/cred/4/5/6"
    assert link.receive(b"CMSG " + WHOAMI + b"\0" + chained) == session.Cycle(chained)
    assert not link.ready
    # a restarted upstream gives another identity: that is no cycle
    assert link.receive(b"CMSG " + WHOAMI + b"\0!/cred/1/2/4") == session.Identity(b"!/cred/1/2/4")


def test_a_new_identity_told_in_place() -> None:
    link = session.LinkSession()
    link.hello("edge")
    changed = b"CMSG identity/changed\0"
    assert link.receive(changed + b"!/cred/1/2/9") is None  # whoami not answered: it will say
    link.receive(b"CMSG " + WHOAMI + b"\0!/cred/1/2/3")
    link.synced()
    assert link.receive(changed + b"!/cred/1/2/3") is None  # the one we have: no news
    assert link.receive(changed + b"!/cred/1/2/4") == session.Renamed(b"!/cred/1/2/4")
    assert link.identity == b"!/cred/1/2/4" and link.ready  # on the link we have
    chained = b"!/cred/1/2/4/!/cred/5/5/5"
    assert link.receive(changed + chained) == session.Cycle(chained)
    assert link.identity == b"!/cred/1/2/4"


def test_secret_patterns_of_an_old_identity_are_neither_sent_nor_unsubscribed() -> None:
    link = session.LinkSession()
    link.hello("edge")
    link.receive(b"CMSG " + WHOAMI + b"\0!/cred/1/2/3")
    # a relay below still holds its patterns under our old identity (1/2/2)
    stale = b"!/cred/1/2/2/!/cred/4/4/4/x"
    local = [b"a/b", b"!/cred/1/2/3/!/cred/4/4/4/y", stale]
    assert link.to_sync(local) == [b"a/b", b"!/cred/1/2/3/!/cred/4/4/4/y"]
    assert link.unsent == {stale}
    link.synced()
    assert not link.unsubscribes(stale)  # renamed below: the upstream never had it
    assert link.unsent == set()
    assert link.unsubscribes(stale)  # (held again since, and sent: a plain UNSUB)
    assert link.unsubscribes(b"a/b")
    link.lost()
    assert not link.unsubscribes(b"a/b")  # down: the next sync sends the whole set


def test_the_upstreams_interest_and_its_other_notices() -> None:
    link = session.LinkSession()
    link.hello("edge")
    assert link.receive(b"CMSG interest/add\0a/#") == session.UpstreamInterest(b"a/#", True)
    assert link.receive(b"CMSG interest/ready\0") == session.InterestReady(True)
    assert link.receive(b"CMSG interest/ready\0") == session.InterestReady(False)
    assert link.receive(b"CMSG interest/remove\0a/#") == session.UpstreamInterest(b"a/#", False)
    assert link.interest_count == 0 and link.interest_complete
    assert link.receive(b"CMSG batch/on\0") == session.BATCH_ON
    assert link.receive(b"CMSG disconnect\0too_many_clients") == session.Disconnected(
        "too_many_clients"
    )
    assert link.receive(b"SUB x") is None  # a server sends only MSG and CMSG
    assert link.receive(b"CMSG what/ever") is None
    link.lost()
    assert link.interest_count == 0 and not link.interest_complete


LINK_PACKETS = st.sampled_from(
    [
        b"CMSG interest/add\0p",
        b"CMSG interest/remove\0p",
        b"CMSG interest/ready\0",
        b"CMSG " + WHOAMI + b"\0!/cred/1/2/3",
        b"CMSG " + WHOAMI + b"\0!/cred/1/2/3/!/cred/7/7/7",
        b"CMSG identity/changed\0!/cred/1/2/4",
        b"CMSG identity/changed\0!/cred/1/2/3/!/cred/7/7/7",
        b"CMSG batch/on\0",
        b"CMSG disconnect\0x",
        b"MSG k\0v",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(LINK_PACKETS, st.sampled_from(["hello", "lost"])), max_size=40))
def test_the_link_in_any_order(steps: list[Any]) -> None:
    """Whatever comes in whatever order: ready only after a hello and a
    whoami, the interest count is adds minus removes since the last loss,
    and only the first ready after a loss is news."""
    link = session.LinkSession()
    adds = 0
    complete = False
    for step in steps:
        if step == "hello":
            link.hello("edge")
            continue
        if step == "lost":
            link.lost()
            adds, complete = 0, False
            continue
        was_ready = link.ready
        action = link.receive(step)
        if step.startswith(b"CMSG interest/add"):
            adds += 1
        elif step.startswith(b"CMSG interest/remove"):
            adds -= 1
        elif step.startswith(b"CMSG interest/ready"):
            assert action == session.InterestReady(not complete)
            complete = True
        elif isinstance(action, session.Identity):
            assert link.connected and not was_ready and link.identity == action.reply
            link.synced()
        elif isinstance(action, session.Renamed):
            assert was_ready and link.identity == action.reply  # only on a link that works
        assert link.interest_count == adds and link.interest_complete == complete
        assert not link.ready or link.connected
