"""The envelope a bus puts on what it sends to NATS, and the counts it sends beside.  No I/O.

What it owns: the ``Sbus-Origin`` header's layout and the counts'
payload, both written and read.  What it may touch: nothing (pure functions).

Theory of operation (docs/nats.md, "Every loss seen").  Every message a bus
publishes carries one NATS header, ``Sbus-Origin: <host> <incarnation>
<seq>``: the host's name as a subject token (``natsmap.encode_segment``: no
spaces, plain ASCII), its link's incarnation (when that link started, in
nanoseconds, as in the interest announcements) and the message's sequence
number, one sequence per origin and incarnation, over every subject.  A
header, not the payload: a native NATS subscriber receives exactly the
payload that was published (docs/decisions.md says what a header costs).

Beside the data each bus publishes, per other host, how many of its messages
that host should have received (``<prefix>._s.<host>``): the payload is
``<incarnation> <view> <start> <count>`` (the receiving host's incarnation, the
sequence number of its interest announcement the count follows, the sequence
number where this count began and the count), and the header's ``<seq>`` is
the sender's last sequence number when it counted.

This module reads both, bounded: a value that is not exactly that shape,
too long, or with numbers out of range, reads as None (the caller counts it);
nothing here raises on what a peer sent.  Values are ``str`` (as nats-py hands
headers over); an engine that has bytes decodes them as ASCII first.
"""

from __future__ import annotations

from sbus_relay.accel import load_compiled

from .natsmap import MappingError, decode_token, encode_segment

#: The header's name.
HEADER = "Sbus-Origin"
#: Longest envelope value read: a host name of ``HOST_BYTES`` bytes, each
#: escaped (3 characters), and two numbers of ``DIGITS`` digits.
ENVELOPE_MAX = 3 * 255 + 2 * 19 + 2
#: Longest host name, in bytes of UTF-8 (a DNS name's limit).
HOST_BYTES = 255
#: Most digits of a number: every value below ``NUMBER_END`` fits.
DIGITS = 19
#: Numbers are below this: a number twice over still fits a signed 64-bit
#: integer (engines in C; the receiver orders a count just after its number).
NUMBER_END = 1 << 62
#: Longest count payload read: four numbers and three spaces.
COUNT_MAX = 4 * DIGITS + 3
_ZERO = 48  # ord("0")
_DIGITS = DIGITS  # (the compiled module's own copies, as C integers)
_END = NUMBER_END


def prefix(host: str, incarnation: int) -> str:
    """The constant part of one origin's envelope values: ``"<host> <incarnation> "``."""
    return "%s %d " % (encode_segment(host.encode("utf-8")).decode("ascii"), incarnation)


def _number(text: str) -> int:
    """``text`` as a number in range (ASCII digits only), or -1.  One pass
    over its characters: compiled, a loop in C on every message's way."""
    if not 0 < len(text) <= _DIGITS:
        return -1
    n = 0
    for ch in text:
        digit = ord(ch) - _ZERO
        if not 0 <= digit <= 9:
            return -1
        n = n * 10 + digit
    return n if n < _END else -1


def split(value: object) -> tuple[str, int] | None:
    """An envelope value as (origin, seq): origin is ``"<host> <incarnation>"``
    unchecked (``origin`` checks it, once per origin), seq 0 or more (0 only
    on a count sent before any message).  None if it is not an envelope."""
    if not isinstance(value, str) or len(value) > ENVELOPE_MAX:
        return None
    origin, space, seq_text = value.rpartition(" ")
    if not space or not origin:
        return None
    seq = _number(seq_text)
    if seq < 0:
        return None
    return origin, seq


def origin(text: str) -> tuple[str, int] | None:
    """``"<host> <incarnation>"`` as (host name, incarnation); None if malformed."""
    token, space, inc_text = text.partition(" ")
    incarnation = _number(inc_text)
    if not space or not token or incarnation < 0 or not token.isascii():
        return None
    try:
        raw = decode_token(token.encode("ascii"))
    except MappingError:
        return None
    if not raw or len(raw) > HOST_BYTES:
        return None
    try:
        return raw.decode("utf-8"), incarnation
    except UnicodeDecodeError:
        return None


#: A NATS header section that holds the envelope alone: how it is written,
#: and read back without parsing a general header section.
_BLOCK_HEAD = b"NATS/1.0\r\n" + HEADER.encode("ascii") + b": "
_BLOCK_TAIL = b"\r\n\r\n"
_BLOCK_MAX = len(_BLOCK_HEAD) + ENVELOPE_MAX + len(_BLOCK_TAIL)


def hpub(subject: bytes, value: str, payload: bytes) -> bytes:
    """A NATS ``HPUB`` of ``payload`` on ``subject`` with the envelope ``value``
    as its one header (the protocol's own form: ``HPUB <subject> <header
    bytes> <total bytes>``, the header section, the payload)."""
    block = _BLOCK_HEAD + value.encode("ascii") + _BLOCK_TAIL
    head = b"HPUB %s %d %d\r\n" % (subject, len(block), len(block) + len(payload))
    return b"".join((head, block, payload, b"\r\n"))


def from_block(raw: bytes) -> str | None:
    """The envelope of a header section that holds it alone (as ``hpub``
    writes it); None for any other section (read it the general way)."""
    if len(raw) > _BLOCK_MAX or not raw.startswith(_BLOCK_HEAD) or not raw.endswith(_BLOCK_TAIL):
        return None
    body = raw[len(_BLOCK_HEAD) : -len(_BLOCK_TAIL)]
    if b"\n" in body or b"\r" in body or not body.isascii():
        return None
    return body.decode("ascii")


def encode_count(incarnation: int, view: int, start: int, count: int) -> bytes:
    """A count's payload (see the module's theory)."""
    return b"%d %d %d %d" % (incarnation, view, start, count)


def decode_count(payload: bytes) -> tuple[int, int, int, int] | None:
    """A count's payload as (incarnation, view, start, count); None if malformed."""
    if len(payload) > COUNT_MAX or not payload.isascii():
        return None
    fields = payload.decode("ascii").split(" ")
    if len(fields) != 4:
        return None
    numbers = [_number(f) for f in fields]
    if min(numbers) < 0:
        return None
    return numbers[0], numbers[1], numbers[2], numbers[3]


__all__ = [
    "COUNT_MAX",
    "ENVELOPE_MAX",
    "HEADER",
    "decode_count",
    "encode_count",
    "from_block",
    "hpub",
    "origin",
    "prefix",
    "split",
]

load_compiled(globals(), "sbus_relay.protocol._c_natsenvelope")
