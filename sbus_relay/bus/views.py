"""What the bus shows of itself: the metrics gauges, the per-who rows, ``/clients``.

What it owns: how the server's live state is summed and shaped for the
collector (gauges), the per-who series (who) and /clients (client_rows).  What
it may touch: what Shown lists of the server, read only.

What it may touch: it only reads -- the server's clients, index, accounts,
tallies, upstream link and the traffic of the clients that have gone
(``Server.departed``), and each connection's public counters and modes.  It
writes nothing.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Protocol

from sbus_relay.protocol.accounting import Tally
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.quota import Account
from sbus_relay.protocol.stats import Gauges

from .connection import Connection
from .upstream import UpstreamLink


class Shown(Protocol):
    """What these views read of the server (``bus.server.Server``)."""

    clients: dict[int, Connection]
    accounts: dict[int, Account]
    index: SubscriptionIndex
    upstream: UpstreamLink | None
    by_relay: Tally
    by_user: Tally
    prefix: bytes | None
    departed: Traffic


def counters(conn: Connection) -> tuple[int, ...]:
    """One connection's row of ``accounting.COUNTERS``."""
    ended = bool(conn.ended) and conn.ended != "closed"
    return (conn.msgs_in, conn.msgs_out, conn.bytes_in, conn.bytes_out, conn.dropped, ended)


@dataclass(slots=True)
class Traffic:
    """What connections read and were sent, summed: messages and bytes each way."""

    msgs_in: int = 0
    bytes_in: int = 0
    msgs_out: int = 0
    bytes_out: int = 0

    def add(self, conn: Connection) -> None:
        """Add one connection's own counts."""
        self.msgs_in += conn.msgs_in
        self.bytes_in += conn.bytes_in
        self.msgs_out += conn.msgs_out
        self.bytes_out += conn.bytes_out

    def export(self) -> list[int]:
        """As a hand-over record keeps it (its layout of old: four numbers)."""
        return [self.msgs_in, self.bytes_in, self.msgs_out, self.bytes_out]

    @classmethod
    def adopt(cls, exported: list[int]) -> Traffic:
        return cls(*exported)


def gauges(server: Shown) -> Gauges:
    """A snapshot for the metrics collector (cost: one pass over the clients).

    The traffic counters are summed here from each connection's own counts
    (and those of the clients that have gone): the hot path never touches
    a shared counter.
    """
    queued = qbytes = big = bigbytes = blocked = dropping = 0
    totals = dataclasses.replace(server.departed)  # and every live connection's
    soft: dict[str, int] = {}
    hard: dict[str, int] = {}
    for conn in server.clients.values():
        totals.add(conn)
        dropping += conn.dropping
        count, nbytes = conn.queued
        queued += count
        qbytes += nbytes
        big = max(big, count)
        bigbytes = max(bigbytes, nbytes)
        soft_mode, hard_mode = conn.modes
        soft[soft_mode] = soft.get(soft_mode, 0) + 1
        hard[hard_mode] = hard.get(hard_mode, 0) + 1
        blocked += conn.pauses > 0
    up = server.upstream
    link = up.conn if up is not None else None
    return Gauges(
        messages_in=totals.msgs_in,
        bytes_in=totals.bytes_in,
        delivered=totals.msgs_out,
        bytes_out=totals.bytes_out,
        dropping_clients=dropping,
        clients=len(server.clients),
        users=len(server.accounts),
        patterns=len(server.index),
        distinct_patterns=server.index.distinct,
        queued_messages=queued,
        queued_bytes=qbytes,
        largest_queue_messages=big,
        largest_queue_bytes=bigbytes,
        soft_modes=soft,
        hard_modes=hard,
        blocked_publishers=blocked,
        is_relay=up is not None,
        upstream_connected=up is not None and up.connected,
        upstream_interest_patterns=up.interest_count if up is not None else 0,
        upstream_queue_messages=link.queued[0] if link is not None else 0,
        forwarded_up=link.msgs_out if link is not None else 0,
        forwarded_down=link.msgs_in if link is not None else 0,
    )


def who(server: Shown) -> dict[str, list[tuple[str, list[int], list[int]]]]:
    """Per child relay and per user: the bounded rows of ``accounting``
    (cost: one pass over the clients)."""
    by_relay: dict[str, tuple[list[int], list[int]]] = {}
    by_user: dict[str, tuple[list[int], list[int]]] = {}
    for conn in server.clients.values():
        counts = counters(conn)
        count, nbytes = conn.queued
        for rows, key in ((by_relay, conn.label), (by_user, str(conn.uid))):
            row = rows.get(key)
            if row is None:
                row = rows[key] = ([0] * len(counts), [0, 0, 0])
            total, gauges = row
            for i, v in enumerate(counts):
                total[i] += v
            gauges[0] += count
            gauges[1] += nbytes
            gauges[2] += 1
    now = time.monotonic()
    return {
        "relay": server.by_relay.rows(by_relay, now),
        "user": server.by_user.rows(by_user, now),
    }


def client_rows(server: Shown) -> list[dict[str, Any]]:
    """Every connection as ``/clients`` shows it (docs/observability.md)."""
    now = time.monotonic()
    prefix = (server.prefix or b"").decode("utf-8", "replace")
    rows = []
    for conn in server.clients.values():
        c = conn.creds
        count, nbytes = conn.queued
        soft_mode, hard_mode = conn.modes
        rows.append(
            {
                "cid": conn.cid,
                "pid": c.pid,
                "uid": c.uid,
                "gid": c.gid,
                "identity": prefix + c.identity().decode(),
                "relay": conn.label,
                "is_relay": conn.relay,
                "patterns": server.index.distinct_of(conn),
                "queued_messages": count,
                "queued_bytes": nbytes,
                "msgs_in": conn.msgs_in,
                "bytes_in": conn.bytes_in,
                "msgs_out": conn.msgs_out,
                "bytes_out": conn.bytes_out,
                "dropped": conn.dropped,
                "age": round(now - conn.since, 3),
                "soft": soft_mode,
                "hard": hard_mode,
                "paused": conn.pauses > 0,
                "dropping": conn.dropping,
            }
        )
    return rows
