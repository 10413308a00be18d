"""The control messages the project speaks, ``CMSG <key>[\\0<payload>]``: every
key, and how each payload is written and read.  No I/O.

What it owns: the control keys and their payloads' layouts.  What it may
touch: codec (to build packets).

sbus-README.txt leaves control messages to the server (an unknown one is
ignored); docs/protocol.md lists ours.  Their keys are named here once, and
a payload with a layout of its own has its writer and reader side by side:

* the reference's: ``!/cred/whoami`` (``keys.WHOAMI``; its reply's payload
  is the identity), the flood-control modes (``flood.parse_flood_control``);
* the bus's notice before it closes a client: ``disconnect`` with
  ``<reason>[: <detail>]`` (``disconnect``, ``parse_disconnect``);
* echo, interest, relay names, identities followed in place, packed
  batches' ``batch/on``, the drop query (``drops_count``,
  ``parse_drops_count``);
* a live upgrade's exchange (``upgrade/take-over``, ``upgrade/state``,
  ``upgrade/part``, ``upgrade/done``, ``upgrade/refused``).

Packets are built with ``codec.encode_cmsg`` and read with ``codec.decode``
(a ``Control`` event): nobody else spells ``CMSG``.
"""

from __future__ import annotations

from .codec import encode_cmsg
from .keys import WHOAMI
from .limits import UPGRADE_CHUNK

# --- the reference's ---------------------------------------------------------------
#: The credentials request; its reply carries the identity (docs/protocol.md).
WHOAMI_KEY = WHOAMI

# --- echo, interest, relays (docs/protocol.md, "Relays") ------------------------------
ECHO_ON = b"echo/on"
ECHO_OFF = b"echo/off"
#: A relay listens for what others subscribe to: ``interest/add``, ``remove``,
#: and ``ready`` once the snapshot is sent.
INTEREST_ON = b"interest/on"
INTEREST_OFF = b"interest/off"
INTEREST_ADD = b"interest/add"
INTEREST_REMOVE = b"interest/remove"
INTEREST_READY = b"interest/ready"
#: What a relay names itself with (its instance).
RELAY_NAME = b"relay/name"
#: What a relay says in its hello: it takes a new identity in place.
FOLLOW = b"identity/follow"
#: What such a relay is then told: its whole new identity, as whoami would answer.
CHANGED = b"identity/changed"

# --- packed batches, drops, closing ---------------------------------------------------
#: What a peer sends to be sent packed batches, and the answer that says it will be.
BATCH_ON = b"batch/on"
#: What a client asks how many of its messages were dropped with; the reply's
#: payload is the decimal total.
DROPS_COUNT = b"drops/count"
#: What the bus tells a client it closes, before closing (our extension):
#: ``CMSG disconnect\\0<reason>[: <detail>]``.
DISCONNECT = b"disconnect"
#: Between a disconnect notice's reason and its detail.
_DETAIL = ": "

# --- a live upgrade (``ops.handover``) -------------------------------------------------
#: What a process that is to take the bus over sends; its payload names what
#: more than the bus's own sockets it takes up (an older process names none).
TAKE_OVER = b"upgrade/take-over"
#: It takes the running NATS link process up (its socket comes with the
#: clients', and the new bus hands it on to a new link itself: docs/nats.md).
TAKES_NATS_LINK = b"nats-link/1"
#: The bus's answer: a JSON header (how many parts and descriptors follow).
UPGRADE_STATE = b"upgrade/state"
#: One part of the pickled state (with descriptors, ``SCM_RIGHTS``).
UPGRADE_PART = b"upgrade/part"
#: The new process serves the bus now.
UPGRADE_DONE = b"upgrade/done"
#: The bus will not hand itself over; the payload says why.
UPGRADE_REFUSED = b"upgrade/refused"
#: The longest packet of the exchange: a part and its head.
UPGRADE_LONGEST = len(encode_cmsg(UPGRADE_PART, b"")) + UPGRADE_CHUNK


def disconnect(reason: str, detail: str = "") -> bytes:
    """``CMSG disconnect\\0<reason>[: <detail>]``: why the bus closes a client."""
    told = reason + (_DETAIL + detail if detail else "")
    return encode_cmsg(DISCONNECT, told.encode("utf-8", "replace"))


def parse_disconnect(payload: bytes | None) -> tuple[str, str]:
    """``(reason, detail)`` of a disconnect notice's payload (detail "" if none)."""
    text = (payload or b"").decode("utf-8", "replace")
    reason, _, detail = text.partition(_DETAIL)
    return reason, detail


def drops_count(total: int) -> bytes:
    """The answer to ``CMSG drops/count``: the client's drops, in decimal."""
    return encode_cmsg(DROPS_COUNT, b"%d" % total)


def parse_drops_count(payload: bytes | None) -> int | None:
    """The total a ``drops/count`` answer carries; None if it carries none."""
    try:
        return int(payload or b"")
    except ValueError:
        return None


def identity_changed(identity: bytes) -> bytes:
    """``CMSG identity/changed\\0<identity>``: a relay's whole new identity."""
    return encode_cmsg(CHANGED, identity)


def relay_name(name: str) -> bytes:
    """``CMSG relay/name\\0<name>``: what a relay names itself with."""
    return encode_cmsg(RELAY_NAME, name.encode("utf-8", "replace"))


def interest(pattern: bytes, present: bool) -> bytes:
    """``CMSG interest/add`` or ``interest/remove`` for ``pattern`` (to a relay below)."""
    return encode_cmsg(INTEREST_ADD if present else INTEREST_REMOVE, pattern)


#: ``CMSG interest/ready``: the snapshot and the notices owed with it are sent.
INTEREST_READY_PACKET = encode_cmsg(INTEREST_READY, b"")
#: ``CMSG !/cred/whoami``: the question (its answer has the identity as payload).
WHOAMI_PACKET = encode_cmsg(WHOAMI)
#: The packet a process that is to take the bus over begins with.
TAKE_OVER_PACKET = encode_cmsg(TAKE_OVER, TAKES_NATS_LINK)
#: The packet that says the new process serves the bus now.
UPGRADE_DONE_PACKET = encode_cmsg(UPGRADE_DONE)


def upgrade_state(header: bytes) -> bytes:
    """``CMSG upgrade/state\\0<header>``."""
    return encode_cmsg(UPGRADE_STATE, header)


def upgrade_part(data: bytes) -> bytes:
    """``CMSG upgrade/part\\0<data>`` (at most ``UPGRADE_CHUNK`` bytes of state)."""
    return encode_cmsg(UPGRADE_PART, data)


def upgrade_refused(why: str) -> bytes:
    """``CMSG upgrade/refused\\0<why>``."""
    return encode_cmsg(UPGRADE_REFUSED, why.encode("utf-8", "replace"))
