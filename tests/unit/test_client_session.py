"""The client's sans-I/O core (client/session.py): tables, then hypothesis runs of
random operations against the packet grammar (docs/protocol.md, "Packets")."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sbus_relay.client.session import (
    Closing,
    Message,
    Ready,
    Session,
    State,
    WhoamiReply,
    encode_request,
    prefix_of,
    split_request,
)
from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import BufferFull, PeerError, UsageError
from sbus_relay.protocol.limits import BATCH_MESSAGES, MAX_PACKET

pytestmark = pytest.mark.timeout(120)

ME = b"!/cred/1/2/3"
ON_RELAY = b"!/cred/1/2/99/!/cred/1/2/3"
WHOAMI_REPLY = b"CMSG !/cred/whoami\0"


def handshake(session: Session, identity: bytes = ME, batch_answer: bool = False) -> list[bytes]:
    """Connect, answer the handshake; what went out, in order."""
    ready = session.connection_made()
    sent = session.outgoing()
    if ready is None:
        if batch_answer and session.batch:
            assert session.receive(b"CMSG batch/on\0") == []
        events = session.receive(WHOAMI_REPLY + identity)
        assert isinstance(events[0], Ready)
        sent += session.outgoing()
    return sent


def unpacked(packets: list[bytes]) -> list[bytes]:
    """Every packet as the grammar reads it: packed batches opened."""
    out: list[bytes] = []
    for packet in packets:
        assert 0 < len(packet) <= MAX_PACKET
        if packet.startswith(codec.BATCH_HEAD):
            inner = codec.unpack(packet)[0]
            assert 2 <= len(inner) <= BATCH_MESSAGES
            out += inner
        else:
            codec.decode(packet)  # raises on anything outside the grammar
            out.append(packet)
    return out


def test_first_handshake_sends_modes_and_subscriptions_and_is_ready_at_once() -> None:
    s = Session()
    s.subscribe("a/")
    s.set_echo(False)
    s.set_flood("blocking/hard/block")
    s.publish("k", "early")  # away: buffered
    assert s.buffered == 1
    ready = s.connection_made()
    assert ready is not None and s.state is State.READY
    assert s.outgoing() == [b"CMSG echo/off", b"CMSG blocking/hard/block", b"SUB a/"]
    assert s.holding  # what was buffered waits for the others to subscribe again
    s.publish("k", "later")  # joins it, in order
    s.release()
    assert s.outgoing() == [b"MSG k\0early", b"MSG k\0later"]
    s.publish("k", "now")
    assert s.outgoing() == [b"MSG k\0now"]


def test_batch_agreed_before_the_whoami_reply_packs_publishes() -> None:
    s = Session(batch=True)
    s.connection_made()
    assert s.outgoing() == [b"CMSG batch/on", b"CMSG !/cred/whoami"]
    assert s.receive(b"CMSG batch/on\0") == []
    [ready] = s.receive(WHOAMI_REPLY + ME)
    assert ready == Ready(ME, True, 0)
    s.publish_many([("k", "1"), ("k", "2"), ("k", "3")])
    [frame] = s.outgoing()
    assert codec.unpack(frame)[0] == [b"MSG k\x001", b"MSG k\x002", b"MSG k\x003"]


def test_a_bus_that_ignores_batch_on_is_detected() -> None:
    s = Session(batch=True)
    s.connection_made()
    s.outgoing()
    [ready] = s.receive(WHOAMI_REPLY + ME)  # the reference: no batch/on answer
    assert isinstance(ready, Ready) and not ready.batched and s.batch_refused
    s.publish_many([("k", "1"), ("k", "2")])
    assert s.outgoing() == [b"MSG k\x001", b"MSG k\x002"]


def test_secret_patterns_wait_for_the_identity_and_are_renamed() -> None:
    s = Session()
    s.subscribe(b"x/")
    s.connection_made()
    s.outgoing()
    s.ask_whoami()
    s.outgoing()
    assert s.receive(WHOAMI_REPLY + ME) == [WhoamiReply(ME)]
    s.subscribe(ME + b"/inbox/")
    assert s.outgoing() == [b"SUB " + ME + b"/inbox/"]
    s.connection_lost()
    sent = handshake(s, ON_RELAY)  # now behind a relay: a new prefix
    assert sent == [b"SUB x/", b"CMSG !/cred/whoami", b"SUB " + ON_RELAY + b"/inbox/"]
    assert s.identity == ON_RELAY and s.inbox() == ON_RELAY + b"/inbox/"
    # the relay restarts: its pid, so our prefix, changes
    s.connection_lost()
    s.connection_made()
    s.outgoing()
    [ready] = s.receive(WHOAMI_REPLY + b"!/cred/1/2/100/!/cred/1/2/3")
    assert isinstance(ready, Ready) and ready.renamed == 1
    assert s.outgoing() == [b"SUB !/cred/1/2/100/!/cred/1/2/3/inbox/"]


def test_secret_pattern_with_empty_fields_gets_the_new_prefix() -> None:
    s = Session()
    handshake(s, ON_RELAY)
    s.subscribe(b"!/cred/1/2/99/!/cred////mine")
    assert s.outgoing()[-1] == b"CMSG !/cred/whoami"  # to learn what it was made for
    assert s.receive(WHOAMI_REPLY + ON_RELAY) == []
    s.connection_lost()
    handshake(s, b"!/cred/1/2/7/!/cred/1/2/3")
    assert s.patterns == [b"!/cred/1/2/7/!/cred////mine"]
    assert prefix_of(ON_RELAY) == b"!/cred/1/2/99/" and prefix_of(ME) == b""


def test_buffer_is_bounded_and_overflow_is_an_error_that_keeps_the_rest() -> None:
    s = Session(buffer_messages=2, buffer_bytes=1000)
    s.publish("k", "1")
    s.publish("k", "2")
    with pytest.raises(BufferFull):
        s.publish("k", "3")
    with pytest.raises(BufferFull):
        s.publish_many([("k", "4")])
    assert s.buffered == 2
    small = Session(buffer_messages=10, buffer_bytes=12)
    small.publish("k", "1")  # 7 bytes
    with pytest.raises(BufferFull):
        small.publish("k", "123456")
    assert s.give_up() == 2 and s.unsent == 2


def test_lost_connection_keeps_what_the_socket_did_not_take() -> None:
    s = Session()
    handshake(s)
    s.publish("k", "1")
    s.publish("k", "2")
    taken = s.outgoing()
    s.put_back(taken[1:])  # the socket took the first only
    s.connection_lost()
    assert s.buffered == 1
    s.publish("k", "3")
    s.connection_made()
    s.release()
    assert s.outgoing()[-2:] == [b"MSG k\x002", b"MSG k\x003"]


def test_whoamis_the_caller_waits_for_are_asked_again_after_a_loss() -> None:
    s = Session()
    s.subscribe(b"!/cred////x")
    s.connection_made()
    s.outgoing()
    s.ask_whoami()
    s.outgoing()
    s.connection_lost()  # neither answered
    s.connection_made()
    assert s.outgoing().count(b"CMSG !/cred/whoami") == 1  # the handshake's
    assert isinstance(s.receive(WHOAMI_REPLY + ME)[0], Ready)
    # the caller's goes after the secret SUB: its answer still proves it in place
    assert s.outgoing() == [b"SUB !/cred////x", b"CMSG !/cred/whoami"]
    assert s.receive(WHOAMI_REPLY + ME) == [WhoamiReply(ME)]


def test_received_packets_mean_events() -> None:
    s = Session()
    handshake(s)
    assert s.receive(b"MSG a\0b") == [Message(False, b"a", b"b", b"MSG a\0b")]
    frame = codec.encode_batch([b"MSG a\x001", b"MSG b\x002"])
    assert [m.payload for m in s.receive(frame) if isinstance(m, Message)] == [b"1", b"2"]
    assert s.receive(b"CMSG disconnect\0slow_client: too slow") == [
        Closing("slow_client", "too slow")
    ]
    assert Closing("secret_refused", "").final and not Closing("server_stopping", "").final
    assert s.receive(b"CMSG drops/count\x005") == [
        Message(True, b"drops/count", b"5", b"CMSG drops/count\x005")
    ]
    for bad in (b"SUB x", b"UNSUB x", b"", b"HELLO", b"MSG nonul"):
        with pytest.raises(PeerError):
            s.receive(bad)


def test_misuse_is_a_usage_error() -> None:
    s = Session()
    with pytest.raises(UsageError):
        s.set_flood("blocking/soft/maybe")
    with pytest.raises(UsageError):
        s.publish("k", b"x" * MAX_PACKET)
    with pytest.raises(UsageError):
        s.subscribe(b"a\0b")
    with pytest.raises(UsageError):
        s.control("drops/count")  # not connected
    with pytest.raises(UsageError):
        s.inbox()  # no identity yet
    with pytest.raises(UsageError):
        split_request(b"no reply key")
    assert split_request(encode_request(b"r/1", b"a\0b")) == (b"r/1", b"a\0b")


# --- properties ---------------------------------------------------------------------

key = st.binary(min_size=0, max_size=12).filter(lambda b: b"\0" not in b)
secret = st.builds(lambda rest: ME + b"/" + rest, key)
pattern = st.one_of(key, secret)
operation = st.one_of(
    st.tuples(st.just("sub"), pattern),
    st.tuples(st.just("unsub"), pattern),
    st.tuples(st.just("pub"), key, st.binary(max_size=30)),
    st.tuples(st.just("many"), st.lists(st.tuples(key, st.binary(max_size=30)), max_size=300)),
    st.tuples(st.just("connect"), st.booleans()),
    st.tuples(st.just("lose"), st.integers(min_value=0, max_value=5)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("release")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=40), st.booleans())
# a packed run put back ahead of a lone publish: the lost connection kept the lone one first
@example(
    [("connect", True), ("many", [(b"", b""), (b"\x01", b"")]), ("sub", b""), ("pub", b"", b""),
     ("lose", 0)],
    True,
)  # fmt: skip
def test_what_goes_out_is_in_the_grammar_in_order_and_resubscribed(
    ops: list[tuple[object, ...]], batch: bool
) -> None:
    """Whatever the caller does and however connections come and go: every packet
    sent is a legal packet; the publishes reach the wire in the order made, none
    twice, none lost unless still buffered; after each handshake the bus holds
    exactly the caller's subscriptions."""
    s = Session(batch=batch, buffer_messages=10_000, buffer_bytes=10_000_000)
    published: list[bytes] = []
    wire: list[bytes] = []  # MSGs the bus took, in order
    held: Counter[bytes] = Counter()  # what the bus holds on this connection

    def send(packets: list[bytes]) -> None:
        for packet in unpacked(packets):
            if packet.startswith(b"MSG "):
                wire.append(packet)
            elif packet.startswith(b"SUB "):
                held[packet[4:]] += 1
            elif packet.startswith(b"UNSUB ") and held[packet[6:]]:
                held[packet[6:]] -= 1

    for op in ops:
        name = op[0]
        if name == "sub":
            s.subscribe(op[1])  # type: ignore[arg-type]
        elif name == "unsub":
            s.unsubscribe(op[1])  # type: ignore[arg-type]
        elif name == "pub":
            s.publish(op[1], op[2])  # type: ignore[arg-type]
            published.append(codec.encode_msg(op[1], op[2]))  # type: ignore[arg-type]
        elif name == "many":
            items = op[1]
            s.publish_many(items)  # type: ignore[arg-type]
            published += [codec.encode_msg(k, p) for k, p in items]  # type: ignore[attr-defined]
        elif name == "connect" and s.state is State.DISCONNECTED:
            held.clear()
            send(handshake(s, batch_answer=bool(op[1])))
        elif name == "release":
            s.release()
            send(s.outgoing())
        elif name == "lose" and s.state is not State.DISCONNECTED:
            out = s.outgoing()
            cut = min(int(op[1]), len(out))  # type: ignore[call-overload]
            send(out[:cut])
            s.put_back(out[cut:])
            s.connection_lost()
        else:
            send(s.outgoing())
        if s.state is State.READY and s.pending_output == 0:
            assert +held == Counter(s.patterns)
    s.connection_lost()
    buffered = list(s._buffer)
    assert wire + buffered == published


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_from_the_bus_raise_only_peer_error(packet: bytes) -> None:
    s = Session(batch=True)
    s.connection_made()
    try:
        events = s.receive(packet)
    except PeerError:
        return
    assert all(isinstance(e, Message | WhoamiReply | Ready | Closing) for e in events)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(key, st.binary(max_size=2000)), min_size=1, max_size=700))
def test_packed_batches_unpack_to_the_messages_in_order(items: list[tuple[bytes, bytes]]) -> None:
    packets = [codec.encode_msg(k, p) for k, p in items]
    frames, counts = codec.pack(packets)
    assert sum(counts) == len(packets)
    assert unpacked(frames) == packets
    s = Session()
    s.connection_made()
    got = [e for f in frames for e in s.receive(f)]
    assert [(m.key, m.payload) for m in got if isinstance(m, Message)] == items


# --- what both faces share: outages, back-off, requests ------------------------------


def test_outages_note_a_loss_and_keep_it_once_ready_again() -> None:
    from sbus_relay.client.session import Outage, Outages

    downs: list[str] = []
    ups: list[Outage] = []
    outages = Outages(downs.append, ups.append)
    outages.ready(Ready(ME, False, 0), 1.0)  # the first connection: no outage
    assert ups == [] and outages.history == []
    outages.lost("", 10.0)  # the bus said nothing
    outages.ready(Ready(ME, False, 2), 10.5)
    assert downs == ["closed"]
    assert ups == outages.history == [Outage("closed", 0.5, 2)]
    outages.ready(Ready(ME, False, 0), 11.0)  # a handshake with no outage before it
    assert len(outages.history) == 1


def test_backoff_doubles_to_its_cap_and_starts_over_once_connected() -> None:
    from sbus_relay.client.session import Backoff
    from sbus_relay.protocol.limits import CLIENT_RECONNECT_MAX, CLIENT_RECONNECT_MIN

    backoff = Backoff()
    waits = [backoff.failed(0.0) for _ in range(10)]
    assert waits[0] == CLIENT_RECONNECT_MIN and waits[1] == 2 * CLIENT_RECONNECT_MIN
    assert max(waits) == waits[-1] == CLIENT_RECONNECT_MAX
    assert backoff.next_try == CLIENT_RECONNECT_MAX
    backoff.lost()
    assert backoff.next_try == 0.0 and backoff.delay == CLIENT_RECONNECT_MAX
    backoff.connected()
    assert backoff.failed(5.0) == CLIENT_RECONNECT_MIN


def test_each_request_has_a_reply_key_of_its_own() -> None:
    from sbus_relay.client.session import Requests

    requests = Requests()
    first, payload = requests.new(ME + b"/inbox/", "ask")
    second, _ = requests.new(ME + b"/inbox/", b"")
    assert first != second and first.startswith(ME + b"/inbox/")
    asked = Message(False, b"service", payload, b"")
    assert Requests.reply_key(asked) == first
    with pytest.raises(UsageError):
        Requests.reply_key(Message(False, b"k", b"no reply key", b""))


def test_a_closing_notice_is_the_error_the_caller_gets() -> None:
    error = Closing("slow_client", "blocking/hard/error").error()
    assert error.reason == "slow_client" and str(error).endswith("slow_client: blocking/hard/error")
