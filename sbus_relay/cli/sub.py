"""Print messages: sbus-relay sub PATTERN... [--json] [--count N].

What it owns: the sub command: its arguments, its output lines and its exit
status.  What it may touch: the client library, stdout.

Like ``mosquitto_sub -t`` or ``nats sub``: one line per message, the key, a
tab and the payload, with backslash escapes for anything not printable so a
line is always one message.  ``--json`` prints one object per line instead:
``{"key": ..., "payload": ..., "encoding": "utf-8" | "base64"}``.

It asks the bus for packed batches (one packet carries many messages; a bus
that does not know them is detected and sends one by one), and follows the
bus across restarts: when it goes away, ``sub`` says so in one plain line on
stderr, connects again and subscribes again, and says when it is back
(``--no-reconnect``: it says it gives up and exits 1 instead).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import BinaryIO

from .notices import BusNotices
from .options import add_address_argument, bus_address, count

#: The command, at the start of each line it says on stderr.
PROG = "sbus-relay sub"

#: Seconds to wait for the whoami reply that confirms our subscriptions are in
#: place; a relay whose upstream is away answers late, and we still print.
READY_TIMEOUT = 5.0
_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """PATTERN..., --json, --count N, -v, -a ADDRESS."""
    add_address_argument(parser)
    parser.add_argument("patterns", metavar="PATTERN", nargs="+", help="routing key patterns")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("-n", "--count", type=count, metavar="N", help="exit after N messages")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="say (on stderr) when subscribed"
    )
    parser.add_argument(
        "--no-reconnect",
        action="store_true",
        help="exit 1 when the bus goes away instead of connecting again",
    )


def escape(data: bytes) -> str:
    """Printable text for ``data``: UTF-8 as is, everything else backslash-escaped.

    A lone backslash is doubled, so the output reads back unambiguously.
    """
    out = []
    for char in data.decode("utf-8", "surrogateescape"):
        code = ord(char)
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def as_json(key: bytes, payload: bytes) -> str:
    """One JSON line; the payload as text when it is UTF-8, else base64."""
    try:
        text, encoding = payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(payload).decode("ascii"), "base64"
    record = {
        "key": key.decode("utf-8", "backslashreplace"),
        "payload": text,
        "encoding": encoding,
    }
    return json.dumps(record, ensure_ascii=False)


def unescape(text: str) -> bytes:
    """The bytes ``escape`` printed as ``text`` (``pub --lines -`` reads them back)."""
    out = bytearray()
    i = 0
    named = {"\\": b"\\", "n": b"\n", "t": b"\t", "r": b"\r", "0": b"\0"}
    widths = {"x": 2, "u": 4, "U": 8}
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            out += char.encode("utf-8", "surrogateescape")
            i += 1
            continue
        kind = text[i + 1]
        if kind in named:
            out += named[kind]
            i += 2
        elif kind in widths and _is_hex(text[i + 2 : i + 2 + widths[kind]], widths[kind]):
            code = int(text[i + 2 : i + 2 + widths[kind]], 16)
            out += bytes([code]) if kind == "x" else chr(code).encode("utf-8", "surrogatepass")
            i += 2 + widths[kind]
        else:  # not an escape sub prints: the backslash as it is
            out += b"\\"
            i += 1
    return bytes(out)


def _is_hex(text: str, width: int) -> bool:
    return len(text) == width and all(c in "0123456789abcdefABCDEF" for c in text)


def run(args: argparse.Namespace) -> int:
    """Subscribe, then print messages until --count is reached or the bus closes."""
    from sbus_relay.client import Client
    from sbus_relay.ops.addresses import parse_address
    from sbus_relay.protocol.errors import AddressError, BusClosed

    address = parse_address(bus_address(args))
    notices = BusNotices(PROG, address, "connecting again until it answers, then subscribing again")
    out: BinaryIO = sys.stdout.buffer
    seen = 0
    try:
        with Client(
            address,
            batch=True,
            reconnect=not args.no_reconnect,
            on_disconnected=notices.away,
            on_reconnected=notices.back,
        ) as client:
            for pattern in args.patterns:
                client.subscribe(os.fsencode(pattern))
            try:
                # The server handles a client's packets in order, so the reply
                # means every SUB above is in place.
                client.whoami(timeout=READY_TIMEOUT)
                if args.verbose:
                    notices.say(f"subscribed to {' '.join(args.patterns)} at {address}")
            except TimeoutError:
                notices.say(
                    f"the bus has not confirmed the subscriptions within {READY_TIMEOUT:g} s"
                    " (a relay confirms once it reaches its upstream); printing what comes"
                )
            while True:
                message = client.receive()
                if message.control:
                    continue  # server notices are not messages
                if args.json:
                    line = as_json(message.key, message.payload)
                else:
                    line = escape(message.key) + "\t" + escape(message.payload)
                out.write(line.encode("utf-8", "surrogateescape") + b"\n")
                out.flush()
                seen += 1
                if args.count is not None and seen >= args.count:
                    return 0
    except AddressError as exc:
        notices.say(str(exc))  # no bus there
        return 1
    except BusClosed as exc:
        # It cut us off (and said why), or went away under --no-reconnect.
        notices.say(f"{exc}; giving up" + (" (--no-reconnect)" if args.no_reconnect else ""))
        return 1
    except BrokenPipeError:
        # The reader went away (| head): a normal end; keep Python's exit flush quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
