"""The drop query (``CMSG drops/count``): a client learns how many of its messages the bus dropped.

Every message published to a stalled subscriber is either delivered to it or
counted in its reply, whatever the flood-control mode: the accounting is exact.
"""

from __future__ import annotations

import pytest

from sbus_relay.client import Client
from tests.support import BusProcess

pytestmark = pytest.mark.timeout(60)

#: Seconds any single receive may take.
WAIT = 10.0
#: Messages published at the stalled subscriber: 24 MB, more than a socket buffer
#: and the server's default hard limit (16 MiB) together hold.
FLOOD = 12_000
#: Payload size of the flood.
PAYLOAD = 2000


def drops_reply(client: Client) -> tuple[int, int]:
    """Ask, then read up to the reply: (messages received before it, the count)."""
    client.control(b"drops/count")
    received = 0
    while True:
        message = client.receive(WAIT)
        if message.control and message.key == b"drops/count":
            return received, int(message.payload)
        if not message.control:
            received += 1


@pytest.mark.parametrize(
    "modes",
    [
        ["blocking/soft/discard"],
        ["blocking/hard/discard"],
    ],
)
def test_every_message_is_delivered_or_counted(sbusd: BusProcess, modes: list[str]) -> None:
    with Client(sbusd.address, timeout=WAIT) as slow, Client(sbusd.address, timeout=WAIT) as pub:
        for mode in modes:
            slow.flood(mode)
        slow.subscribe("flood/")
        slow.whoami()
        assert drops_reply(slow) == (0, 0)
        for i in range(FLOOD):
            pub.publish(f"flood/{i}", b"x" * PAYLOAD)
        pub.whoami()  # a round trip: the server has routed every message above
        received, dropped = drops_reply(slow)
        assert dropped > 0, "the flood should have overflowed the subscriber"
        assert received + dropped == FLOOD
        # The count is cumulative: asking again adds nothing new.
        assert drops_reply(slow) == (0, dropped)


def test_drops_are_per_connection(sbusd: BusProcess) -> None:
    with (
        Client(sbusd.address, timeout=WAIT) as slow,
        Client(sbusd.address, timeout=WAIT) as fast,
        Client(sbusd.address, timeout=WAIT) as pub,
    ):
        slow.flood("blocking/soft/discard")
        slow.subscribe("flood/")
        slow.whoami()
        for i in range(FLOOD):
            pub.publish(f"flood/{i}", b"x" * PAYLOAD)
        pub.whoami()
        assert drops_reply(fast) == (0, 0)
        assert drops_reply(slow)[1] > 0
