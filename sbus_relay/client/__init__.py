"""The sbus client library: ``Client`` (blocking, or cooperative under gevent)
and ``AsyncClient`` (asyncio), over one protocol core (``session``).

What it owns: the library's public names.  What it may touch: nothing.

docs/client.md is its guide.
"""

from sbus_relay.protocol.errors import BufferFull, BusClosed, PeerError, SbusError, UsageError

from .aio import AsyncClient
from .core import Client
from .session import FLOOD_MODES, Message, split_request
from .stats import ClientStats, Outage

__all__ = [
    "FLOOD_MODES",
    "AsyncClient",
    "BufferFull",
    "BusClosed",
    "Client",
    "ClientStats",
    "Message",
    "Outage",
    "PeerError",
    "SbusError",
    "UsageError",
    "split_request",
]
