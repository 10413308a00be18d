"""The bus's side of its NATS link (docs/nats.md).

Theory of operation.  The link's traffic is one ``Connection`` on one end
of a ``SOCK_SEQPACKET`` socket pair; a ``NatsBridge`` (``bus.natsbridge``)
serves the other end from a thread of its own.  To the bus the link is
what a relay's upstream link is: one more recipient in the subscription
index, its *quiet* holder, holding the patterns the other hosts want, so one
match serves local subscribers and NATS alike, and a message goes to NATS
only when another host wants it.  Its connection reads, batches, queues
(bounded, in order) and drops (counted, with the drop episode) exactly as a
client's does, and as the upstream link's it is never paused: no publisher
waits for NATS.

* The index's first/last callbacks become ``SUB``/``UNSUB`` notices on the
  connection (coalesced per pattern); the bridge subscribes on NATS and tells
  the other hosts.
* What the bridge sends back is ``MSG`` from other hosts (routed like any
  publish, never back to the link: its echo is off) and ``SUB``/``UNSUB``
  as the other hosts' interest changes, taken as the link's holds
  (``UpstreamHost.upstream_interest``, which also tells our relays).
"""

from __future__ import annotations

import socket
import time
from typing import Any

import gevent

from sbus_relay.ops.config import ServerConfig
from sbus_relay.protocol import codec, natsorigins
from sbus_relay.protocol.flood import OutboundQueue
from sbus_relay.protocol.limits import SEND_BUFFER

from .connection import Connection
from .natsbridge import NatsBridge
from .natstobus import SETTLED
from .upstream import UpstreamHost, link_connection

#: Seconds between two looks at the bridge while waiting for it to join.
JOIN_POLL = 0.005
#: Seconds a new process of a live upgrade waits for its link to join NATS
#: before it lets the old one go (well within the hand-over's UPGRADE_TIMEOUT).
JOIN_WAIT = 3.0
#: What the link holds until the other hosts' interest is known: every public key.
EVERYTHING = b""
_SETTLED = codec.encode_cmsg(SETTLED)


class NatsLink:
    """A bus's link to NATS: its connection to the bridge, and the bridge."""

    def __init__(self, host: UpstreamHost, config: ServerConfig, log: Any) -> None:
        nats = config.nats
        assert nats is not None
        self.host = host
        self.name = nats.host or config.instance
        self.log = log.bind(link="nats")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (ours, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            s.setblocking(False)
        queue = OutboundQueue(nats.queue_bytes, nats.queue_messages, upward=True)
        self.conn = link_connection(host, self, queue, self.log)
        self.conn.label = "nats"
        self.conn.attach(ours.detach())
        self.conn.packs = True  # the bridge reads packed batches
        self.bridge = NatsBridge(theirs, nats, self.name, log)
        self.started = False
        self.join_wait = JOIN_WAIT
        #: holds taken over from the process before a live upgrade (``adopt``)
        self.adopted: dict[bytes, int] = {}
        self.holding = False  # holds every public key until the others' interest is known

    def adopt(self, holds: dict[bytes, int]) -> None:
        """A live upgrade: hold what the old process's link held (the other
        hosts' interest as it knew it) until this link's own view is in."""
        for pattern, count in holds.items():
            for _ in range(count):
                self.host.upstream_interest(pattern, True)
        self.adopted = holds

    def start(self) -> None:
        """Tell the bridge every local pattern, then let it join NATS."""
        for pattern in self.host.local_patterns():
            self.conn.notify(pattern, True)
        # until the bridge says the other hosts' interest is known, every public
        # key goes to NATS (where only hosts subscribed to it get it)
        self.host.upstream_interest(EVERYTHING, True)
        self.holding = True
        self.started = True
        self.conn.opened()
        self.bridge.start()
        identity = self.bridge.identity
        self.log.info(
            "nats.starting",
            host=self.name,
            servers=list(self.bridge.config.servers),
            identities=identity.decode() if identity is not None else None,
        )

    def wait_joined(self, timeout: float) -> bool:
        """Wait (cooperatively) until the link is on NATS with every local
        pattern subscribed there: a new process of a live upgrade does, before
        the old one lets its own link go.  False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        written = None
        while time.monotonic() < deadline:
            if written is None and self.bridge.connected and not self.conn._has_notices():
                written = time.monotonic()  # every SUB is in the bridge's socket
            if written is not None and self.bridge.synced > written:
                return True
            gevent.sleep(JOIN_POLL)
        return False

    def stop(self) -> None:
        """Leave NATS (the other hosts are told) and close the link."""
        self.bridge.stop()
        self.conn.close("server_stopping")

    def subscribe(self, pattern: bytes) -> None:
        """A local pattern went 0 -> 1."""
        if self.started:  # before that, ``start`` sends the whole set
            self.conn.notify(pattern, True)

    def unsubscribe(self, pattern: bytes) -> None:
        """A local pattern went 1 -> 0."""
        if self.started:
            self.conn.notify(pattern, False)

    # --- the connection's handler -------------------------------------------------

    def handle(self, conn: Connection, packet: bytes) -> None:
        """The other hosts' interest changed (the bridge sends only SUB/UNSUB besides MSG)."""
        if packet.startswith(codec.SUB):
            self.host.upstream_interest(packet[len(codec.SUB) :], True)
        elif packet.startswith(codec.UNSUB):
            self.host.upstream_interest(packet[len(codec.UNSUB) :], False)
        elif packet == _SETTLED and self.holding:
            self.holding = False
            self.host.upstream_interest(EVERYTHING, False)
            for pattern, count in self.adopted.items():
                for _ in range(count):
                    self.host.upstream_interest(pattern, False)
            self.adopted = {}

    def lost(self, conn: Connection, reason: str, detail: str) -> None:
        """The bridge's end closed: the bridge has ended (its log says why)."""
        self.log.error("nats.link_lost", reason=reason, detail=detail)
        conn.close(reason, detail)

    def forget(self, conn: Connection) -> None:
        """The link's connection closed for good."""

    # --- what it shows ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The link as ``/healthz``, ``/clients``, ``top`` and the metrics show it."""
        b = self.bridge
        count, nbytes = self.conn.queued
        return {
            "host": self.name,
            "state": b.state,
            "connected": b.connected,
            "server": b.server,
            "sent": b.sent,
            "sent_bytes": b.sent_bytes,
            "received": b.received,
            "received_bytes": b.received_bytes,
            "drops": {"queue_overflow": self.conn.dropped, **b.drops},
            "unconfirmed": b.unconfirmed,
            "unconfirmed_total": b.unconfirmed_total,
            "queued_messages": count,
            "queued_bytes": nbytes,
            "to_bus_queued": b.to_bus_queued,
            "reconnects": b.reconnects,
            "rtt": b.rtt,
            "subscriptions": b.subscriptions,
            "remote_hosts": b.remote_hosts,
            "silent_hosts": b.silent_hosts,
            "remote_patterns": b.remote_patterns,
            "settled": not self.holding,
            **self._fleet(),
        }

    def _fleet(self) -> dict[str, Any]:
        """What came from each other host: delivered, lost, refused (docs/nats.md)."""
        b = self.bridge
        rows = b.origins.rows()
        lost = sum(sum(r[1 : 1 + len(natsorigins.CAUSES)]) for r in rows.values())
        return {
            "seq": b.ledger.seq,
            "lost": lost,
            "origins": b.origins.summary(),
            # per label (hosts heard first, then "other"): every count by name
            "origin_counts": {
                k: dict(zip(natsorigins.ROW, r, strict=True)) for k, r in rows.items()
            },
            "malformed": b.origins.malformed,
            "refused_announcements": b.remote.refused,
            "own": b.origins.own,
            "slow_consumer": b.slow_consumer,
        }
