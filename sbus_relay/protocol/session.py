"""A connection's protocol state, and what each packet does to it.  No I/O.

What it owns: a connection's protocol state and the rules of each packet
(Session, LinkSession).  What it may touch: nothing but itself -- no socket,
timer, log or server.

Theory of operation, after h11: a plain object takes the bytes of one packet
and returns what the bus must do about it, having changed its own state on
the way.  Nothing here has a socket, a timer or a server; ``bus/`` moves the
bytes, runs the timers and carries the actions out.  Two sides:

* ``Session`` is the bus's side of one connection (a client, or a relay
  below).  Its state: whether it is still open or closing and why (``alive``,
  ``ended``), whether it hears its own messages (``echo``: on, off), whether
  it declared itself a relay and listens for interest notices (``relay``,
  ``interest``), whether it reads packed batches (``packs``), whether it
  takes a new identity in place (``follows``: a relay below that said
  ``identity/follow``, ``renamed`` says what it is told).  Flood-control
  modes live in its ``protocol.flood.OutboundQueue``; ``receive`` says which
  setting a packet asks for (``SetFlood``).  What each packet does
  (docs/protocol.md, "Packets" and the extensions):

    ==============================  ==================  ======================
    packet                          state change        action returned
    ==============================  ==================  ======================
    ``MSG``                         --                  ``codec.Publish``
    ``CMSG batch\\0...``             --                  ``Batch``
    ``SUB``, ``UNSUB``              --                  ``codec.Subscribe``...
    ``CMSG !/cred/whoami``          --                  ``WHOAMI``
    ``CMSG echo/on``, ``echo/off``  echo                None
    ``CMSG interest/on``            relay, interest     ``Listen``
    ``CMSG interest/off``           interest            ``UNLISTEN`` or None
    ``CMSG relay/name\\0<n>``        --                  ``NameRelay``
    ``CMSG identity/follow``        follows             None
    ``CMSG batch/on``               packs               ``BATCH_ON``
    ``CMSG upgrade/take-over``      --                  ``TAKE_OVER``
    ``CMSG drops/count``            --                  ``DROPS_COUNT``
    ``CMSG blocking/...``, order    --                  ``SetFlood``
    any other ``CMSG``              --                  None (ignored)
    anything else                   --                  ``PeerError``
    ==============================  ==================  ======================

  ``end`` closes it (once: a second call says so), and ``notice`` is what it
  is told on the way out.  A packet given to a closed session is a misuse of
  this API (``UsageError``); bad bytes can only raise ``PeerError``.

  The bus's read loop does not call ``receive`` for ``MSG`` and packed
  batches, which change nothing here: it parses them with ``frames`` (one
  allocation per message, the key).  ``bus.connection.Connection`` *is* a
  ``Session`` (a subclass): an idle client costs one object, not two.

* ``LinkSession`` is a relay's side of its link to the upstream bus: the
  handshake (``hello``), whether it waits on whoami (``connected`` and not
  ``ready``), its identity once known (and a reply that begins with it, a
  relay cycle), a new identity told in place (``CMSG identity/changed``:
  ``Renamed``), the secret patterns of an identity it no longer has that
  the upstream was never sent (``unsent``: a relay below renames them
  itself), the upstream's interest (``interest_count``,
  ``interest_complete``), and ``lost`` when the link goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sbus_relay.accel import load_compiled

from . import codec, control, frames
from .accounting import MAX_NAME, relay_name
from .errors import UsageError
from .flood import parse_flood_control
from .keys import WHOAMI

#: The packets a relay's link begins with, before its name (``LinkSession.hello``).
HELLO = (
    codec.encode_cmsg(control.ECHO_OFF),
    control.WHOAMI_PACKET,
    codec.encode_cmsg(control.INTEREST_ON),
    codec.encode_cmsg(control.BATCH_ON),
    codec.encode_cmsg(control.FOLLOW),
)


# --- what a packet asks of the bus ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Whoami:
    """``CMSG !/cred/whoami``: answer with the bus's prefix and the peer's identity."""


@dataclass(frozen=True, slots=True)
class Listen:
    """``CMSG interest/on``: send it every pattern others hold, then ``interest/ready``;
    ``new_relay``: it just declared itself a relay (it is labelled as one)."""

    new_relay: bool


@dataclass(frozen=True, slots=True)
class Unlisten:
    """``CMSG interest/off`` from a listener: it hears no more notices."""


@dataclass(frozen=True, slots=True)
class NameRelay:
    """``CMSG relay/name\\0<name>``: ``name`` is its label, or None if refused
    (not a relay, or not a usable name: ``shown`` is what it sent, for the log)."""

    name: str | None
    shown: str


@dataclass(frozen=True, slots=True)
class BatchOn:
    """``CMSG batch/on``: say yes; what goes to it goes packed from now on."""


@dataclass(frozen=True, slots=True)
class TakeOver:
    """``CMSG upgrade/take-over``: a newer process asks for the bus (``bus.handover``)."""

    #: what more it takes up, as it said (``control.TAKES_NATS_LINK``; b"": nothing)
    takes: bytes = b""


@dataclass(frozen=True, slots=True)
class DropsCount:
    """``CMSG drops/count``: answer with how many of its messages were dropped."""


@dataclass(frozen=True, slots=True)
class SetFlood:
    """``CMSG blocking/soft|hard/<mode>`` or ``order/<order>`` (``protocol.flood``)."""

    what: str
    value: str


@dataclass(frozen=True, slots=True)
class Batch:
    """A packed batch: its MSG packets and their keys (``frames.unpack``)."""

    packets: list[bytes]
    keys: list[bytes]


WHOAMI_ASKED = Whoami()
UNLISTEN = Unlisten()
BATCH_ON = BatchOn()
TAKE_OVER = TakeOver()
DROPS_COUNT = DropsCount()
_LISTEN = Listen(False)
_LISTEN_NEW = Listen(True)

SessionAction = (
    codec.Publish
    | codec.Subscribe
    | codec.Unsubscribe
    | Batch
    | Whoami
    | Listen
    | Unlisten
    | NameRelay
    | BatchOn
    | TakeOver
    | DropsCount
    | SetFlood
)


class Session:
    """The bus's side of one connection: its state, and what each packet does to it."""

    __slots__ = ("alive", "echo", "ended", "follows", "interest", "packs", "relay", "upward")

    def __init__(self, upward: bool = False) -> None:
        #: the link to the upstream bus (on a relay), not a client
        self.upward = upward
        #: not closed for good
        self.alive = True
        self.ended = ""  # why it was closed, once it is
        #: it is sent its own messages (``echo/off`` stops that; the link never)
        self.echo = not upward
        self.relay = False  # declared itself a relay (``interest/on``)
        self.interest = False  # listens for interest notices
        #: it reads packed batches (``CMSG batch/on``)
        self.packs = False
        #: it takes a new identity in place (``CMSG identity/follow``)
        self.follows = False

    def receive(self, packet: bytes) -> SessionAction | None:
        """What one packet from the peer asks of the bus (the table above), or
        None when it asks nothing more than the state change made here."""
        if not self.alive:
            raise UsageError("a packet for a connection closed already (%s)" % self.ended)
        if frames.is_batch(packet):
            packets, keys = frames.unpack(packet)
            return Batch(packets, keys)
        event = codec.decode(packet)
        if isinstance(event, codec.Control):
            return self._control(event.key, event.payload)
        return event

    def _control(self, key: bytes, payload: bytes | None) -> SessionAction | None:
        if key == WHOAMI:
            return WHOAMI_ASKED
        if key == control.ECHO_OFF:
            self.echo = False
            return None
        if key == control.ECHO_ON:
            self.echo = True
            return None
        if key == control.INTEREST_ON:
            new_relay = not self.relay
            self.relay = self.interest = True
            return _LISTEN_NEW if new_relay else _LISTEN
        if key == control.INTEREST_OFF:
            if not self.interest:
                return None
            self.interest = False
            return UNLISTEN
        if key == control.RELAY_NAME:
            raw = payload or b""
            name = relay_name(raw) if self.relay else None  # only a relay is named
            return NameRelay(name, raw[:MAX_NAME].decode("utf-8", "replace"))
        if key == control.BATCH_ON:
            self.packs = True
            return BATCH_ON
        if key == control.FOLLOW:
            self.follows = True
            return None
        if key == control.TAKE_OVER:
            return TakeOver(payload) if payload else TAKE_OVER
        if key == control.DROPS_COUNT:
            return DROPS_COUNT
        setting = parse_flood_control(key)
        if setting is None:
            return None  # unknown control messages are ignored (sbus-README.txt)
        return SetFlood(setting[0], setting[1])

    def end(self, reason: str) -> bool:
        """It closes, for ``reason``: True the first time, False if it had already."""
        if not self.alive:
            return False
        self.alive = False
        self.ended = reason
        return True

    def renamed(self, identity: bytes) -> bytes | None:
        """The bus's own identity changed, so this peer's is now ``identity``:
        what it is told in place (``CMSG identity/changed\\0<identity>``), or
        None when it cannot take one (it never said ``identity/follow``, an
        older relay): then it is to be closed, ``upstream_identity_changed``,
        and learns its identity from its next handshake."""
        if not self.follows:
            return None
        return control.identity_changed(identity)

    def notice(self, reason: str, detail: str = "") -> bytes | None:
        """What it is told as it is closed: ``CMSG disconnect\\0<reason>[: <detail>]``,
        or None when nothing is (its peer closed; the link is never told)."""
        if reason == "closed" or self.upward:
            return None
        return control.disconnect(reason, detail)


# --- the relay's side of its link ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identity:
    """The upstream answered whoami: our prefix is ``reply + b"/"``; subscribe now."""

    reply: bytes


@dataclass(frozen=True, slots=True)
class Cycle:
    """The upstream's whoami reply begins with our own identity: it is below us."""

    reply: bytes


@dataclass(frozen=True, slots=True)
class Renamed:
    """``CMSG identity/changed``: our identity is now ``reply`` on the link we
    have (a relay above us reconnected from another pid): our prefix is
    ``reply + b"/"``, and nothing is resent (what is renamed goes up as
    UNSUB and SUB)."""

    reply: bytes


@dataclass(frozen=True, slots=True)
class UpstreamInterest:
    """The upstream wants ``pattern`` (``interest/add``), or one hold of it less."""

    pattern: bytes
    present: bool


@dataclass(frozen=True, slots=True)
class InterestReady:
    """``interest/ready``: the upstream's interest is complete (``first``: news)."""

    first: bool


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The upstream says why it closes us (``CMSG disconnect``)."""

    reason: str


LinkAction = Identity | Cycle | Renamed | UpstreamInterest | InterestReady | BatchOn | Disconnected


class LinkSession:
    """A relay's side of its link: the handshake, its identity, the upstream's interest.

    States: down (not ``connected``); waiting on whoami (``connected``, not
    ``ready``: an ``Identity`` is acted on, then ``synced``); ready.
    Independently, the upstream's interest is complete or not.  ``lost``
    takes it back to down, keeping only the identity it had (a later reply
    that begins with it is a relay cycle)."""

    __slots__ = (
        "connected",
        "identity",
        "interest_complete",
        "interest_count",
        "ready",
        "unsent",
    )

    def __init__(self) -> None:
        self.connected = False  # socket up, hello sent
        self.ready = False  # whoami answered: patterns synced, publishes flow
        #: the last whoami reply taken, kept across reconnects (cycle detection)
        self.identity: bytes | None = None
        #: patterns the upstream has said it wants (the interest extension)
        self.interest_count = 0
        self.interest_complete = False
        #: secret patterns of an identity we no longer have, left out of the
        #: last sync (a relay below renames them itself): never UNSUB'd up
        self.unsent: set[bytes] = set()

    def hello(self, name: str) -> tuple[bytes, ...]:
        """Connected: the packets to send first (the last names this relay)."""
        self.connected = True
        self.ready = False
        return (*HELLO, control.relay_name(name))

    def receive(self, packet: bytes) -> LinkAction | None:
        """What one packet from the upstream (not a ``MSG``) asks of the relay."""
        event = codec.decode(packet)
        if not isinstance(event, codec.Control):
            return None  # a server sends only MSG and CMSG; ignore anything else
        payload = event.payload or b""
        key = event.key
        if key == WHOAMI:
            if self.ready or not self.connected:
                return None  # one answer per connection is all we asked for
            if self.identity is not None and payload.startswith(self.identity + b"/"):
                # Our own identity heads the chain: the upstream is one of our
                # descendants.  Whole identities are compared, not our pid: each
                # group holds a pid as seen in its writer's pid namespace.
                return Cycle(payload)
            self.identity = payload
            return Identity(payload)  # ready once our patterns are sent (``synced``)
        if key == control.CHANGED:
            if not self.ready or payload == self.identity:
                return None  # not answered yet: the whoami answer will carry it
            if self.identity is not None and payload.startswith(self.identity + b"/"):
                return Cycle(payload)  # taken like a whoami answer
            self.identity = payload
            return Renamed(payload)
        if key == control.INTEREST_ADD:
            self.interest_count += 1
            return UpstreamInterest(payload, True)
        if key == control.INTEREST_REMOVE:
            self.interest_count -= 1
            return UpstreamInterest(payload, False)
        if key == control.INTEREST_READY:
            first = not self.interest_complete
            self.interest_complete = True
            return InterestReady(first)
        if key == control.BATCH_ON:
            return BATCH_ON
        if key == control.DISCONNECT:
            return Disconnected(payload.decode("utf-8", "replace"))
        return None

    def to_sync(self, patterns: Iterable[bytes]) -> list[bytes]:
        """Of the local patterns, those to SUB up now that our identity is
        known.  A relay below that keeps its old secret patterns until it
        renames them (``identity/changed``) holds some of an identity we no
        longer have: the upstream would refuse them, so they are left out and
        kept in ``unsent`` (their UNSUB is not sent either: ``unsubscribes``)."""
        ours = (self.identity or b"") + b"/"
        self.unsent.clear()
        sent = []
        for pattern in patterns:
            if pattern.startswith(b"!") and not pattern.startswith(ours):
                self.unsent.add(pattern)
            else:
                sent.append(pattern)
        return sent

    def unsubscribes(self, pattern: bytes) -> bool:
        """A local pattern went 1 -> 0: whether to UNSUB it up (only once
        ready, and never one the upstream was not sent)."""
        if pattern in self.unsent:
            self.unsent.discard(pattern)
            return False
        return self.ready

    def synced(self) -> None:
        """Our identity is taken and our patterns are on their way: ready, and
        later whoami replies on this connection are not news."""
        self.ready = True

    def lost(self) -> None:
        """The link went down: its interest is unknown again; its identity stays."""
        self.connected = self.ready = False
        self.interest_count = 0
        self.interest_complete = False


load_compiled(globals(), "sbus_relay.protocol._c_session")
