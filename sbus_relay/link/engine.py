"""What the link asks of a NATS client (an engine), and which engine it runs.

What it owns: the engine interface (``Engine``, ``Sink``), the engine's
settings (``EngineSettings``) and the settings every engine shares.  What it
may touch: nothing (``choice`` picks and makes the engine).

Two engines carry the same behaviour (both tested by the same fleet tests):

* ``nats.c``: the official C client through a compiled module
  (``link/_natsc.pyx``), built where libnats was found at install time: its
  own threads parse and write, so the link's Python sees a message once;
* ``nats-py``: the asyncio client, everywhere else, and when asked
  (``SBUS_PURE_PYTHON=1``, or ``nats.engine: nats-py`` in the settings).

Every call of an engine, and every call it makes of its ``Sink``, happens on
the link's event-loop thread: an engine that has threads of its own (nats.c)
hands what they see to that thread itself.  The one NATS header the link
reads or writes is the envelope (``protocol.natsenvelope``): an engine is
handed its value and hands it over, and encodes and reads it the cheapest
way its client allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

#: The engines, by the name the settings and the stats use.
NATS_C = "nats.c"
NATS_PY = "nats-py"
ENGINES = (NATS_C, NATS_PY)
#: The compiled module of the nats.c engine.
NATS_C_MODULE = "sbus_relay.link._natsc"

#: Seconds between reconnect attempts (each server of the list in turn).
RECONNECT_WAIT = 0.25
#: Seconds to wait for one server to answer a connect.
CONNECT_TIMEOUT = 2.0
#: Seconds between NATS PINGs and how many may go unanswered: a paused or
#: silent server is left for another within about PING_INTERVAL * (PINGS + 1).
PING_INTERVAL = 1
PINGS = 2
#: The client's own buffer for what is published while it reconnects (bytes).
PENDING_BYTES = 8 * 1024 * 1024
#: Messages and bytes one NATS subscription may hold undelivered before the
#: client drops (a slow consumer, counted).
SUB_PENDING_MESSAGES = 65_536
SUB_PENDING_BYTES = 64 * 1024 * 1024

#: A message's envelope: the value of its one NATS header,
#: ``protocol.natsenvelope.HEADER`` (None: a message without it).
Envelope = str | None
#: One message to publish: subject, envelope, payload.
Outgoing = tuple[bytes, Envelope, bytes]


@dataclass(frozen=True)
class EngineSettings:
    """How an engine joins NATS (from the bus's ``nats:`` settings)."""

    servers: tuple[str, ...]
    name: str
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey: str | None = None
    tls_ca: str | None = None
    tls: bool = field(default=False)
    #: the servers tried in the order given, not shuffled (a live upgrade's
    #: new link joins the server the old one is on: docs/nats.md)
    ordered: bool = False


class Sink(Protocol):
    """What an engine tells the link, on the link's loop thread."""

    def on_connected(self, server: str, again: bool) -> None:
        """Joined a server, named as ``host:port`` or by its URL (``again``:
        after a loss); subscriptions are back."""

    def on_disconnected(self) -> None:
        """The connection is lost (the engine reconnects by itself)."""

    def on_error(self, text: str) -> None:
        """Something went wrong that the engine recovers from (a refused sign-in...)."""

    def on_slow_consumer(self, dropped: int) -> None:
        """``dropped`` messages of a subscription that fell behind were dropped."""

    def on_message(self, sid: int, subject: bytes, envelope: Envelope, payload: bytes) -> None:
        """A message on subscription ``sid`` with its envelope (the one header
        the link reads: others a native client sets are not its business).  An
        engine looks this attribute up for each message: the link changes it
        for a hand-over.  In the order the server sent them across
        subscriptions with nats.c (one delivery thread), in order per
        subscription only with nats-py (a task per subscription)."""


class Engine(Protocol):
    """One NATS connection, reconnecting by itself across the servers."""

    name: str

    async def start(self, sink: Sink) -> None:
        """Begin joining (returns at once; ``sink.on_connected`` says when)."""

    async def publish(self, batch: list[Outgoing]) -> int:
        """Hand ``batch`` to the client, in order, to be written at once; the
        number it refused."""

    async def subscribe(self, sid: int, subject: bytes, bounded: bool) -> None:
        """Subscribe (now or, while away, on joining); ``bounded``: the pending
        limits apply (else none: the interest subjects)."""

    async def unsubscribe(self, sid: int) -> None:
        """Drop subscription ``sid`` (nothing if it is not there)."""

    async def round_trip(self, timeout: float) -> float | None:
        """Write everything handed over so far, then a PING; the seconds until
        its PONG, or None if it did not come (nothing confirmed)."""

    async def close(self, timeout: float) -> None:
        """Write what it holds (within ``timeout``) and close."""
