"""The control packets between a bus and its NATS link process.  No I/O.

What it owns: how the bus and its link process (docs/nats.md, "How it is
built") say anything to each other beyond the sbus packets they exchange
(``MSG`` and packed batches, ``SUB``/``UNSUB``, built and parsed by
``codec`` and ``frames``).  What it may touch: nothing (pure functions).

bus -> link
    ``CMSG link/hello\\0<json>``     first: the link's settings (``Hello``)
    ``CMSG interest/ready\\0``       after the local patterns: answer ``synced``
                                    once the NATS server has them all
    (EOF)                           stop: say goodbye on NATS and exit

link -> bus
    ``CMSG nats/settled\\0``         the other hosts' interest is known
    ``CMSG link/synced\\0``          the server has every pattern sent before
                                    ``interest/ready`` (never after a failed flush)
    ``CMSG link/stats\\0<bytes>``    its counters, periodically and on a change
                                    of state (``Stats``, packed: ``encode_stats``)
    ``CMSG link/log\\0<json>``       one log record, for the bus to write where it logs

The hand-over of a running link to a new link process (a live upgrade: docs/nats.md,
"How it is built"), which the bus orchestrates between its two links:

    bus -> old link   ``CMSG link/export\\0<token>``   a hand-over begins: answer ``link/state``
    old link -> bus   ``CMSG link/state\\0<part>``...  what a new link subscribes to (a record)
    bus -> new link   ``link/hello`` (``adopt``), then that ``link/state`` as it came
    new link -> bus   ``CMSG link/holding\\0<server>``  subscribed, holding what comes, its
                                                marker (the token) published after them
    bus -> old link   ``CMSG link/cut\\0``             the last packet: publish what came before,
                                                confirm, wait for the marker, then leave NATS
    old link -> bus   ``CMSG link/final\\0<part>``...  after its last message: its whole state
    bus -> new link   that ``link/final`` as it came, then what the old link would have had
    new link -> bus   ``CMSG link/took-over\\0<json>``  it serves (what it held, what it let pass)

A record (``encode_record``) is JSON in parts of at most ``RECORD_PART`` bytes,
each ``+`` (more follow) or ``.`` (the last) then its bytes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, fields
from typing import Any

from . import codec, frames
from .errors import PeerError

HELLO = b"link/hello"
READY = b"interest/ready"
SETTLED = b"nats/settled"
SYNCED = b"link/synced"
STATS = b"link/stats"
LOG = b"link/log"
# a link's hand-over to a new link process (the module's doc)
EXPORT = b"link/export"
STATE = b"link/state"
HOLDING = b"link/holding"
CUT = b"link/cut"
FINAL = b"link/final"
TOOK_OVER = b"link/took-over"
#: Bytes of a record in one packet (well within MAX_PACKET).
RECORD_PART = 256 * 1024
#: Largest record read: every bounded store of a link (its other hosts'
#: patterns above all: 2,097,152 of them, 256 MiB) as JSON, with room to spare.
RECORD_MAX = 1 << 30
#: A record part's first byte: more parts follow, or this one is the last.
PART_MORE = b"+"
PART_LAST = b"."

#: Why a message did not cross, in the order the stats packet carries them.
DROP_REASONS = (
    "not_exported",  # the key matches no ``export`` pattern
    "not_imported",  # a key from another host matches no ``import`` pattern
    "secret",  # an identity (!/cred/) key: never crosses
    "bus_full",  # the bus did not read what came from NATS fast enough
    "nats_refused",  # the NATS client refused a publish (its reconnect buffer full, too large)
    "bad_subject",  # a message on a subject no key maps to
    "too_large",  # a message from NATS too large for an sbus packet (MAX_PACKET)
)
# Not drops, in ``Stats.fleet`` (docs/nats.md, "Who counts what"): what the
# NATS client dropped of a slow subscription (the receivers count those of
# other hosts as lost), and what a server that went away never confirmed (at
# most lost: an upper bound the receivers' counts settle).
#: The link's states, in the order the stats packet numbers them.
STATES = ("starting", "connecting", "connected", "reconnecting", "closed")
#: Longest text field of a stats packet (the server's address, the engine's name).
TEXT_MAX = 255


@dataclass
class Hello:
    """What a link process needs to join NATS for its bus (``ops.natsconfig``'s
    settings as plain data, and the host's name)."""

    host: str
    servers: list[str]
    subject_prefix: str = "sbus"
    export: list[bytes] = field(default_factory=lambda: [b""])
    import_: list[bytes] = field(default_factory=lambda: [b""])
    #: keys published whether or not another host wants them (native subscribers)
    publish: list[bytes] = field(default_factory=list)
    identities: bool = False
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey: str | None = None
    tls_ca: str | None = None
    #: "auto" (nats.c where it is built, else nats-py), "nats.c" or "nats-py"
    engine: str = "auto"
    #: the lowest level of the records the link sends (the bus sends "debug":
    #: its own logger, at the level its config says now, decides what is written)
    log_level: str = "info"
    #: a live upgrade's new link: a ``link/state`` record follows, the old link's
    adopt: bool = False
    #: try the servers in the order given (a cut's new link: the old link's first)
    ordered: bool = False


def encode_hello(hello: Hello) -> bytes:
    """``CMSG link/hello\\0<json>`` (patterns as latin-1 text: any byte but NUL)."""
    doc: dict[str, Any] = {}
    for f in fields(hello):
        value = getattr(hello, f.name)
        if f.name in ("export", "import_", "publish"):
            value = [p.decode("latin-1") for p in value]
        doc[f.name] = value
    return codec.encode_cmsg(HELLO, json.dumps(doc).encode())


def decode_hello(payload: bytes) -> Hello:
    """The settings a ``link/hello`` carries; ``PeerError`` if they are not."""
    try:
        doc = json.loads(payload)
        for name in ("export", "import_", "publish"):
            doc[name] = [p.encode("latin-1") for p in doc.get(name, [])]
        return Hello(**doc)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise PeerError("protocol_error", f"bad link/hello: {e}") from None


@dataclass
class Stats:
    """The link's counters, as ``/clients``, ``/metrics``, ``/healthz`` and ``top`` show them."""

    state: str = "starting"
    connected: bool = False
    server: str = ""
    engine: str = ""
    sent: int = 0
    sent_bytes: int = 0
    received: int = 0
    received_bytes: int = 0
    reconnects: int = 0
    unconfirmed: int = 0
    to_bus_queued: int = 0
    subscriptions: int = 0
    remote_hosts: int = 0
    remote_patterns: int = 0
    rtt_us: int = 0
    settled: bool = False
    drops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    #: what came from each other host, and the link's other counts of the
    #: fleet (``link.bridge.Bridge.stats``): plain JSON values
    fleet: dict[str, Any] = field(default_factory=dict)


_COUNTS = (
    "sent",
    "sent_bytes",
    "received",
    "received_bytes",
    "reconnects",
    "unconfirmed",
    "to_bus_queued",
    "subscriptions",
    "remote_hosts",
    "remote_patterns",
    "rtt_us",
)
#: state, flags (connected, settled), then the counters and the drops: all u64
_FIXED = struct.Struct(">BB%dQ" % (len(_COUNTS) + len(DROP_REASONS)))


def encode_stats(s: Stats) -> bytes:
    """``CMSG link/stats\\0`` + the fixed part + ``server\\0engine[\\0<fleet JSON>]``."""
    flags = (1 if s.connected else 0) | (2 if s.settled else 0)
    counts = [getattr(s, name) for name in _COUNTS] + [s.drops[r] for r in DROP_REASONS]
    text = s.server.encode()[:TEXT_MAX] + b"\0" + s.engine.encode()[:TEXT_MAX]
    if s.fleet:
        text += b"\0" + json.dumps(s.fleet, separators=(",", ":")).encode()
    return codec.encode_cmsg(STATS, _FIXED.pack(STATES.index(s.state), flags, *counts) + text)


def decode_stats(payload: bytes) -> Stats:
    """The counters a ``link/stats`` carries; ``PeerError`` if it is malformed."""
    if len(payload) < _FIXED.size:
        raise PeerError("protocol_error", "link/stats cut short")
    state, flags, *counts = _FIXED.unpack_from(payload)
    server, nul, rest = payload[_FIXED.size :].partition(b"\0")
    engine, more, fleet_json = rest.partition(b"\0")
    if state >= len(STATES) or not nul:
        raise PeerError("protocol_error", "malformed link/stats")
    fleet: Any = {}
    if more:
        try:
            fleet = json.loads(fleet_json)
        except ValueError:
            raise PeerError("protocol_error", "malformed link/stats") from None
        if not isinstance(fleet, dict):
            raise PeerError("protocol_error", "malformed link/stats")
    s = Stats(
        state=STATES[state],
        connected=bool(flags & 1),
        settled=bool(flags & 2),
        server=server.decode("utf-8", "replace"),
        engine=engine.decode("utf-8", "replace"),
        fleet=fleet,
    )
    for name, value in zip(_COUNTS, counts, strict=False):
        setattr(s, name, value)
    s.drops = dict(zip(DROP_REASONS, counts[len(_COUNTS) :], strict=True))
    return s


def encode_log(level: str, event: str, fields_: dict[str, Any]) -> bytes:
    """``CMSG link/log\\0<json>``: one record the bus logs as its own (values that
    JSON cannot carry are written as their ``repr``)."""
    doc = {"level": level, "event": event, "fields": fields_}
    return codec.encode_cmsg(LOG, json.dumps(doc, default=repr).encode())


def decode_log(payload: bytes) -> tuple[str, str, dict[str, Any]]:
    """(level, event, fields) of a ``link/log``; ``PeerError`` if it is not one."""
    try:
        doc = json.loads(payload)
        level, event, extra = doc["level"], doc["event"], doc["fields"]
    except (ValueError, TypeError, KeyError) as e:
        raise PeerError("protocol_error", f"bad link/log: {e}") from None
    if not isinstance(level, str) or not isinstance(event, str) or not isinstance(extra, dict):
        raise PeerError("protocol_error", "bad link/log")
    return level, event, extra


def control(packet: bytes) -> tuple[bytes, bytes] | None:
    """(key, payload) of a ``CMSG`` between bus and link, or None for any other packet."""
    event = codec.decode(packet)
    if isinstance(event, codec.Control):
        return event.key, event.payload or b""
    return None


SETTLED_PACKET = codec.encode_cmsg(SETTLED, b"")
SYNCED_PACKET = codec.encode_cmsg(SYNCED, b"")
CUT_PACKET = codec.encode_cmsg(CUT, b"")


def encode_export(token: str) -> bytes:
    """``CMSG link/export\\0<token>``: the hand-over whose marker carries ``token``."""
    return codec.encode_cmsg(EXPORT, token.encode("ascii"))


def encode_holding(server: str) -> bytes:
    """``CMSG link/holding\\0<server>``: the new link holds what comes, on ``server``."""
    return codec.encode_cmsg(HOLDING, server.encode("utf-8", "replace")[:TEXT_MAX])


def encode_took_over(figures: dict[str, Any]) -> bytes:
    """``CMSG link/took-over\\0<json>``: the new link serves; what it held, let through."""
    return codec.encode_cmsg(TOOK_OVER, json.dumps(figures).encode())


def decode_took_over(payload: bytes) -> dict[str, Any]:
    """The figures of a ``link/took-over``; ``PeerError`` if it is not one."""
    try:
        doc = json.loads(payload)
    except ValueError:
        raise PeerError("protocol_error", "malformed link/took-over") from None
    if not isinstance(doc, dict):
        raise PeerError("protocol_error", "malformed link/took-over")
    return doc


def encode_record(key: bytes, doc: dict[str, Any]) -> list[bytes]:
    """``doc`` as the packets of a record under ``key`` (``STATE``, ``FINAL``)."""
    data = json.dumps(doc, separators=(",", ":")).encode()
    chunks = [data[i : i + RECORD_PART] for i in range(0, len(data), RECORD_PART)] or [b""]
    last = len(chunks) - 1
    flags = [PART_LAST if i == last else PART_MORE for i in range(len(chunks))]
    return [codec.encode_cmsg(key, f + c) for f, c in zip(flags, chunks, strict=True)]


def last_part(payload: bytes) -> bool:
    """Whether a record's part (its packet's payload) is its last."""
    return payload[:1] == PART_LAST


class Record:
    """A record's parts as they come (``add``), then the whole."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def add(self, payload: bytes) -> dict[str, Any] | None:
        """One part's payload; the record once its last part came (else None).
        ``PeerError`` if it is malformed."""
        flag, chunk = payload[:1], payload[1:]
        if flag not in (PART_MORE, PART_LAST):
            raise PeerError("protocol_error", "malformed link record")
        self._size += len(chunk)
        if self._size > RECORD_MAX:
            raise PeerError("protocol_error", "link record too large")
        self._parts.append(chunk)
        if flag == PART_MORE:
            return None
        data, self._parts, self._size = b"".join(self._parts), [], 0
        try:
            doc = json.loads(data)
        except ValueError:
            raise PeerError("protocol_error", "malformed link record") from None
        if not isinstance(doc, dict):
            raise PeerError("protocol_error", "malformed link record")
        return doc


def messages(packet: bytes) -> tuple[list[bytes], list[bytes]] | None:
    """The keys and the payloads of the messages of a ``MSG`` or a packed
    batch, in order; None for any other packet.  ``PeerError`` if it is
    malformed."""
    if frames.is_batch(packet):
        return frames.unpack_messages(packet)
    parts = frames.msg_parts(packet)
    if parts is None:
        return None
    return [parts[0]], [parts[1]]
