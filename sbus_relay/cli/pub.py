"""Publish one message: sbus-relay pub KEY [PAYLOAD | -].

Like ``mosquitto_pub -t KEY -m PAYLOAD`` or ``nats pub KEY PAYLOAD``.  ``-``
reads the payload from stdin (bytes, unchanged); no payload is an empty one.
It exits 0 only once the bus has taken the message: after the MSG it asks
whoami, and as the server handles a client's packets in order, the reply
proves the MSG was accepted.  A refusal exits 1 with the server's reason.
"""

from __future__ import annotations

import argparse
import os
import sys

from .options import add_address_argument, bus_address

#: Seconds to wait for the bus to confirm it took the message.  A relay
#: answers only once its upstream has told it who it is, so this is generous.
CONFIRM_TIMEOUT = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """KEY, optional PAYLOAD (or - for stdin), -a ADDRESS."""
    add_address_argument(parser)
    parser.add_argument("key", metavar="KEY", help="routing key")
    parser.add_argument(
        "payload", metavar="PAYLOAD", nargs="?", default="", help="payload; - reads stdin"
    )


def run(args: argparse.Namespace) -> int:
    """Connect, publish, wait for the bus to confirm, close."""
    from sbus_relay.client import Client
    from sbus_relay.ops.addresses import parse_address
    from sbus_relay.protocol.errors import AddressError, BusClosed, UsageError
    from sbus_relay.protocol.keys import valid_key
    from sbus_relay.protocol.limits import MAX_PACKET

    address = parse_address(bus_address(args))  # a malformed address: usage error (2)
    key = os.fsencode(args.key)
    if not valid_key(key):
        # The bus would take it and drop it (reserved_key): say so instead.
        raise UsageError(
            f"key {args.key!r} uses the reserved '!' segment, which only secret "
            "keys (!/cred/<gid>/<uid>/<pid>/...) may; the bus would drop it"
        )

    if args.payload == "-":
        # Read one byte more than fits in a packet, so that too much input is
        # an error rather than a silently truncated message (docs/protocol.md, Packets).
        payload = sys.stdin.buffer.read(MAX_PACKET + 1)
    else:
        payload = os.fsencode(args.payload)
    try:
        with Client(address, timeout=CONFIRM_TIMEOUT) as client:
            client.publish(key, payload)
            client.whoami()
    except TimeoutError:
        print(
            f"sbus-relay pub: the bus did not confirm the message within {CONFIRM_TIMEOUT:g} s"
            " (a relay confirms only once it has reached its upstream)",
            file=sys.stderr,
        )
        return 1
    except (AddressError, BusClosed, UsageError) as exc:
        # No bus there, the bus went away, or the message is too large.
        print(f"sbus-relay pub: {exc}", file=sys.stderr)
        return 1
    return 0
