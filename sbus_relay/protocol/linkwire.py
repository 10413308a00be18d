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
