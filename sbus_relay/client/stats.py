"""What happened to a client: its outages and what it could not deliver.  No I/O.

What it owns: the snapshot of a client's counts.  What it may touch: its
session, read only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .session import Outage, Session

__all__ = ["ClientStats", "Outage"]


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A snapshot of a client's counts (``Client.stats``, ``AsyncClient.stats``)."""

    #: connections made, the first included
    connections: int
    #: publishes taken from the caller
    published: int
    #: publishes waiting now for the bus to come back
    buffered: int
    #: publishes that ever had to wait for the bus
    buffered_total: int
    #: publishes lost: still buffered when the client closed or gave up
    unsent: int
    #: the bus packs what it sends us (batched delivery is on)
    batched: bool
    #: batched delivery was asked for and the bus does not know it
    batch_refused: bool
    outages: tuple[Outage, ...]

    @property
    def reconnects(self) -> int:
        return max(0, self.connections - 1)

    @classmethod
    def of(cls, session: Session, outages: Sequence[Outage]) -> ClientStats:
        return cls(
            connections=session.connections,
            published=session.published,
            buffered=session.buffered,
            buffered_total=session.buffered_total,
            unsent=session.unsent,
            batched=session.packing,
            batch_refused=session.batch_refused,
            outages=tuple(outages),
        )
