"""The control messages' payloads (``protocol.control``): each writer read back
by its reader, through the codec, as a peer would receive it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbus_relay.protocol import codec, control
from sbus_relay.protocol.limits import UPGRADE_CHUNK

pytestmark = pytest.mark.timeout(60)


def decoded(packet: bytes) -> codec.Control:
    event = codec.decode(packet)
    assert isinstance(event, codec.Control)
    return event


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=":"), min_size=1
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
)
def test_a_disconnect_notice_reads_back_as_its_reason_and_detail(reason: str, detail: str) -> None:
    event = decoded(control.disconnect(reason, detail))
    assert event.key == control.DISCONNECT
    assert control.parse_disconnect(event.payload) == (reason, detail)


def test_a_notice_without_detail_has_none() -> None:
    assert control.disconnect("closed") == b"CMSG disconnect\0closed"
    assert control.parse_disconnect(b"slow_client: blocking/hard/error") == (
        "slow_client",
        "blocking/hard/error",
    )
    assert control.parse_disconnect(None) == ("", "")


def test_the_drop_count_reads_back() -> None:
    event = decoded(control.drops_count(12))
    assert event.key == control.DROPS_COUNT
    assert control.parse_drops_count(event.payload) == 12
    assert control.parse_drops_count(b"many") is None
    assert control.parse_drops_count(None) is None


def test_the_upgrade_exchange_reads_back() -> None:
    taking = codec.Control(control.TAKE_OVER, control.TAKES_NATS_LINK)
    assert decoded(control.TAKE_OVER_PACKET) == taking
    assert decoded(control.upgrade_state(b"{}")) == codec.Control(control.UPGRADE_STATE, b"{}")
    part = control.upgrade_part(b"\0" * 10)
    assert decoded(part) == codec.Control(control.UPGRADE_PART, b"\0" * 10)
    assert len(control.upgrade_part(bytes(UPGRADE_CHUNK))) == control.UPGRADE_LONGEST
    assert decoded(control.UPGRADE_DONE_PACKET).key == control.UPGRADE_DONE
    assert decoded(control.upgrade_refused("no")) == codec.Control(control.UPGRADE_REFUSED, b"no")


def test_identity_and_interest_packets() -> None:
    assert decoded(control.identity_changed(b"!/cred/1/2/3")).payload == b"!/cred/1/2/3"
    assert decoded(control.relay_name("edge")) == codec.Control(control.RELAY_NAME, b"edge")
    assert decoded(control.interest(b"a/", True)) == codec.Control(control.INTEREST_ADD, b"a/")
    assert decoded(control.interest(b"a/", False)).key == control.INTEREST_REMOVE
    assert decoded(control.INTEREST_READY_PACKET) == codec.Control(control.INTEREST_READY, b"")
