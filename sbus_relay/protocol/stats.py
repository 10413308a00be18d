"""Plain-integer counters of one server, read by the metrics collector on scrape.

What it owns: one server's plain counters.  What it may touch: nothing.

Each connection counts its own traffic; what is counted here happens off the
hot path (drops, disconnects, refusals, control packets), and nothing takes a
lock.  ``ops.collector`` turns a ``Stats`` plus a ``Gauges`` snapshot (which
also carries the traffic totals, summed from the connections on scrape) into
Prometheus families.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Packet types counted in ``Stats.packets_in`` (MSG packets are counted by
#: each connection and summed on scrape: ``Gauges.messages_in``).
PACKET_TYPES = ("sub", "unsub", "cmsg", "invalid")

#: Why a message was not delivered to a client (``Stats.drops`` keys).
DROP_REASONS = (
    "soft_discard",  # blocking/soft/discard and the socket was full
    "hard_discard",  # over the hard limit in blocking/hard/discard
    "slow_client_disconnected",  # queued messages lost when a slow client was cut off
    "client_gone",  # queued messages lost when a client disconnected by itself
    "reserved_key",  # a publish used '!' in a reserved way (docs/protocol.md)
    "upstream_queue_overflow",  # relay: upward queue full (docs/protocol.md, "Relays")
)

#: Why a client was disconnected (``Stats.disconnects`` keys).
DISCONNECT_REASONS = (
    "closed",  # the peer closed its end
    "protocol_error",  # unknown verb, malformed packet, over-long packet
    "secret_refused",  # a refused '!/cred/' subscription
    "reserved_pattern",  # '!' used in a reserved way in a pattern
    "too_many_patterns",  # over the per-client pattern limit
    "too_many_pattern_bytes",  # over the per-client limit on the bytes of its patterns
    "pattern_too_long",  # one pattern over MAX_PATTERN_LENGTH
    "pattern_too_deep",  # one pattern over MAX_PATTERN_SEGMENTS
    "user_pattern_quota",  # its user's patterns (count or bytes) are at their quota
    "slow_client",  # blocking/soft/error or blocking/hard/error
    "io_error",  # send/recv failed (ECONNRESET, EPIPE ...)
    "internal_error",  # a bug of ours while serving this client (logged with traceback)
    "server_stopping",  # the server shut down
    "upstream_identity_changed",  # an older relay of ours (no identity/follow): redo the handshake
    "user_not_allowed",  # a reload took its user off the allowed users
)

#: Outcomes of a configuration reload (``Stats.reloads`` keys).
RELOAD_RESULTS = (
    "applied",  # the config file was read again and taken
    "refused",  # it had an error: the server runs on as before
)

#: Why a connection or a pattern was refused (``Stats.refusals`` keys); a
#: refused pattern also disconnects the client, except a relay's.
REFUSAL_REASONS = (
    "user_not_allowed",  # not in -u
    "too_many_clients",  # the server's client limit
    "user_connection_quota",  # its user's connections are at their quota
    "too_many_patterns",
    "too_many_pattern_bytes",
    "pattern_too_long",
    "pattern_too_deep",
    "user_pattern_quota",
)

#: Where a bug of ours is caught at the edge of the one task it can cost, and
#: counted (``Stats.bug``): a client's read loop (the client is closed), a
#: reload (the bus keeps its config), and each part of the metrics server (that
#: scrape or answer lacks it).
INTERNAL_ERRORS = (
    "read_loop",
    "reload",
    "metrics_gauges",
    "metrics_who",
    "metrics_nats",
    "metrics_clients",
    "metrics_health",
)

#: Upper bounds (seconds) of the queue-wait histogram buckets.
QUEUE_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)


@dataclass
class Stats:
    """Counters only ever increase; gauges are taken from ``Gauges`` on scrape."""

    packets_in: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PACKET_TYPES, 0))
    drops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    disconnects: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(DISCONNECT_REASONS, 0)
    )
    connections_accepted: int = 0
    connections_refused: int = 0  # -u check failed, MAX_CLIENTS or a user's quota reached
    refusals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0))
    #: repeated misbehaviour log lines of a client summarised instead of written
    log_lines_suppressed: int = 0
    accept_errors: int = 0
    unknown_unsubscribes: int = 0
    # queue wait histogram: cumulative counts per bucket are computed on scrape
    queue_wait_counts: list[int] = field(
        default_factory=lambda: [0] * (len(QUEUE_WAIT_BUCKETS) + 1)
    )
    queue_wait_sum: float = 0.0
    # relay side (docs/protocol.md, "Relays")
    upstream_reconnects: int = 0
    reloads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RELOAD_RESULTS, 0))
    #: whether the last reload was taken (True until one is refused)
    last_reload_ok: bool = True
    #: bugs of ours caught, by where (``INTERNAL_ERRORS``)
    internal_errors: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(INTERNAL_ERRORS, 0)
    )

    def bug(self, where: str) -> bool:
        """A bug of ours was caught at ``where``: counted; True the first time
        there, when the caller logs it with its traceback (once: the count
        says how often it happened since)."""
        seen = self.internal_errors.get(where, 0)
        self.internal_errors[where] = seen + 1
        return seen == 0

    def observe_queue_wait(self, seconds: float) -> None:
        """Record how long one message waited in a client's queue (slow path only)."""
        i = 0
        for bound in QUEUE_WAIT_BUCKETS:
            if seconds <= bound:
                break
            i += 1
        self.queue_wait_counts[i] += 1
        self.queue_wait_sum += seconds


@dataclass(frozen=True)
class Gauges:
    """A point-in-time view of a server, computed on scrape by ``Server.gauges()``."""

    # counters, summed on scrape from every connection's own counts
    messages_in: int = 0  # MSG packets read from clients
    bytes_in: int = 0
    #: copies of MSG packets handed to a client's socket
    delivered: int = 0
    bytes_out: int = 0
    forwarded_up: int = 0  # relay: messages sent to the upstream
    forwarded_down: int = 0  # relay: messages that came from it
    # gauges
    #: clients whose messages are being dropped now (an open drop episode)
    dropping_clients: int = 0
    clients: int = 0
    users: int = 0  # distinct uids connected
    patterns: int = 0  # stored patterns, duplicates counted
    distinct_patterns: int = 0
    queued_messages: int = 0
    queued_bytes: int = 0
    largest_queue_messages: int = 0
    largest_queue_bytes: int = 0
    #: clients per soft mode name ("queue", "discard", "block", "error")
    soft_modes: dict[str, int] = field(default_factory=dict)
    #: clients per hard mode name ("discard", "block", "error")
    hard_modes: dict[str, int] = field(default_factory=dict)
    #: publishers currently paused by a block mode
    blocked_publishers: int = 0
    is_relay: bool = False
    upstream_connected: bool = False
    upstream_interest_patterns: int = 0
    upstream_queue_messages: int = 0
