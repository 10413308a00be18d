"""The Prometheus collector of one server: its counters and gauges as metric families.

What it owns: the metric families of one server.  What it may touch: its Stats
and the gauges and who functions it is given, read only.

The hot path only bumps plain integers in ``Stats``.  On each scrape
``MetricsCollector.collect`` reads those integers and a ``Gauges`` snapshot and
builds fresh metric families.  Because the scrape runs in a greenlet of the same
hub as the bus and ``collect`` never yields, it sees one consistent instant of
the counters without any lock.

Naming follows the Prometheus conventions: an ``sbus_`` prefix, base units in
the name (``_bytes``, ``_seconds``), ``_total`` on counters, and only labels
with a small fixed set of values (``type``, ``reason``, ``mode``,
``direction``), or a bounded one: the per-relay and per-user families carry
``relay``/``uid`` for the top N plus ``other`` (``protocol.accounting``) --
never one per client, key or pattern.  The full list is in
``docs/observability.md``; ``metrics_server`` serves it over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sbus_relay import __version__
from sbus_relay.protocol.accounting import COUNTERS, GAUGES
from sbus_relay.protocol.flood import HARD_MODES, SOFT_MODES
from sbus_relay.protocol.stats import QUEUE_WAIT_BUCKETS, Gauges, Stats

from . import logsetup

log = structlog.get_logger("sbus_relay.metrics")
_Family = TypeVar("_Family", CounterMetricFamily, GaugeMetricFamily)

#: One exported row of a per-who dimension: label, counters, gauges (``accounting``).
WhoRow = tuple[str, Sequence[int], Sequence[int]]
#: The per-who dimensions: series prefix and label name.
_WHO = {"relay": ("sbus_relay_", "relay"), "user": ("sbus_user_", "uid")}
_WHO_HELP = {
    "messages_in": "MSG packets received from them",
    "messages_out": "messages delivered to them",
    "bytes_in": "bytes received from them",
    "bytes_out": "bytes sent to them",
    "dropped_messages": "messages dropped for them",
    "disconnects": "their connections closed by the server for a reason (not by themselves)",
    "queued_messages": "messages waiting in their queues now",
    "queued_bytes": "bytes waiting in their queues now",
    "connections": "their connections now",
}

#: ``le`` label values of the queue-wait histogram, formatted once.
_QUEUE_WAIT_LE = [floatToGoString(b) for b in QUEUE_WAIT_BUCKETS] + ["+Inf"]


class MetricsCollector(Collector):
    """A custom collector that turns ``Stats`` and ``Gauges`` into families on scrape.

    ``instance`` is the server's own name (``config.instance``), or a function
    returning it as it is now (a reload may change it); it is exported as the
    ``name`` label of ``sbus_build_info`` only.  The ``instance`` label
    itself belongs to Prometheus (set per target in ``configs/prometheus.yml``),
    so the exposition never carries one and nothing gets renamed to
    ``exported_instance``.
    """

    def __init__(
        self,
        stats: Stats,
        gauges_fn: Callable[[], Gauges],
        instance: str | Callable[[], str],
        who_fn: Callable[[], Mapping[str, Sequence[WhoRow]]] | None = None,
    ) -> None:
        self._stats = stats
        self._gauges_fn = gauges_fn
        self._instance = instance
        self._who_fn = who_fn

    def describe(self) -> Iterable[Metric]:
        # Returning nothing keeps ``register`` from calling ``collect`` (and so
        # the server's ``gauges()``) before the server is running.
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield every ``sbus_`` family; called by the registry on each scrape."""
        try:
            gauges: Gauges | None = self._gauges_fn()
        except Exception:  # a bug of ours: logged once, counted (metrics_gauges)
            # A failing snapshot must not cost the counters: export what we can,
            # and leave the gauges absent rather than reporting a false zero.
            if self._stats.bug("metrics_gauges"):
                log.exception("metrics.gauges_failed")
            gauges = None
        yield from self._counters(self._stats)
        yield self._queue_wait(self._stats)
        if gauges is not None:
            yield from self._traffic(self._stats, gauges)
            # Every known flood mode is exported, at 0 when no client uses it, so
            # a series exists before the first client switches (docs/protocol.md, Flood control).
            yield from self._gauges(gauges)
            if gauges.is_relay:
                yield from self._upstream(self._stats, gauges)
        if self._who_fn is not None:
            try:
                who = self._who_fn()
            except Exception:  # a bug of ours: logged once, counted (metrics_who)
                if self._stats.bug("metrics_who"):
                    log.exception("metrics.who_failed")
            else:
                yield from self._who(who)
        yield self._build_info(gauges)

    # -- families -----------------------------------------------------------

    def _build_info(self, gauges: Gauges | None) -> Metric:
        role = "unknown" if gauges is None else ("relay" if gauges.is_relay else "master")
        info = GaugeMetricFamily(
            "sbus_build_info",
            "Always 1; labels give the version, role and the server's configured name.",
            labels=["version", "role", "name"],
        )
        name = self._instance if isinstance(self._instance, str) else self._instance()
        info.add_metric([__version__, role, name], 1)
        return info

    @staticmethod
    def _traffic(stats: Stats, g: Gauges) -> Iterator[Metric]:
        """The traffic counters: each connection counts its own, summed on scrape."""
        yield _labelled_counter(
            "sbus_packets_received_total",
            "Packets read from clients, by type (invalid = protocol error).",
            "type",
            {**stats.packets_in, "msg": g.messages_in},
        )
        yield _counter(
            "sbus_messages_delivered_total",
            "Copies of MSG packets handed to a client's socket.",
            g.delivered,
        )
        yield _counter("sbus_received_bytes_total", "Bytes read from clients.", g.bytes_in)
        yield _counter("sbus_sent_bytes_total", "Bytes written to clients.", g.bytes_out)
        yield _gauge(
            "sbus_clients_dropping",
            "Clients whose messages are being dropped now (a slow consumer's drop episode).",
            g.dropping_clients,
        )

    @staticmethod
    def _counters(stats: Stats) -> Iterator[Metric]:
        yield _labelled_counter(
            "sbus_messages_dropped_total",
            "Messages not delivered to a client, by reason.",
            "reason",
            stats.drops,
        )
        yield _labelled_counter(
            "sbus_disconnects_total",
            "Clients disconnected, by reason.",
            "reason",
            stats.disconnects,
        )
        yield _counter(
            "sbus_connections_accepted_total",
            "Client connections accepted.",
            stats.connections_accepted,
        )
        yield _counter(
            "sbus_connections_refused_total",
            "Peers closed at accept (not an allowed user, too many clients, a user's quota).",
            stats.connections_refused,
        )
        yield _labelled_counter(
            "sbus_refusals_total",
            "Connections and patterns refused, by reason (client limits and per-user quotas).",
            "reason",
            stats.refusals,
        )
        yield _counter(
            "sbus_log_lines_suppressed_total",
            "Repeated misbehaviour log lines of a client summarised instead of written.",
            stats.log_lines_suppressed,
        )
        yield _labelled_counter(
            "sbus_internal_errors_total",
            "Bugs of ours caught where they cost only one task (a client, a reload, a scrape),"
            " by where; each is logged with its traceback the first time.",
            "where",
            stats.internal_errors,
        )
        yield _counter(
            "sbus_accept_errors_total",
            "accept(2) failures (EMFILE, ENFILE ...).",
            stats.accept_errors,
        )
        yield _counter(
            "sbus_log_lines_dropped_total",
            "Log lines dropped because they could not be written (closed pipe, full disk).",
            logsetup.dropped_lines(),
        )
        yield _counter(
            "sbus_unknown_unsubscribes_total",
            "UNSUB of a pattern the client did not hold (ignored).",
            stats.unknown_unsubscribes,
        )
        yield _labelled_counter(
            "sbus_config_reloads_total",
            "Reloads of the config file (SIGHUP), by result: applied or refused.",
            "result",
            stats.reloads,
        )
        yield _gauge(
            "sbus_config_last_reload_successful",
            "1 unless the last reload was refused (the server then runs on the config before).",
            int(stats.last_reload_ok),
        )

    @staticmethod
    def _who(who: Mapping[str, Sequence[WhoRow]]) -> Iterator[Metric]:
        """Per child relay and per user, top N plus ``other`` (docs/observability.md)."""
        for dimension, rows in who.items():
            prefix, label = _WHO[dimension]
            for i, field in enumerate(COUNTERS):
                doc = "Per %s: %s." % (label, _WHO_HELP[field])
                yield _labelled_counter(prefix + field, doc, label, {k: c[i] for k, c, _ in rows})
            for i, field in enumerate(GAUGES):
                doc = "Per %s: %s." % (label, _WHO_HELP[field])
                yield _labelled_gauge(prefix + field, doc, label, {k: g[i] for k, _, g in rows})

    @staticmethod
    def _queue_wait(stats: Stats) -> Metric:
        # Stats keeps per-bucket counts (cheap to bump); Prometheus wants them
        # cumulative, with the +Inf bucket equal to the total count.
        buckets: list[tuple[str, float]] = []
        running = 0
        for le, count in zip(_QUEUE_WAIT_LE, stats.queue_wait_counts, strict=True):
            running += count
            buckets.append((le, running))
        return HistogramMetricFamily(
            "sbus_queue_wait_seconds",
            "Time a message spent in a client's outgoing queue before its socket took it.",
            buckets=buckets,
            sum_value=stats.queue_wait_sum,
        )

    @staticmethod
    def _gauges(g: Gauges) -> Iterator[Metric]:
        yield _gauge("sbus_clients_connected", "Clients connected now.", g.clients)
        yield _gauge("sbus_users_connected", "Distinct users (uids) connected now.", g.users)
        yield _gauge(
            "sbus_patterns_stored", "Subscriptions stored, duplicates counted.", g.patterns
        )
        yield _gauge(
            "sbus_patterns_distinct", "Distinct subscription patterns.", g.distinct_patterns
        )
        yield _gauge(
            "sbus_queued_messages",
            "Messages waiting in all clients' outgoing queues.",
            g.queued_messages,
        )
        yield _gauge(
            "sbus_queued_bytes", "Bytes waiting in all clients' outgoing queues.", g.queued_bytes
        )
        yield _gauge(
            "sbus_largest_queue_messages",
            "Messages in the longest single client queue.",
            g.largest_queue_messages,
        )
        yield _gauge(
            "sbus_largest_queue_bytes",
            "Bytes in the largest single client queue.",
            g.largest_queue_bytes,
        )
        yield _labelled_gauge(
            "sbus_clients_soft_mode",
            "Clients per soft flood mode (blocking/soft/...).",
            "mode",
            _with_defaults(SOFT_MODES, g.soft_modes),
        )
        yield _labelled_gauge(
            "sbus_clients_hard_mode",
            "Clients per hard flood mode (blocking/hard/...).",
            "mode",
            _with_defaults(HARD_MODES, g.hard_modes),
        )
        yield _gauge(
            "sbus_blocked_publishers",
            "Publishers not being read because a block mode makes them wait.",
            g.blocked_publishers,
        )

    @staticmethod
    def _upstream(stats: Stats, g: Gauges) -> Iterator[Metric]:
        # Only relays export these: a master has no upstream, and a constant
        # "disconnected" there would page whoever alerts on relays.
        yield _gauge(
            "sbus_upstream_connected",
            "1 while the relay is connected to its upstream, else 0.",
            1 if g.upstream_connected else 0,
        )
        yield _counter(
            "sbus_upstream_reconnects_total",
            "Successful reconnections to the upstream after a loss.",
            stats.upstream_reconnects,
        )
        yield _labelled_counter(
            "sbus_upstream_forwarded_messages_total",
            "Messages forwarded to the upstream (up) and from it to local clients (down).",
            "direction",
            {"up": g.forwarded_up, "down": g.forwarded_down},
        )
        yield _gauge(
            "sbus_upstream_interest_patterns",
            "Patterns the upstream reported wanted (the interest extension).",
            g.upstream_interest_patterns,
        )
        yield _gauge(
            "sbus_upstream_queued_messages",
            "Upward messages waiting for the upstream to come back.",
            g.upstream_queue_messages,
        )


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _labelled_counter(
    name: str, doc: str, label: str, values: Mapping[str, int]
) -> CounterMetricFamily:
    return _labelled(CounterMetricFamily(name, doc, labels=[label]), values)


def _labelled_gauge(
    name: str, doc: str, label: str, values: Mapping[str, int]
) -> GaugeMetricFamily:
    return _labelled(GaugeMetricFamily(name, doc, labels=[label]), values)


def _labelled(family: _Family, values: Mapping[str, int]) -> _Family:
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def _with_defaults(names: Iterable[str], values: Mapping[str, int]) -> dict[str, int]:
    """Every known mode at 0, then the server's counts (which may name others)."""
    merged = dict.fromkeys(names, 0)
    merged.update(values)
    return merged


# -- registry ----------------------------------------------------------------


def build_registry(
    stats: Stats,
    gauges_fn: Callable[[], Gauges],
    instance: str | Callable[[], str],
    who_fn: Callable[[], Mapping[str, Sequence[WhoRow]]] | None = None,
) -> CollectorRegistry:
    """A fresh registry with the sbus collector and the process collector.

    Never the global default registry: each server (and each test) has its own.
    """
    registry = CollectorRegistry()
    registry.register(MetricsCollector(stats, gauges_fn, instance, who_fn))
    ProcessCollector(registry=registry)
    return registry
