"""The one exception tree of sbus_relay.

What it owns: the one exception tree.  What it may touch: nothing.

Modelled on h11: errors split into "the peer misbehaved" (``PeerError``), which
only ever closes that one peer, and "we were used wrongly" (``UsageError``,
``ConfigError``), which are our callers' fault.  Bad input from the wire may
raise only ``PeerError``.
"""

from __future__ import annotations


class SbusError(Exception):
    """Base of every error sbus_relay raises on purpose."""


class PeerError(SbusError):
    """A peer sent something the protocol forbids.

    ``reason`` is a short stable token (e.g. ``"unknown_verb"``) used as the log
    field and as the value of the ``reason`` metric label, so it must come from a
    small fixed set.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class UsageError(SbusError):
    """Our own API was called wrongly (a bug in the caller, not the peer)."""


class ConfigError(SbusError):
    """A configuration file or flag is invalid: names the file, the key and why."""

    def __init__(self, source: str, key: str, reason: str) -> None:
        super().__init__(f"{source}: {key}: {reason}")
        self.source = source
        self.key = key
        self.reason = reason


class AddressError(SbusError):
    """An address (socket path, abstract name, /dev/fd/N) is malformed or unusable."""


class BusClosed(SbusError):
    """The connection to the bus was closed (client side).

    ``reason`` is the server's own word for why (``CMSG disconnect``, e.g.
    ``"user_not_allowed"``), or ``""`` when it gave none.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class UpgradeError(SbusError):
    """A live upgrade could not hand the bus over: the old process serves on."""


class BufferFull(SbusError):
    """A client away from its bus has no room left to keep another publish:
    nothing was kept of the one refused, and everything kept before it stays."""
