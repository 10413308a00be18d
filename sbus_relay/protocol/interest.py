"""Who needs to hear about which patterns: the interest extension.  No I/O.

What it owns: which notices each interest listener is owed.  What it may
touch: the index, read only.

docs/protocol.md, "Relays": a client that sends ``CMSG interest/on`` (a relay) is told every
pattern held by *some other* holder, as it goes 0 -> 1 (``interest/add``) and
1 -> 0 (``interest/remove``).  On a relay the upstream link is one of those
holders (it holds what the upstream wants), so the upstream's interest is
passed down like any client's.  Excluding the listener's own patterns is
what keeps a relay from attracting its own subscriptions back.

``InterestTracker`` computes those notices; the server sends them.  Around every
change to the index the server calls ``before(pattern)`` and then
``after(pattern)``, which returns the notices as ``(listener, verb, pattern)``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from .control import INTEREST_ADD as ADD
from .control import INTEREST_REMOVE as REMOVE
from .index import SubscriptionIndex

C = TypeVar("C", bound=Hashable)


class InterestTracker(Generic[C]):
    """Tracks what each interest listener is entitled to know."""

    def __init__(self, index: SubscriptionIndex) -> None:
        self._index = index
        self.listeners: dict[C, None] = {}  # ordered set

    def visible(self, listener: C, pattern: bytes) -> bool:
        """Does anyone but ``listener`` want ``pattern``?"""
        return any(h != listener for h in self._index.holders(pattern))

    def snapshot(self, listener: C) -> list[bytes]:
        """Every pattern ``listener`` should know of right now."""
        return [p for p in self._index.patterns() if self.visible(listener, p)]

    def before(self, pattern: bytes) -> list[bool]:
        """Visibility of ``pattern`` to each listener, taken before a change."""
        return [self.visible(r, pattern) for r in self.listeners]

    def after(self, pattern: bytes, before: list[bool]) -> Iterator[tuple[C, bytes, bytes]]:
        """Notices for the listeners whose view of ``pattern`` changed."""
        for r, was in zip(self.listeners, before, strict=True):
            now = self.visible(r, pattern)
            if now != was:
                yield r, ADD if now else REMOVE, pattern
