"""The one place the link reaches into nats-py's private parts.

What it owns: every use of a nats-py attribute that is not its public API,
each with why it is needed; ``check()`` says, in one line, what a nats-py
release changed (``tests/unit/test_natspy_private.py`` calls it, so a new
nats-py that breaks the link fails there by name).  What it may touch: a
nats-py ``Client`` handed to it.

* ``Client._flush_pending(force_flush=True)``: nats-py's ``flush()`` writes
  its PING straight to the socket, ahead of the commands it still holds, so
  a PONG alone does not say the server read them; the forced flush writes
  them first (nats-py 2.x: ``pyproject.toml`` keeps to it).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

#: What the link uses, and the parameters it passes.
USED = {"_flush_pending": ("force_flush",)}


async def write_held(nc: Any, timeout: float) -> None:
    """Have nats-py write out what it holds (SUB, PUB...) before a round trip.
    (It waits for ever on a connection that goes away meanwhile: ``timeout``.)"""
    await asyncio.wait_for(nc._flush_pending(force_flush=True), timeout)


def check() -> str:
    """'' if the installed nats-py has what the link uses, else what it lacks."""
    from nats.aio.client import Client

    for name, params in USED.items():
        member = getattr(Client, name, None)
        if member is None or not inspect.iscoroutinefunction(member):
            return f"nats-py's Client.{name} is gone or no longer a coroutine"
        missing = [p for p in params if p not in inspect.signature(member).parameters]
        if missing:
            return f"nats-py's Client.{name} takes no {', '.join(missing)}"
    return ""
