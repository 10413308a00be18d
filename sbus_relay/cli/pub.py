"""Publish one message: sbus-relay pub KEY [PAYLOAD | -].

Like ``mosquitto_pub -t KEY -m PAYLOAD`` or ``nats pub KEY PAYLOAD``.  ``-``
reads the payload from stdin (bytes, unchanged).  A forgotten payload is
refused with a hint; an empty message is asked for with ``-n`` (as
``mosquitto_pub -n``) or an explicit ``''``.
It exits 0 only once the bus has taken the message: after the MSG it asks
whoami, and as the server handles a client's packets in order, the reply
proves the MSG was accepted.  A refusal exits 1 with the server's reason.

``--lines KEY`` publishes every line of stdin (without its newline) as one
message to KEY; ``--lines -`` reads lines as ``sub`` prints them, ``KEY``, a
tab, ``PAYLOAD`` with ``sub``'s backslash escapes, so ``sub ... | pub --lines -``
replays traffic.  Lines that are ready together go together, packed into
batches when the bus knows them; at the end of input it confirms as above.
A bad line exits 1 naming its number, the lines before it sent and confirmed.
While the bus is away (restarted) lines wait in the client's bounded buffer;
it says so on stderr, and when the bus is back.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from typing import TYPE_CHECKING, TextIO

from sbus_relay.protocol.limits import MAX_PACKET

from .notices import BusNotices
from .options import add_address_argument, bus_address

if TYPE_CHECKING:
    from sbus_relay.ops.addresses import Address

#: Seconds to wait for the bus to confirm it took the message.  A relay
#: answers only once its upstream has told it who it is, so this is generous.
CONFIRM_TIMEOUT = 10.0


#: Lines gathered into one publish_many at most: a packed batch's worth.
LINES_AT_ONCE = 256
#: Bytes of one line read at most: a longer one cannot be a message (it is
#: refused, naming its number), and is never held whole.
LINE_LIMIT = MAX_PACKET + 2
#: Bytes of stdin read at once for --lines.
READ_CHUNK = 1 << 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """KEY, optional PAYLOAD (or - for stdin), or --lines KEY|-; -a ADDRESS."""
    add_address_argument(parser)
    parser.add_argument("key", metavar="KEY", nargs="?", help="routing key")
    parser.add_argument("payload", metavar="PAYLOAD", nargs="?", help="payload; - reads stdin")
    parser.add_argument(
        "-n",
        "--null-message",
        action="store_true",
        help="publish an empty payload (as an explicit '' does)",
    )
    parser.add_argument(
        "--lines",
        metavar="KEY|-",
        help="publish each line of stdin to KEY; with -, each line is KEY<tab>PAYLOAD"
        " as sub prints it",
    )


def run(args: argparse.Namespace) -> int:
    """Connect, publish, wait for the bus to confirm, close."""
    from sbus_relay.client import Client
    from sbus_relay.ops.addresses import parse_address
    from sbus_relay.protocol.errors import AddressError, BusClosed, UsageError
    from sbus_relay.protocol.keys import valid_key
    from sbus_relay.protocol.limits import MAX_PACKET

    address = parse_address(bus_address(args))  # a malformed address: usage error (2)
    if args.lines is not None:
        if args.key is not None:
            raise UsageError("--lines takes its key as its own value: pub --lines KEY|-")
        if args.null_message:
            raise UsageError("-n publishes one empty message; --lines publishes stdin's lines")
        return _lines(address, args.lines)
    if args.key is None:
        raise UsageError("a KEY to publish to is needed (or --lines KEY|-)")
    payload_text = _payload_argument(args)
    key = os.fsencode(args.key)
    if not valid_key(key):
        # The bus would take it and drop it (reserved_key): say so instead.
        raise UsageError(
            f"key {args.key!r} uses the reserved '!' segment, which only secret "
            "keys (!/cred/<gid>/<uid>/<pid>/...) may; the bus would drop it"
        )

    if payload_text == "-":
        _check_stdin("a payload of -")
        # Read one byte more than fits in a packet, so that too much input is
        # an error rather than a silently truncated message (docs/protocol.md, Packets).
        payload = sys.stdin.buffer.read(MAX_PACKET + 1)
    else:
        payload = os.fsencode(payload_text)
    try:
        with Client(address, timeout=CONFIRM_TIMEOUT, reconnect=False) as client:
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


def _payload_argument(args: argparse.Namespace) -> str:
    """The PAYLOAD argument, "" for ``-n``; a forgotten one is a UsageError
    (publishing an empty message by mistake would exit 0 and say nothing)."""
    from sbus_relay.protocol.errors import UsageError

    if args.null_message:
        if args.payload is not None:
            raise UsageError("-n publishes an empty payload: give no PAYLOAD with it")
        return ""
    if args.payload is None:
        raise UsageError(
            f"no payload for {args.key!r}: give one (pub KEY PAYLOAD), - to read it"
            " from stdin, or -n for an empty message"
        )
    return str(args.payload)


def _lines(address: Address, target: str) -> int:
    """``--lines KEY|-``: publish stdin's lines, gathered, then confirm."""
    from sbus_relay.client import Client
    from sbus_relay.protocol.errors import AddressError, BufferFull, BusClosed, UsageError

    fixed = None if target == "-" else _checked_key(target)
    stdin = _StdinLines(_check_stdin("--lines").fileno())
    number = 0
    bad: UsageError | None = None
    notices = BusNotices("sbus-relay pub", address, "lines wait until it answers")
    try:
        with Client(
            address,
            timeout=CONFIRM_TIMEOUT,
            batch=True,
            on_disconnected=notices.away,
            on_reconnected=notices.back,
        ) as client:
            while bad is None:
                lines = _ready_lines(stdin)
                if not lines:
                    break
                items = []
                for line in lines:
                    number += 1
                    try:
                        items.append(_item(line, fixed, number))
                    except UsageError as exc:
                        bad = exc  # the lines before it still go, confirmed
                        break
                client.publish_many(items)
            client.whoami()
        if bad is not None:
            raise bad
    except TimeoutError:
        print(
            f"sbus-relay pub: the bus did not confirm the messages within {CONFIRM_TIMEOUT:g} s",
            file=sys.stderr,
        )
        return 1
    except (AddressError, BusClosed, BufferFull, UsageError) as exc:
        where = f"line {number}: " if isinstance(exc, UsageError) and number else ""
        print(f"sbus-relay pub: {where}{exc}", file=sys.stderr)
        return 1
    return 0


class _StdinLines:
    """stdin's lines, read with ``os.read`` into a buffer of our own: whether a
    whole line can be had without waiting is then known.  (A ``BufferedReader``
    cannot say so: its ``peek`` waits for input when its buffer is empty, and
    so held each line typed until the next one came.)"""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()  # under LINE_LIMIT + READ_CHUNK bytes
        self._ended = False

    def _whole(self) -> bool:
        """A line (or LINE_LIMIT bytes of one, or the end) is buffered."""
        return (
            self._ended
            or len(self._buffer) >= LINE_LIMIT
            or self._buffer.find(b"\n", 0, LINE_LIMIT) >= 0
        )

    def _fill(self) -> None:
        chunk = os.read(self._fd, READ_CHUNK)
        self._buffer += chunk
        self._ended = not chunk

    def readline(self) -> bytes:
        """The next line with its newline (at most LINE_LIMIT bytes); b"" at the end."""
        while not self._whole():
            self._fill()
        newline = self._buffer.find(b"\n", 0, LINE_LIMIT)
        size = newline + 1 if newline >= 0 else min(len(self._buffer), LINE_LIMIT)
        line = bytes(self._buffer[:size])
        del self._buffer[:size]
        return line

    def ready(self) -> bool:
        """A whole line can be read without waiting."""
        if self._whole():
            return True
        try:
            readable, _, _ = select.select([self._fd], [], [], 0)
        except (OSError, ValueError):
            return False
        if readable:
            self._fill()  # readable: one read does not wait
        return self._whole()


def _check_stdin(what: str) -> TextIO:
    """stdin, for ``what`` to read; a UsageError when it is closed (``<&-``)."""
    from sbus_relay.protocol.errors import UsageError

    if sys.stdin is None:
        raise UsageError(f"{what} reads stdin, which is closed")
    return sys.stdin


def _ready_lines(stdin: _StdinLines) -> list[bytes]:
    """The next line, and those already waiting behind it (up to LINES_AT_ONCE);
    empty at the end of input."""
    first = stdin.readline()
    if not first:
        return []
    lines = [first]
    while len(lines) < LINES_AT_ONCE and stdin.ready():
        line = stdin.readline()
        if not line:
            break
        lines.append(line)
    return lines


def _item(line: bytes, key: bytes | None, number: int) -> tuple[bytes, bytes]:
    from sbus_relay.protocol.errors import UsageError

    from .sub import unescape

    line = line.removesuffix(b"\n").removesuffix(b"\r")
    if key is not None:
        return _fits(key, line)
    text = line.decode("utf-8", "surrogateescape")
    raw_key, tab, payload = text.partition("\t")
    if not tab:
        raise UsageError("with --lines -, each line is KEY<tab>PAYLOAD; this one has no tab")
    return _fits(_checked_key(os.fsdecode(unescape(raw_key))), unescape(payload))


def _fits(key: bytes, payload: bytes) -> tuple[bytes, bytes]:
    from sbus_relay.protocol.errors import UsageError

    size = len(b"MSG ") + len(key) + 1 + len(payload)
    if size > MAX_PACKET:
        raise UsageError(f"a message of {size} bytes is over the {MAX_PACKET}-byte packet limit")
    return key, payload


def _checked_key(text: str) -> bytes:
    from sbus_relay.protocol.errors import UsageError
    from sbus_relay.protocol.keys import valid_key

    key = os.fsencode(text)
    if not valid_key(key):
        raise UsageError(
            f"key {text!r} uses the reserved '!' segment, which only secret "
            "keys (!/cred/<gid>/<uid>/<pid>/...) may; the bus would drop it"
        )
    return key
