"""The metrics HTTP server of one bus: ``/metrics``, ``/healthz`` and ``/clients``.

What it owns: the HTTP server of /metrics, /healthz and /clients.  What it may
touch: its listening socket, the collector and the rows it is given.

Served by gevent's ``pywsgi`` in the bus's own hub, from a socket bound before
the bus daemonises (``bind_metrics``).  ``/metrics`` is the registry of
``collector``; ``/clients`` lists the connections themselves, bounded per
answer (``ops.clients``).  Access logging is off: Prometheus scrapes every few
seconds and would drown the bus's own events.
"""

from __future__ import annotations

import errno
import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from gevent.pywsgi import WSGIServer
from prometheus_client import CollectorRegistry, make_wsgi_app

from sbus_relay import __version__
from sbus_relay.protocol.errors import AddressError, ConfigError
from sbus_relay.protocol.limits import LISTEN_BACKLOG
from sbus_relay.protocol.stats import Gauges, Stats

from . import clients
from .collector import WhoRow, build_registry
from .config import parse_host_port
from .natsmetrics import NatsCollector

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

log = structlog.get_logger("sbus_relay.metrics")


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


_Body = list[bytes]


#: ``/clients``' source: the server's own block and one row per connection.
ClientsFn = Callable[[], tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]


def _wsgi_app(
    registry: CollectorRegistry,
    health_fn: Callable[[], bool],
    clients_fn: ClientsFn | None,
    detail_fn: Callable[[], str] | None = None,
    stats: Stats | None = None,
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
        except Exception:  # a bug of ours: logged once, counted (metrics_clients)
            if stats is None or stats.bug("metrics_clients"):
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
            except Exception:  # a bug of ours: logged once, counted (metrics_health)
                if stats is None or stats.bug("metrics_health"):
                    log.exception("metrics.health_failed")
                healthy = False
            status = "200 OK" if healthy else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            detail = detail_fn() if detail_fn is not None and healthy else ""
            return [(b"ok\n" if healthy else b"unhealthy\n") + detail.encode()]
        if path == "/clients" and clients_fn is not None:
            return clients_answer(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"sbus_relay: /metrics /healthz /clients\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found\n"]

    return app


#: What to do about a metrics port another program holds.
BUSY_HINT = (
    " (another program listens there: give another --metrics HOST:PORT"
    ", or 'metrics:' in the config)"
)


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
        hint = BUSY_HINT if exc.errno == errno.EADDRINUSE else ""
        raise AddressError(f"cannot serve metrics on {text}: {exc.strerror or exc}{hint}") from None
    sock.set_inheritable(False)
    sock.setblocking(False)  # gevent's server accepts only when it is readable
    return sock


def serve(
    host: str | socket.socket,
    port: int,
    registry: CollectorRegistry,
    health_fn: Callable[[], bool],
    clients_fn: ClientsFn | None = None,
    detail_fn: Callable[[], str] | None = None,
    stats: Stats | None = None,
) -> WSGIServer:
    """Start serving ``/metrics`` and ``/healthz`` in the current gevent hub.

    Returns the started ``WSGIServer``; ``server.server_port`` is the bound port
    (useful with port 0), ``server.stop()`` stops it.  Access logging is off:
    Prometheus scrapes every few seconds and would drown the bus's own events.
    """
    listener: Any = host if isinstance(host, socket.socket) else (host, port)
    app = _wsgi_app(registry, health_fn, clients_fn, detail_fn, stats)
    server = WSGIServer(listener, app, log=None)
    server.start()
    return server


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
    # ``config.instance`` is read at each use: a reload may rename the server
    registry = build_registry(server.stats, server.gauges, lambda: config.instance, server.who)
    # the NATS link, where there is one (docs/nats.md): its own series and lines
    nats = getattr(server, "nats", None)
    nats_state: Callable[[], dict[str, Any]] | None = nats.state if nats is not None else None
    if nats_state is not None:
        registry.register(NatsCollector(nats_state, lambda: config.instance, server.stats))

    def detail() -> str:
        if nats_state is None:
            return ""
        link = nats_state()
        up = "up" if link["connected"] else "down"
        return "nats: %s %s %s\n" % (up, link["state"], link["server"] or "-")

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
            "nats": nats_state() if nats_state is not None else None,
        }
        return block, server.client_rows()

    wsgi = serve(
        listener if listener is not None else host,
        port,
        registry,
        healthy,
        clients_now,
        detail,
        server.stats,
    )
    log.info("metrics.listening", host=host, port=wsgi.server_port)
    return wsgi
