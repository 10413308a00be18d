"""What an interactive command (``sub``, ``pub --lines``) tells its user about
its bus: plain lines on stderr, ``sbus-relay CMD: ...``, each saying what
happened and what the command does next.

What it owns: the plain lines a client command says about its bus.  What it
may touch: stderr.

Not log lines: the structured log (JSON off a terminal, timestamps and levels)
is for the buses (``serve``), which a machine reads; a person reads these.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sbus_relay.client import Outage

#: The reason a client gets when the bus closed without saying why.
NO_REASON = "closed"


class BusNotices:
    """The lines of one command about one bus (``away``/``back`` are the
    client's ``on_disconnected``/``on_reconnected``).  One outage is one pair
    of lines: a connection that the bus, still stopping, closes again at once
    is part of the same outage."""

    def __init__(self, prog: str, address: object, meanwhile: str) -> None:
        self.prog = prog
        self.address = str(address)
        #: what the command does while the bus is away
        self.meanwhile = meanwhile
        #: when the bus went away (monotonic seconds), while it is away
        self._away_since: float | None = None

    def say(self, text: str) -> None:
        """One line on stderr; a stderr nobody reads loses it, never the command."""
        with contextlib.suppress(OSError, ValueError):
            print(f"{self.prog}: {text}", file=sys.stderr, flush=True)

    def away(self, reason: str) -> None:
        if self._away_since is not None:
            return  # still the same outage
        self._away_since = time.monotonic()
        why = "" if reason == NO_REASON else f" ({reason})"
        self.say(f"the bus at {self.address} went away{why}; {self.meanwhile} (Ctrl-C stops)")

    def back(self, _outage: Outage) -> None:
        since, self._away_since = self._away_since, None
        away = "" if since is None else f", after {time.monotonic() - since:.1f} s away"
        self.say(f"the bus at {self.address} is back{away}")
