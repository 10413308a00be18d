"""The client's protocol core: what to send, what a received packet means, and
what the client asked of its bus, kept across connections.  No I/O.

What it owns: one client's protocol state across its connections, and what
both faces share of outages, reconnects and requests.  What it may touch:
nothing but itself; the wire only through protocol.codec and protocol.control.

Both faces of the library, the blocking ``Client`` (``core.py``) and the
asyncio ``AsyncClient`` (``aio.py``), drive one ``Session``: they hand it
what the caller asks and every packet that arrives, and send what it queued
(``outgoing``).  Sockets, waiting and back-off are theirs; every decision
about the protocol is here, once.

Theory of operation
-------------------
A session outlives its connections.  Its state moves

    DISCONNECTED --connection_made--> HANDSHAKE --whoami reply--> READY
          ^                                                          |
          +-----------------------connection_lost--------------------+

* What the caller asked -- subscriptions (a pattern twice is held twice),
  echo, flood-control modes, batched delivery -- is recorded in any state and
  asked again on every new connection: the bus keeps nothing of a client that
  left (docs/protocol.md, "Packets").
* ``connection_made`` queues the handshake: ``CMSG batch/on`` when batched
  delivery was asked, the echo and flood modes, every non-secret ``SUB``, a
  whoami, and the whoamis the caller is still waiting for (asked again).
  The publishes buffered while away follow at ``release``, which the I/O
  layer calls a grace period later (``CLIENT_RESUBSCRIBE_GRACE``): the bus's
  other clients, which lost their connections too, subscribe again first.
  Until then new publishes join the buffer, in order.
* Secret patterns (``<prefix>!/cred/...``) carry the identity the bus gives
  us, and that changes when a relay in between restarts.  They are sent once
  the handshake's whoami is answered, renamed from the identity the last
  connection had to the new one, as a relay renames its clients' patterns.
* ``batch/on``: a bus that knows it answers before the whoami reply (it
  handles one client's packets in order); a whoami reply that comes first
  means it does not (the reference sbusd), and the session stays with one
  packet per message.  Once agreed, runs of publishes go as packed batches.
* While disconnected, publishes wait in a bounded buffer; one more than it
  holds raises ``BufferFull``: the caller sees it, nothing is dropped unseen.
* ``receive`` turns one packet into events: a ``Message`` (one per message of
  a packed batch), the answer to the caller's whoami, the end of the
  handshake, or the bus's notice of why it is closing us.  Anything the
  protocol forbids from a server raises ``PeerError``.

Beside the session, what both faces keep the same way and only their I/O
differs on: ``Outages`` (when the bus went away and why, the outages so far,
the caller's callbacks), ``Backoff`` (when to try to connect again) and
``Requests`` (each request's reply key and payload).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

from sbus_relay.protocol import codec, control
from sbus_relay.protocol.codec import encode_request, split_request
from sbus_relay.protocol.errors import BufferFull, BusClosed, PeerError, UsageError
from sbus_relay.protocol.keys import CRED, WHOAMI, is_secret
from sbus_relay.protocol.limits import (
    CLIENT_BUFFER_BYTES,
    CLIENT_BUFFER_MESSAGES,
    CLIENT_RECONNECT_MAX,
    CLIENT_RECONNECT_MIN,
    MAX_PACKET,
    MAX_PATTERNS_PER_CLIENT,
)

#: Flood-control modes a client may ask for (docs/protocol.md, Flood control).
FLOOD_MODES = frozenset(
    {
        "blocking/soft/queue",
        "blocking/soft/discard",
        "blocking/soft/block",
        "blocking/soft/error",
        "blocking/hard/discard",
        "blocking/hard/block",
        "blocking/hard/error",
        "order/queue",
        "order/stack",
        "order/random",
    }
)
#: Reasons of a ``CMSG disconnect`` after which connecting again cannot help:
#: the bus refuses this user, or refused what this client asks of it and
#: would refuse it again on the next connection.
FINAL_REASONS = frozenset(
    {
        "user_not_allowed",
        "protocol_error",
        "secret_refused",
        "reserved_pattern",
        "too_many_patterns",
        "too_many_pattern_bytes",
        "pattern_too_long",
        "pattern_too_deep",
        "user_pattern_quota",
    }
)

#: Who asked a whoami: the handshake, the caller, or the session itself (to
#: learn the identity a secret pattern was made for).
_HANDSHAKE, _CALLER, _LEARN = 0, 1, 2
#: What follows a client's identity in the keys of its reply inbox.
INBOX = b"/inbox/"

Data = str | bytes


def as_bytes(value: Data) -> bytes:
    """Keys, patterns and payloads: ``str`` is UTF-8."""
    return value.encode("utf-8") if isinstance(value, str) else value


class State(enum.Enum):
    DISCONNECTED = "disconnected"
    HANDSHAKE = "handshake"
    READY = "ready"


class Message(NamedTuple):
    """One received message: a publish (``control=False``) or a server control
    message.  A tuple: made once per message on the receiving path, it costs
    a third of a frozen dataclass."""

    control: bool
    key: bytes
    payload: bytes
    packet: bytes


@dataclass(frozen=True, slots=True)
class WhoamiReply:
    """The answer to a whoami the caller asked: ``<prefix>!/cred/<gid>/<uid>/<pid>``."""

    identity: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake of a connection is done: the bus holds every subscription."""

    identity: bytes
    #: the bus packs what it sends us and reads what we pack
    batched: bool
    #: secret patterns renamed to a new identity on this connection
    renamed: int


@dataclass(frozen=True, slots=True)
class Closing:
    """The bus said why it is about to close us (``CMSG disconnect``)."""

    reason: str
    detail: str

    @property
    def final(self) -> bool:
        """Connecting again would be refused the same way."""
        return self.reason in FINAL_REASONS

    def error(self) -> BusClosed:
        """What the caller is told: the bus's reason, and its detail."""
        said = f"{self.reason}: {self.detail}" if self.detail else self.reason
        return BusClosed(f"the bus closed the connection: {said}", self.reason)


Event = Message | WhoamiReply | Ready | Closing


class Session:
    """One client's protocol state across its connections (see the module's theory)."""

    def __init__(
        self,
        *,
        batch: bool = False,
        buffer_messages: int = CLIENT_BUFFER_MESSAGES,
        buffer_bytes: int = CLIENT_BUFFER_BYTES,
    ) -> None:
        if buffer_messages < 0 or buffer_bytes < 0:
            raise UsageError("the publish buffer's bounds cannot be negative")
        self.state = State.DISCONNECTED
        #: batched delivery asked for (``CMSG batch/on``)
        self.batch = batch
        #: the bus on this connection agreed to batched delivery
        self.packing = False
        self._batch_asked = False
        #: whether the last handshake found a bus that does not know batch/on
        self.batch_refused = False
        #: every subscription, a pattern twice held twice, in the order made
        self.patterns: list[bytes] = []
        self.echo: bool | None = None  # None: the bus's default (on)
        #: the flood modes asked, latest per kind (soft, hard, order)
        self.flood: dict[str, str] = {}
        #: the last identity the bus gave us, ``<prefix>!/cred/<gid>/<uid>/<pid>``
        self.identity: bytes | None = None
        #: who asked each whoami not yet answered, in order (``_HANDSHAKE``,
        #: ``_CALLER``, ``_LEARN``)
        self._whoamis: deque[int] = deque()
        #: whoamis the caller still waits for when the connection was lost
        self._reask = 0
        self._outbox: list[bytes] = []
        self._buffer: deque[bytes] = deque()
        self._buffer_bytes = 0
        #: a new connection holds back what was buffered until ``release``
        self.holding = False
        self.buffer_messages = buffer_messages
        self.buffer_bytes = buffer_bytes
        #: counts: connections made, publishes taken, buffered while away,
        #: and publishes the caller gave up on (closed while they waited)
        self.connections = 0
        self.published = 0
        self.buffered_total = 0
        self.unsent = 0

    # --- what the caller asks ------------------------------------------------------

    def subscribe(self, pattern: Data) -> None:
        """``SUB pattern``, now if connected, and on every connection after."""
        raw = as_bytes(pattern)
        packet = codec.encode_sub(raw)
        _fits(packet)
        if len(self.patterns) >= MAX_PATTERNS_PER_CLIENT:
            raise UsageError(f"over {MAX_PATTERNS_PER_CLIENT} subscriptions")
        self.patterns.append(raw)
        if self._on_bus(raw):
            self._outbox.append(packet)
            if self.identity is None and is_secret(raw) and _LEARN not in self._whoamis:
                # learn the identity it was made for, to rename it if that changes
                self._whoamis.append(_LEARN)
                self._outbox.append(control.WHOAMI_PACKET)

    def unsubscribe(self, pattern: Data) -> None:
        """``UNSUB pattern``: drops one hold of it."""
        raw = as_bytes(pattern)
        packet = codec.encode_unsub(raw)
        _fits(packet)
        on_bus = self._on_bus(raw)
        for i in range(len(self.patterns) - 1, -1, -1):
            if self.patterns[i] == raw:
                del self.patterns[i]
                break
        else:
            on_bus = self.state is not State.DISCONNECTED  # the bus logs and ignores it
        if on_bus:
            self._outbox.append(packet)

    def publish(self, key: Data, payload: Data = b"") -> None:
        """``MSG key\\0payload``; buffered while away (``BufferFull`` past its bound)."""
        packet = codec.encode_msg(as_bytes(key), as_bytes(payload))
        _fits(packet)
        if self.state is State.DISCONNECTED or self.holding:
            self._keep(packet)
        else:
            self._outbox.append(packet)
        self.published += 1

    def publish_many(self, items: Iterable[tuple[Data, Data]]) -> int:
        """Several publishes, packed into as few packets as the bus takes; how
        many.  All or none: a bad key or a full buffer keeps none of them."""
        packets = [codec.encode_msg(as_bytes(k), as_bytes(p)) for k, p in items]
        for packet in packets:
            _fits(packet)
        if self.state is State.DISCONNECTED or self.holding:
            self._room_for(packets)
            for packet in packets:
                self._keep(packet)
        else:
            self._outbox.extend(packets)
        self.published += len(packets)
        return len(packets)

    def set_echo(self, on: bool) -> None:
        """Receive our own publishes (or not), on every connection."""
        self.echo = on
        if self.state is not State.DISCONNECTED:
            self._outbox.append(_echo(on))

    def set_flood(self, mode: str) -> None:
        """A flood-control mode, e.g. ``"blocking/soft/discard"``, on every connection."""
        if mode not in FLOOD_MODES:
            raise UsageError(f"unknown flood mode {mode!r}; one of {sorted(FLOOD_MODES)}")
        self.flood[mode.removeprefix("blocking/").split("/")[0]] = mode
        if self.state is not State.DISCONNECTED:
            self._outbox.append(codec.encode_cmsg(mode.encode()))

    def control(self, key: Data, payload: Data | None = None) -> None:
        """A control message for the bus on this connection only (a request
        is answered on the connection that asked it)."""
        raw = as_bytes(key)
        if raw == WHOAMI:
            self.ask_whoami()
            return
        packet = codec.encode_cmsg(raw, None if payload is None else as_bytes(payload))
        _fits(packet)
        if self.state is State.DISCONNECTED:
            raise UsageError("not connected: a control message goes to one connection")
        self._outbox.append(packet)

    def ask_whoami(self) -> None:
        """Ask who the bus sees; answered by a ``WhoamiReply`` event (asked
        again on the next connection if this one is lost first)."""
        if self.state is not State.READY:
            # answered once the secret patterns are in place too, so that the
            # answer still means "everything asked before me took effect"
            self._reask += 1
            return
        self._whoamis.append(_CALLER)
        self._outbox.append(control.WHOAMI_PACKET)

    # --- connections ---------------------------------------------------------------

    def connection_made(self) -> Ready | None:
        """A new connection: queue the handshake and what waited for it.

        The handshake asks whoami only when something hangs on the answer:
        batched delivery (the answer tells whether the bus knows it), secret
        patterns (they are renamed by it), or an identity already known (to
        see it change).  Otherwise the session is ready at once, and that
        ``Ready`` is returned; else it comes from ``receive``.
        """
        if self.state is not State.DISCONNECTED:
            raise UsageError("connection_made while connected")
        self.state = State.HANDSHAKE
        self.connections += 1
        self.packing = False
        out = self._outbox
        out.clear()
        self._batch_asked = self.batch
        if self.batch:
            out.append(codec.encode_cmsg(control.BATCH_ON))
        if self.echo is not None:
            out.append(_echo(self.echo))
        out.extend(codec.encode_cmsg(mode.encode()) for mode in self.flood.values())
        out.extend(codec.encode_sub(p) for p in self.patterns if not is_secret(p))
        self._whoamis = deque()
        ready = None
        if self.batch or self.identity is not None or any(map(is_secret, self.patterns)):
            self._whoamis.append(_HANDSHAKE)
            out.append(control.WHOAMI_PACKET)
        else:
            self.state = State.READY
            ready = Ready(b"", False, 0)
            self._send_reasked()
        # What was published while away waits a little more (``release``):
        # sent at once, it would reach the bus before the other clients that
        # lost it too have subscribed again.
        self.holding = bool(self._buffer)
        if not self.holding:
            self.release()
        return ready

    def release(self) -> None:
        """Send what was buffered while away (after the grace that lets the bus's
        other clients subscribe again); publishes go straight out again."""
        self.holding = False
        if self.state is State.DISCONNECTED:
            return
        self._outbox.extend(self._buffer)
        self._buffer.clear()
        self._buffer_bytes = 0

    def connection_lost(self) -> None:
        """The connection is gone: what was not sent waits for the next one.

        Publishes already handed to the socket are the bus's; those still in
        the outbox go back to the buffer, in order, ahead of new ones.
        """
        if self.state is State.DISCONNECTED:
            return
        self.state = State.DISCONNECTED
        self.packing = False
        self._reask += sum(1 for asker in self._whoamis if asker == _CALLER)
        self._whoamis.clear()
        unsent: list[bytes] = []
        for packet in self._outbox:
            if codec.is_msg(packet):
                unsent.append(packet)
            elif codec.is_batch(packet):
                unsent.extend(codec.unpack(packet)[0])
        self._outbox.clear()
        self._buffer.extendleft(reversed(unsent))
        self._buffer_bytes += sum(len(p) for p in unsent)
        self.buffered_total += len(unsent)

    def give_up(self) -> int:
        """The client closes for good: the publishes still waiting are lost; how many."""
        self.connection_lost()
        lost = len(self._buffer)
        self.unsent += lost
        self._buffer.clear()
        self._buffer_bytes = 0
        self._reask = 0
        return lost

    # --- what arrives --------------------------------------------------------------

    def messages(self, packet: bytes) -> list[Message] | None:
        """The messages one packet from the bus carries (a MSG, or each of a
        packed batch's), in order; None if it is not one of those (then
        ``receive`` says what it means)."""
        parts = codec.msg_parts(packet)
        if parts is not None:
            return [Message(False, parts[0], parts[1], packet)]
        if codec.is_batch(packet):
            packets, keys, payloads = codec.unpack_full(packet)
            return list(map(Message, repeat(False, len(keys)), keys, payloads, packets))
        return None

    def receive(self, packet: bytes) -> list[Event]:
        """The events one packet from the bus means, in order."""
        if len(packet) > MAX_PACKET:
            raise PeerError("protocol_error", f"server sent a packet over {MAX_PACKET} bytes")
        messages = self.messages(packet)
        if messages is not None:
            return messages  # type: ignore[return-value]
        event = codec.decode(packet)
        if not isinstance(event, codec.Control):
            raise PeerError("protocol_error", "server sent a SUB or UNSUB packet")
        payload = event.payload or b""
        key = event.key
        if key == WHOAMI and self._whoamis:
            return self._whoami_answered(payload)
        if key == control.BATCH_ON and self._batch_asked:
            self._batch_asked = False
            self.packing = True
            self.batch_refused = False
            return []
        if key == control.DISCONNECT:
            return [Closing(*control.parse_disconnect(payload))]
        return [Message(True, key, payload, packet)]

    def outgoing(self) -> list[bytes]:
        """The packets to send now, in order (runs of publishes packed once the
        bus agreed to batches); the caller sends them all or calls
        ``connection_lost``."""
        out, self._outbox = self._outbox, []
        if not self.packing or len(out) < 2:
            return out
        return codec.pack(out)[0]

    def put_back(self, packets: list[bytes]) -> None:
        """Packets taken by ``outgoing`` that the socket did not take: first out next."""
        self._outbox[:0] = packets

    def inbox(self) -> bytes:
        """The pattern of this client's reply inbox: a secret key of its own
        identity, so that only it can receive what is sent there."""
        if self.identity is None:
            raise UsageError("no identity yet: the bus has not answered the handshake")
        return self.identity + INBOX

    @property
    def pending_output(self) -> int:
        """Packets queued and not yet taken by ``outgoing``."""
        return len(self._outbox)

    @property
    def buffered(self) -> int:
        """Publishes waiting for a connection."""
        return len(self._buffer)

    # --- inside ----------------------------------------------------------------------

    def _on_bus(self, pattern: bytes) -> bool:
        """Whether a change to ``pattern`` goes to the bus now: connected, and
        (secret patterns) the handshake has told us our identity."""
        if self.state is State.READY:
            return True
        return self.state is State.HANDSHAKE and not is_secret(pattern)

    def _whoami_answered(self, identity: bytes) -> list[Event]:
        asker = self._whoamis.popleft()
        if asker != _HANDSHAKE:
            self._refresh(identity)
            return [WhoamiReply(identity)] if asker == _CALLER else []
        # the handshake's own: the bus has everything sent before it
        if self._batch_asked:  # no answer came first: the bus does not know it
            self._batch_asked = False
            self.batch_refused = True
        renamed = self._rename(identity)
        self.identity = identity
        self.state = State.READY
        for pattern in self.patterns:
            if is_secret(pattern):
                self._outbox.append(codec.encode_sub(pattern))
        self._send_reasked()
        return [Ready(identity, self.packing, renamed)]

    def _send_reasked(self) -> None:
        for _ in range(self._reask):
            self._whoamis.append(_CALLER)
            self._outbox.append(control.WHOAMI_PACKET)
        self._reask = 0

    def _refresh(self, identity: bytes) -> None:
        """A whoami on a live connection: a relay between us and the master may
        have renamed our secret patterns itself (its upstream changed); follow."""
        if identity != self.identity:
            self._rename(identity)
            self.identity = identity

    def _rename(self, identity: bytes) -> int:
        """Secret patterns made for the last identity, rewritten for ``identity``
        (its prefix, and our own gid/uid/pid where the pattern named them)."""
        old = self.identity
        if old is None or old == identity:
            return 0
        old_prefix, new_prefix = prefix_of(old), prefix_of(identity)
        renamed = 0
        for i, pattern in enumerate(self.patterns):
            if pattern.startswith(old + b"/"):
                self.patterns[i] = identity + pattern[len(old) :]
            elif pattern.startswith(old_prefix + CRED) and is_secret(pattern):
                self.patterns[i] = new_prefix + pattern[len(old_prefix) :]
            else:
                continue
            renamed += 1
        return renamed

    def _keep(self, packet: bytes) -> None:
        self._room_for([packet])
        self._buffer.append(packet)
        self._buffer_bytes += len(packet)
        self.buffered_total += 1

    def _room_for(self, packets: list[bytes]) -> None:
        size = sum(len(p) for p in packets)
        if (
            len(self._buffer) + len(packets) > self.buffer_messages
            or self._buffer_bytes + size > self.buffer_bytes
        ):
            raise BufferFull(
                f"the client is away from its bus and its buffer holds"
                f" {len(self._buffer)} publishes ({self._buffer_bytes} bytes) of at most"
                f" {self.buffer_messages} ({self.buffer_bytes} bytes): not kept"
            )


@dataclass(frozen=True, slots=True)
class Outage:
    """One time the bus went away and came back."""

    #: why the connection ended: the bus's ``CMSG disconnect`` reason, or
    #: ``closed`` when it gave none (it died, or was restarted)
    reason: str
    #: from noticing the loss to the bus holding every subscription again
    seconds: float
    #: secret subscriptions renamed because our identity changed
    renamed: int


Disconnected = Callable[[str], None]
Reconnected = Callable[[Outage], None]


class Outages:
    """When the bus went away and why, the outages so far, and the caller's
    callbacks (``on_disconnected``, ``on_reconnected``): what both faces note
    of a connection lost and made again."""

    def __init__(
        self, on_disconnected: Disconnected | None, on_reconnected: Reconnected | None
    ) -> None:
        self.on_disconnected = on_disconnected
        self.on_reconnected = on_reconnected
        #: every outage so far, in order
        self.history: list[Outage] = []
        self._since = 0.0  # when the one under way began (0: none is)
        self._reason = ""

    def lost(self, reason: str, now: float) -> None:
        """The connection is gone and the client will connect again: note when
        and why (``closed`` when the bus said nothing), and tell the caller."""
        self._since = now
        self._reason = reason or "closed"
        if self.on_disconnected is not None:
            self.on_disconnected(self._reason)

    def ready(self, event: Ready, now: float) -> None:
        """A connection's handshake is done: if it ends an outage, the outage
        is kept and the caller told."""
        if not self._since:
            return
        outage = Outage(self._reason, now - self._since, event.renamed)
        self.history.append(outage)
        self._since = 0.0
        if self.on_reconnected is not None:
            self.on_reconnected(outage)


class Callbacks:
    """A face's callbacks, kept in its ``outages`` and settable after it is made
    (``client.on_reconnected = ...``): both faces are one."""

    outages: Outages

    @property
    def on_disconnected(self) -> Disconnected | None:
        """Called with the reason each time the connection is lost (the client connects again)."""
        return self.outages.on_disconnected

    @on_disconnected.setter
    def on_disconnected(self, callback: Disconnected | None) -> None:
        self.outages.on_disconnected = callback

    @property
    def on_reconnected(self) -> Reconnected | None:
        """Called with the ``Outage`` each time the bus holds every subscription again."""
        return self.outages.on_reconnected

    @on_reconnected.setter
    def on_reconnected(self, callback: Reconnected | None) -> None:
        self.outages.on_reconnected = callback


class Backoff:
    """When to try to connect again: at once after a loss, then from
    ``CLIENT_RECONNECT_MIN`` doubling to ``CLIENT_RECONNECT_MAX`` after each
    failed try, from the start again once connected."""

    def __init__(self) -> None:
        self.delay = CLIENT_RECONNECT_MIN
        #: when the next try is due (monotonic seconds; 0: now)
        self.next_try = 0.0

    def failed(self, now: float) -> float:
        """A try failed: how long to wait before the next."""
        wait = self.delay
        self.next_try = now + wait
        self.delay = min(wait * 2, CLIENT_RECONNECT_MAX)
        return wait

    def connected(self) -> None:
        """A try succeeded: the next outage starts from the shortest wait."""
        self.delay = CLIENT_RECONNECT_MIN
        self.next_try = 0.0

    def lost(self) -> None:
        """The connection is gone: the next try is due at once."""
        self.next_try = 0.0


class Requests:
    """Requests and their replies (docs/client.md, "Request and reply"): each
    request gets a reply key of its own under the client's inbox."""

    def __init__(self) -> None:
        self.sent = 0

    def new(self, inbox: bytes, payload: Data) -> tuple[bytes, bytes]:
        """The reply key of a new request, and its payload as published."""
        self.sent += 1
        reply_to = inbox + b"%d" % self.sent
        return reply_to, encode_request(reply_to, as_bytes(payload))

    @staticmethod
    def reply_key(request: Message) -> bytes:
        """Where the answer to a request received goes (``UsageError`` if it is none)."""
        return split_request(request.payload)[0]


def prefix_of(identity: bytes) -> bytes:
    """What comes before our own ``!/cred/<gid>/<uid>/<pid>``: empty on a
    master, the relay's identity and ``/`` on a relay."""
    at = identity.rfind(CRED)
    return identity[:at] if at >= 0 else b""


def _fits(packet: bytes) -> None:
    if len(packet) > MAX_PACKET:
        raise UsageError(f"packet of {len(packet)} bytes is over the {MAX_PACKET}-byte limit")


def _echo(on: bool) -> bytes:
    return codec.encode_cmsg(control.ECHO_ON if on else control.ECHO_OFF)


__all__ = [
    "FINAL_REASONS",
    "FLOOD_MODES",
    "Backoff",
    "Callbacks",
    "Closing",
    "Data",
    "Disconnected",
    "Event",
    "Message",
    "Outage",
    "Outages",
    "Ready",
    "Reconnected",
    "Requests",
    "Session",
    "State",
    "WhoamiReply",
    "as_bytes",
    "encode_request",
    "prefix_of",
    "split_request",
]
