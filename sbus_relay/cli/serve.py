"""Run a bus: a master, or a relay with --upstream (also what ``sbusd`` runs).

The order matters (docs/protocol.md, Addresses): resolve the listener and bind it *before*
daemonising, so an address in use is reported on the terminal with a non-zero
status; print a random abstract address before stdout is closed; fork before
anything starts gevent's hub; and remove the socket file and pid file however
the server stops -- unless a newer process took the bus over.

A live upgrade (docs/deploy.md, "Upgrade"): on SIGUSR2 a bus starts the
installed version of itself, the same command line with ``$SBUS_TAKE_OVER``
set; that process, fully initialised, takes the running bus over
(``ops.handover``: every socket and connection's state) instead of binding,
tells systemd its pid, and serves on.  A bus run by ``sbus-relay up`` leaves
upgrades to ``up`` (``$SBUS_SUPERVISED``), which starts the new process itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any, cast

from sbus_relay.ops import logsetup
from sbus_relay.ops.addresses import (
    MODE_GROUP,
    MODE_OTHER,
    MODE_OWNER,
    answers,
    listen,
    parse_address,
    printable_name,
    systemd_listeners,
)
from sbus_relay.ops.config import ServerConfig, load_config
from sbus_relay.ops.daemon import (
    DaemonError,
    check_pidfile,
    close_stdin_stdout,
    daemonize,
    notify,
    remove_pidfile,
    stderr_is_a_file,
    write_pidfile,
)
from sbus_relay.ops.handover import SUPERVISED_ENV, TAKE_OVER_ENV
from sbus_relay.protocol.errors import AddressError
from sbus_relay.protocol.limits import UPGRADE_WAIT

from .options import (
    add_address_argument,
    add_config_argument,
    add_logging_arguments,
    add_metrics_argument,
    configure_logging,
)

#: Signals that stop the server cleanly (docs/protocol.md, Addresses).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The signal that upgrades a running bus in place (as nginx's binary upgrade).
UPGRADE_SIGNAL = signal.SIGUSR2

#: Flags of ServerConfig fields that take a value: field -> (flags, metavar, help);
#: the address, metrics and logging flags are the shared ones (``options``).
_VALUE_FLAGS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "pidfile": (("-p", "--pidfile"), "PIDFILE", "pid file when daemonised (/dev/null: none)"),
    "hard_limit_bytes": (("--hard-limit-bytes",), "SIZE", "per-client queue limit, e.g. 16MiB"),
    "hard_limit_messages": (("--hard-limit-messages",), "N", "per-client queue limit in messages"),
    "max_clients": (("--max-clients",), "N", "most clients connected at once"),
    "upstream": (("--upstream",), "ADDRESS", "be a relay of the bus at ADDRESS"),
    "upstream_queue_messages": (("--upstream-queue-messages",), "N", "upward queue bound"),
    "upstream_queue_bytes": (("--upstream-queue-bytes",), "SIZE", "upward queue bound in bytes"),
    "reconnect_min": (("--reconnect-min",), "SECONDS", "first upstream reconnect delay"),
    "reconnect_max": (("--reconnect-max",), "SECONDS", "largest upstream reconnect delay"),
    "instance": (("--instance",), "NAME", "this server's name in metrics (default: hostname)"),
    "accounting_top": (
        ("--accounting-top",),
        "N",
        "relays and users named in the per-who series (the rest: other)",
    ),
    "max_patterns_per_client": (
        ("--max-patterns-per-client",),
        "N",
        "distinct patterns one client may hold",
    ),
    "max_patterns_per_relay": (
        ("--max-patterns-per-relay",),
        "N",
        "distinct patterns a relay's connection may hold",
    ),
    "max_pattern_bytes_per_client": (
        ("--max-pattern-bytes-per-client",),
        "SIZE",
        "bytes of the patterns one client may hold",
    ),
    "user_connections": (("--user-connections",), "N", "connections one user may hold"),
    "user_patterns": (("--user-patterns",), "N", "patterns all of one user's clients may hold"),
    "user_pattern_bytes": (("--user-pattern-bytes",), "SIZE", "bytes of those patterns"),
    "user_queued_bytes": (("--user-queued-bytes",), "SIZE", "bytes queued for one user"),
}
#: Boolean fields: field -> (flags, help); each also gets --no-<name>.
_BOOL_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "foreground": (("-f", "--foreground"), "do not daemonise; stdin/stdout are closed"),
    "exit_when_empty": (("-c", "--exit-when-empty"), "exit once the last client has gone"),
    "remove_stale": (("-r", "--remove-stale"), "remove a stale socket file first"),
    "group_access": (("-g", "--group-access"), "let the socket's group connect"),
    "other_access": (("-o", "--other-access"), "let everyone connect"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for ``sbus-relay serve``: -C CONFIG and one flag per config field.

    ``-c`` means "exit when the last client leaves", as it does for ``sbusd``.
    """
    add_config_argument(parser)
    add_address_argument(parser, listen=True)
    add_metrics_argument(parser)
    add_logging_arguments(parser)
    for name, (flags, metavar, text) in _VALUE_FLAGS.items():
        parser.add_argument(*flags, dest=name, metavar=metavar, help=text)
    for name, (flags, text) in _BOOL_FLAGS.items():
        parser.add_argument(
            *flags, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text
        )
    parser.add_argument(
        "-u", "--user", dest="users", action="append", metavar="USER",
        help="allow USER (name or uid) to connect; repeatable",
    )  # fmt: skip


def config_from(args: argparse.Namespace) -> ServerConfig:
    """The server's config: the file (``-C``), then the flags over it."""
    config_path = getattr(args, "config", None)
    config = load_config(config_path) if config_path else ServerConfig()
    overrides = {f.name: getattr(args, f.name, None) for f in fields(ServerConfig)}
    return config.merged(**overrides)


def run(args: argparse.Namespace) -> int:
    """Load the config (file, then flags) and run the server until it stops."""
    return run_server(config_from(args))


def _listener(config: ServerConfig, log: Any = None) -> tuple[socket.socket, str, str | None]:
    """The listening socket, its printable address and the socket file we own.

    ``log`` (default: the package logger) hears about a non-socket file that
    ``remove_stale`` removed.
    """
    if log is None:
        import structlog

        log = structlog.get_logger("sbus_relay")
    address = parse_address(config.address)
    activated = systemd_listeners()
    if len(activated) > 1:
        raise AddressError(f"systemd passed {len(activated)} sockets; sbus serves exactly one")
    if activated:
        sock = activated[0]
        return sock, printable_name(sock) or "LISTEN_FDS", None
    mode = MODE_OWNER
    if config.group_access:
        mode |= MODE_GROUP
    if config.other_access:
        mode |= MODE_OTHER
    sock, printable = listen(
        address,
        mode=mode,
        remove_stale=config.remove_stale,
        warn=lambda line: log.warning("address.removed", detail=line),
    )
    if address.kind == "abstract" and address.name is None:
        # docs/protocol.md, Addresses: the chosen name goes to stdout, for the caller to pass on.
        sys.stdout.write(printable + "\n")
        sys.stdout.flush()
    return sock, printable, printable if address.kind == "path" else None


def run_server(config: ServerConfig) -> int:
    """Listen, (maybe) daemonise, serve until a signal or the last client leaves."""
    configure_logging(config.log_level, config.log_format, config.log_file)
    import structlog

    log = structlog.get_logger("sbus_relay").bind(instance=config.instance)
    # Until gevent's handlers are installed (after imports that take a while),
    # SIGTERM/SIGHUP must still mean "stop cleanly", not the default death.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    if os.environ.get(TAKE_OVER_ENV):
        return _take_over(config, log)
    if not config.foreground:
        check_pidfile(os.path.abspath(config.pidfile))  # another bus's: one line, nothing bound
    # Bound first, before the bus socket and before daemonising: a busy port
    # is one line on the terminal, never a bus that listens for a moment and
    # dies, nor a daemon that dies out of sight.
    web_sock = _metrics_listener(config) if config.metrics else None
    sock, printable, socket_file = _listener(config, log)
    pidfile = None
    status = 0
    handed_over = False
    try:
        if config.foreground:
            close_stdin_stdout()
            ready = None
        else:
            pidfile = os.path.abspath(config.pidfile)
            keep_stderr = config.log_file is None and stderr_is_a_file()
            ready = daemonize(pidfile, keep_stderr=keep_stderr)
            if config.log_file is None and not keep_stderr:
                # The caller's terminal or pipe is not ours: the system log takes over.
                configure_logging(config.log_level, config.log_format, logsetup.SYSLOG)
        handed_over = _serve(
            config, log, ready, socket_file, printable, listener=sock, web_sock=web_sock
        )
    except KeyboardInterrupt:
        pass  # a signal before our handlers were installed: still a clean stop
    except DaemonError:
        status = 1  # the parent that is still on the terminal reports why
    finally:
        if not handed_over:
            _clean_up(socket_file, pidfile)
    log.info("exited", address=printable, status=status, handed_over=handed_over)
    return status


def _clean_up(socket_file: str | None, pidfile: str | None) -> None:
    """Remove the socket file and pid file this bus owns (not if it handed them over)."""
    if socket_file is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_file)
    if pidfile is not None:
        remove_pidfile(pidfile, os.getpid())


def _take_over(config: ServerConfig, log: Any) -> int:
    """Be the bus on ``config.address``: take it over from the process serving it."""
    from sbus_relay.ops.handover import take_over

    state, fds, channel = take_over(config.address)  # UpgradeError: one line, exit 1
    socket_file = state["socket_file"]
    pidfile = None
    if not config.foreground:
        pidfile = os.path.abspath(config.pidfile)
        write_pidfile(pidfile, os.getpid(), successor_of=state["from_pid"])
    adopted = (state, fds, channel)
    handed_over = False
    try:
        handed_over = _serve(config, log, None, socket_file, state["address"], adopted=adopted)
    except KeyboardInterrupt:
        pass
    finally:
        if not handed_over:
            _clean_up(socket_file, pidfile)
    log.info("exited", address=state["address"], status=0, handed_over=handed_over)
    return 0


def _metrics_listener(config: ServerConfig) -> socket.socket:
    from sbus_relay.ops.metrics_server import bind_metrics

    assert config.metrics is not None
    try:
        return bind_metrics(config.metrics)
    except AddressError as busy:
        # The usual cause: this very bus is running already (a second `make run`).
        try:
            address = parse_address(config.address)
            running = address.kind == "path" and answers(address.path)
        except (AddressError, OSError):
            running = False
        if running:
            raise AddressError(
                f"a bus is already running on {config.address} (and {busy})"
            ) from None
        raise


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _serve(
    config: ServerConfig,
    log: Any,
    ready: Callable[[], None] | None,
    socket_file: str | None,
    printable: str,
    *,
    listener: socket.socket | None = None,
    web_sock: socket.socket | None = None,
    adopted: tuple[dict[str, Any], list[int], socket.socket] | None = None,
) -> bool:
    """Serve until stopped; True if a newer process took the bus over."""
    # Imported here, after any fork: gevent's hub must start in the daemon.
    import gevent

    from sbus_relay.bus.server import Server

    if adopted is not None:
        server = Server.adopt(config, adopted[0], adopted[1], log=log)
        web_sock = server.web_listener
    else:
        assert listener is not None
        server = Server(config, listener, log=log)
        server.web_listener = web_sock
    server.socket_file = socket_file

    def stop(signum: int) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        server.stop()

    for signum in STOP_SIGNALS:
        gevent.signal_handler(signum, stop, signum)
    gevent.signal_handler(UPGRADE_SIGNAL, _upgrade, server, log)
    web = None
    if web_sock is not None:
        # Only when asked: prometheus_client is not free to import.
        from sbus_relay.ops.metrics_server import serve_from_config

        # cast: the server declares the config protocol with settable attributes,
        # which a frozen dataclass (rightly) does not satisfy for mypy.
        web = serve_from_config(cast(Any, config), server, listener=web_sock)
    server.start()
    if adopted is not None:
        from sbus_relay.ops.handover import confirm

        confirm(adopted[2])
        notify(MAINPID=os.getpid(), READY=1)
        log.info(
            "upgrade.took_over",
            from_pid=adopted[0]["from_pid"],
            clients=len(server.clients),
            version=adopted[0]["version"],
        )
    else:
        if ready is not None:
            ready()
        notify(READY=1)
    server.address = printable
    log.info("listening", address=printable, pid=os.getpid(), relay=bool(config.upstream))
    try:
        server.serve_forever()
    finally:
        if web is not None:
            web.stop()
    return server.handed_over


def _upgrade(server: Any, log: Any) -> None:
    """SIGUSR2: start the installed version of this bus, to take it over."""
    if os.environ.get(SUPERVISED_ENV):
        log.warning(
            "upgrade.supervised",
            hint="this bus is run by `sbus-relay up`: upgrade the tree with `sbus-relay upgrade`",
        )
        return
    import subprocess

    import gevent

    env = {**os.environ, TAKE_OVER_ENV: "1"}
    try:
        child = subprocess.Popen(
            sys.orig_argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
    except OSError as exc:
        log.warning("upgrade.failed", reason=f"cannot start {sys.orig_argv[0]}: {exc}")
        return
    log.info("upgrade.started", pid=child.pid, command=" ".join(sys.orig_argv))
    gevent.spawn(_watch_successor, server, child, log)


def _watch_successor(server: Any, child: Any, log: Any) -> None:
    """Say why, in one line, if the new process ends before it took the bus over."""
    import gevent

    deadline = time.monotonic() + UPGRADE_WAIT
    while not server.handed_over and time.monotonic() < deadline:
        status = child.poll()
        if status is not None:
            log.warning(
                "upgrade.failed",
                reason=f"the new process (pid {child.pid}) exited with status {status} "
                "before taking the bus over; this one serves on (its own log says why)",
            )
            return
        gevent.sleep(0.1)
    if not server.handed_over:
        child.kill()
        log.warning(
            "upgrade.failed",
            reason=f"the new process (pid {child.pid}) did not take the bus over within "
            f"{UPGRADE_WAIT:g} s and was killed; this one serves on",
        )
