"""Prometheus metrics and a health check for one server, served by gevent.

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
never one per client, key or pattern.  ``/clients`` lists the connections
themselves, bounded per answer (``ops.clients``).  The full list is in
``docs/observability.md``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from gevent.pywsgi import WSGIServer
from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
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
from sbus_relay.protocol.errors import AddressError, ConfigError
from sbus_relay.protocol.flood import HARD_MODES, SOFT_MODES
from sbus_relay.protocol.limits import LISTEN_BACKLOG
from sbus_relay.protocol.stats import QUEUE_WAIT_BUCKETS, Gauges, Stats

from . import clients, logsetup

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

log = structlog.get_logger("sbus_relay.metrics")

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


class _EventLike(Protocol):
    def is_set(self) -> bool: ...


# Read-only properties, so that a frozen ``ServerConfig`` satisfies them.
class _ServerLike(Protocol):
    """What ``serve_from_config`` needs of a ``Server`` (design.md, server)."""

    @property
    def stats(self) -> Stats: ...
    @property
    def stopped(self) -> _EventLike: ...
    def gauges(self) -> Gauges: ...
    def who(self) -> Mapping[str, Sequence[WhoRow]]: ...
    def client_rows(self) -> list[dict[str, Any]]: ...
    @property
    def started(self) -> float: ...


class _ConfigLike(Protocol):
    """What ``serve_from_config`` needs of a ``ServerConfig``."""

    @property
    def metrics(self) -> str | None: ...
    @property
    def instance(self) -> str: ...


class MetricsCollector(Collector):
    """A custom collector that turns ``Stats`` and ``Gauges`` into families on scrape.

    ``instance`` is the server's own name (``config.instance``); it is exported
    as the ``name`` label of ``sbus_build_info`` only.  The ``instance`` label
    itself belongs to Prometheus (set per target in ``configs/prometheus.yml``),
    so the exposition never carries one and nothing gets renamed to
    ``exported_instance``.
    """

    def __init__(
        self,
        stats: Stats,
        gauges_fn: Callable[[], Gauges],
        instance: str,
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
        except Exception:
            # A failing snapshot must not cost the counters: export what we can,
            # and leave the gauges absent rather than reporting a false zero.
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
            except Exception:
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
        info.add_metric([__version__, role, self._instance], 1)
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
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def _labelled_gauge(
    name: str, doc: str, label: str, values: Mapping[str, int]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
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
    instance: str,
    who_fn: Callable[[], Mapping[str, Sequence[WhoRow]]] | None = None,
) -> CollectorRegistry:
    """A fresh registry with the sbus collector and the process collector.

    Never the global default registry: each server (and each test) has its own.
    """
    registry = CollectorRegistry()
    registry.register(MetricsCollector(stats, gauges_fn, instance, who_fn))
    ProcessCollector(registry=registry)
    return registry


# -- HTTP ----------------------------------------------------------------------

_Body = list[bytes]


#: ``/clients``' source: the server's own block and one row per connection.
ClientsFn = Callable[[], tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]


def _wsgi_app(
    registry: CollectorRegistry, health_fn: Callable[[], bool], clients_fn: ClientsFn | None
) -> Callable[[WSGIEnvironment, StartResponse], _Body]:
    metrics_app = make_wsgi_app(registry)

    def clients_answer(environ: WSGIEnvironment, start_response: StartResponse) -> _Body:
        status = "200 OK"
        try:
            query = clients.parse(environ.get("QUERY_STRING", ""))
            assert clients_fn is not None
            server, rows = clients_fn()
            doc: Any = clients.answer(query, server, rows)
        except clients.QueryError as e:
            status, doc = "400 Bad Request", {"error": str(e)}
        except Exception:
            log.exception("metrics.clients_failed")
            status, doc = "500 Internal Server Error", {"error": "snapshot failed"}
        body = json.dumps(doc, separators=(",", ":")).encode()
        start_response(status, [("Content-Type", "application/json")])
        return [body]

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> _Body:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body: Any = metrics_app(environ, start_response)
            return list(body)
        if path == "/healthz":
            try:
                healthy = bool(health_fn())
            except Exception:
                log.exception("metrics.health_failed")
                healthy = False
            status = "200 OK" if healthy else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n" if healthy else b"unhealthy\n"]
        if path == "/clients" and clients_fn is not None:
            return clients_answer(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"sbus_relay: /metrics /healthz /clients\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found\n"]

    return app


def bind_metrics(text: str) -> socket.socket:
    """A TCP socket listening at ``HOST:PORT`` for the metrics endpoint.

    Bound before the server daemonises, so that a busy or forbidden port is
    one ``AddressError`` naming the address.
    """
    host, port = parse_host_port(text)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise AddressError(f"cannot serve metrics on {text}: {exc.strerror or exc}") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise AddressError(f"cannot serve metrics on {text}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)
    sock.setblocking(False)  # gevent's server accepts only when it is readable
    return sock


def serve(
    host: str | socket.socket,
    port: int,
    registry: CollectorRegistry,
    health_fn: Callable[[], bool],
    clients_fn: ClientsFn | None = None,
) -> WSGIServer:
    """Start serving ``/metrics`` and ``/healthz`` in the current gevent hub.

    Returns the started ``WSGIServer``; ``server.server_port`` is the bound port
    (useful with port 0), ``server.stop()`` stops it.  Access logging is off:
    Prometheus scrapes every few seconds and would drown the bus's own events.
    """
    listener: Any = host if isinstance(host, socket.socket) else (host, port)
    server = WSGIServer(listener, _wsgi_app(registry, health_fn, clients_fn), log=None)
    server.start()
    return server


def parse_host_port(text: str, source: str = "metrics") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too); raises ``ConfigError`` naming ``source``."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(source, "metrics", f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(source, "metrics", f"port is not a number in {text!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(source, "metrics", f"port out of range in {text!r}")
    return host, port


def serve_from_config(
    config: _ConfigLike, server: _ServerLike, *, listener: socket.socket | None = None
) -> WSGIServer:
    """Serve metrics for ``server`` at ``config.metrics``; the CLI stops the result.

    Healthy means the server has not stopped and can still produce its gauges
    snapshot; a relay whose upstream is away is still healthy (it keeps
    the local bus running, docs/protocol.md, Relays) and says so in ``sbus_upstream_connected``.
    """
    if not config.metrics:
        raise ConfigError("config", "metrics", "no HOST:PORT to serve metrics on")
    host, port = parse_host_port(config.metrics)
    registry = build_registry(server.stats, server.gauges, config.instance, server.who)

    def healthy() -> bool:
        if server.stopped.is_set():
            return False
        server.gauges()  # raises (-> 503) if the server's state is broken
        return True

    def clients_now() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        gauges = server.gauges()
        now = time.time()
        block = {
            "instance": config.instance,
            "role": "relay" if gauges.is_relay else "master",
            "version": __version__,
            "time": round(now, 3),
            "uptime": round(now - server.started, 3),
            "clients": gauges.clients,
            "upstream_connected": gauges.upstream_connected if gauges.is_relay else None,
        }
        return block, server.client_rows()

    wsgi = serve(listener if listener is not None else host, port, registry, healthy, clients_now)
    log.info("metrics.listening", host=host, port=wsgi.server_port)
    return wsgi
