"""Run a bus: a master, or a relay with --upstream (also what ``sbusd`` runs).

What it owns: the serve command: its flags, its config and the order a bus
starts in.  What it may touch: ops (config, addresses, daemon, logging,
handover, lifecycle) and bus.server.

The order matters (docs/protocol.md, Addresses): resolve the listener and bind it *before*
daemonising, so an address in use is reported on the terminal with a non-zero
status; print a random abstract address before stdout is closed; fork before
anything starts gevent's hub; and remove the socket file and pid file however
the server stops -- unless a newer process took the bus over.

A live upgrade (docs/deploy.md, "Upgrade"): on SIGUSR2 a bus starts the
installed version of itself (``ops.lifecycle.Successors``), the same command
line with ``$SBUS_TAKE_OVER`` set to the address it serves; that process,
fully initialised, takes the running bus over (``ops.handover``: every socket
and connection's state) instead of binding, tells systemd its pid, and serves
on.  A bus run by ``sbus-relay up`` leaves
upgrades to ``up`` (``$SBUS_SUPERVISED``), which starts the new process itself.

``serve --take-over`` starts the same hand-over from the new side, for a new
process that nobody started from the old one (a Kubernetes pod replacing the
master's pod, docs/kubernetes.md): if a bus answers on the config's address,
take it over, else start as usual.  The new process serves metrics on a socket
of its own where it can bind one (another network namespace: the old one's
belongs to a pod that is going away).  A bus started with ``--take-over`` that
hands itself to a process it did not start stays, serving nothing but
``/healthz``, until it is stopped: a container whose process ended would be
started again, and would take the bus back.

SIGINT and SIGTERM stop the server.  SIGHUP reloads ``serve``'s config
(docs/reliability.md, "Reload"): the file is read again, the flags applied
over it, and the result handed to ``Server.reconfigure`` -- or, with an
error, refused in one line while the bus runs on.  A SIGHUP that finds the
terminal a foreground bus was started from gone is a hang-up, and stops it;
``sbusd``, which has no config file, stops on SIGHUP as the reference does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, cast

from sbus_relay.ops import foreground, logsetup
from sbus_relay.ops.addresses import (
    answers,
    listen,
    parse_address,
    printable_name,
    socket_mode,
    systemd_listeners,
)
from sbus_relay.ops.config import COMMAND_LINE, ServerConfig, load_config
from sbus_relay.ops.daemon import (
    DaemonError,
    check_pidfile,
    close_stdin_stdout,
    daemonize,
    has_terminal,
    notify,
    remove_pidfile,
    stderr_is_a_file,
    write_pidfile,
)
from sbus_relay.ops.handover import TAKE_OVER_ENV, UPGRADE_STDERR_ENV
from sbus_relay.ops.lifecycle import (
    RELOAD_SIGNAL,
    STOP_SIGNALS,
    UPGRADE_SIGNAL,
    EarlySignals,
    Successors,
    keep_the_terminal,
    linger,
)
from sbus_relay.ops.natsconfig import parse_servers
from sbus_relay.protocol.errors import AddressError, ConfigError

from .options import (
    add_address_argument,
    add_config_argument,
    add_logging_arguments,
    add_metrics_argument,
    configure_logging,
)

#: Exit status of a new process whose predecessor gave up the hand-over and
#: serves on (``upgrade.abandoned``).
EXIT_ABANDONED = 75

#: Reads the config again, file then flags (raises ``ConfigError``).
Loader = Callable[[], ServerConfig]

#: Flags of ServerConfig fields that take a value: field -> (flags, metavar, help);
#: the address, metrics and logging flags are the shared ones (``options``).
_VALUE_FLAGS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "pidfile": (("-p", "--pidfile"), "PIDFILE", "pid file when daemonised (/dev/null: none)"),
    "hard_limit_bytes": (("--hard-limit-bytes",), "SIZE", "per-client queue limit, e.g. 16MiB"),
    "hard_limit_messages": (("--hard-limit-messages",), "N", "per-client queue limit in messages"),
    "max_clients": (("--max-clients",), "N", "most clients connected at once"),
    "upstream": (("--upstream",), "ADDRESS", "be a relay of the bus at ADDRESS"),
    "nats": (
        ("--nats",),
        "URL[,URL...]",
        "carry traffic to and from other hosts over these NATS servers",
    ),
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
    parser.add_argument(
        "--take-over", action="store_true", default=None,
        help="if a bus answers on the address, take it over (its sockets and connections)"
        " instead of binding; the same command starts the first bus and its successors",
    )  # fmt: skip
    parser.add_argument(
        "--check", action="store_true", default=None,
        help="only validate the config (file and flags) and exit: what systemctl reload"
        " runs first",
    )  # fmt: skip


def config_from(args: argparse.Namespace, base: str | None = None) -> ServerConfig:
    """The server's config: the file (``-C``, relative to ``base`` if given),
    then the flags over it."""
    config_path = getattr(args, "config", None)
    if config_path and base is not None:
        config_path = os.path.join(base, config_path)
    config = load_config(config_path) if config_path else ServerConfig()
    overrides = {f.name: getattr(args, f.name, None) for f in fields(ServerConfig)}
    if overrides.get("nats") is not None and config.nats is not None:
        # --nats names the servers; the file's other nats settings stay
        servers = parse_servers(COMMAND_LINE, "--nats", overrides.pop("nats"))
        config = replace(config, nats=config.nats.with_servers(servers))
    return config.merged(**overrides)


def run(args: argparse.Namespace) -> int:
    """Load the config (file, then flags) and run the server until it stops;
    SIGHUP loads it again.  With ``--check``, only validate it."""
    config = config_from(args)
    if getattr(args, "check", None):
        print(f"{getattr(args, 'config', None) or COMMAND_LINE}: valid")
        return 0
    start = os.getcwd()  # a daemon leaves it: its reloads read the file named from here
    return run_server(
        config,
        lambda: config_from(args, start),
        source=args.config or COMMAND_LINE,
        take_over=bool(getattr(args, "take_over", None)),
        announce=True,
    )


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
    sock, printable = listen(
        address,
        mode=socket_mode(config.group_access, config.other_access),
        remove_stale=config.remove_stale,
        warn=lambda line: log.warning("address.removed", detail=line),
    )
    if address.kind == "abstract" and address.name is None:
        # docs/protocol.md, Addresses: the chosen name goes to stdout, for the caller to pass on.
        sys.stdout.write(printable + "\n")
        sys.stdout.flush()
    return sock, printable, printable if address.kind == "path" else None


def run_server(
    config: ServerConfig,
    reload: Loader | None = None,
    *,
    source: str = COMMAND_LINE,
    take_over: bool = False,
    announce: bool = False,
) -> int:
    """Listen, (maybe) daemonise, serve until a signal or the last client leaves.

    ``reload`` reads the config again on SIGHUP (``source`` names its file);
    without one SIGHUP stops the server, as it does the reference sbusd.
    ``take_over``: take over the bus answering on the address, if one does.
    ``announce``: a daemon's caller is told in one line where it went (``serve``;
    ``sbusd`` is silent, as the reference daemon is).
    """
    _log_to(config, None, source)
    start_dir = os.getcwd()  # where an upgrade runs this command line again
    # typed at a terminal (``make run``): an upgrade keeps the bus on it
    from_terminal = config.foreground and os.isatty(0)
    owed: list[int] = []  # signals that came once the bus was handed over: the new one's
    import structlog

    log = structlog.get_logger("sbus_relay")
    # Until gevent's handlers are installed (after imports that take a while),
    # SIGINT/SIGTERM must still mean "stop cleanly", not the default death,
    # and a SIGHUP "reload once running".
    hangup_stops = config.foreground and has_terminal()
    if signal.getsignal(RELOAD_SIGNAL) is signal.SIG_IGN:
        hangup_stops = False  # started under nohup: a hang-up is not ours to act on
    early = EarlySignals(reload is not None)
    successors = Successors()
    serving = os.environ.get(TAKE_OVER_ENV)
    if take_over and not serving and _bus_answers(config.address):
        serving = config.address
    if serving:
        return _take_over(
            config, serving, log, reload, source, early, hangup_stops, successors,
            from_new_side=take_over,
        )  # fmt: skip
    pidfile = None
    status = 0
    socket_file = None
    printable = config.address
    handed_over = False
    try:
        if not config.foreground:
            check_pidfile(os.path.abspath(config.pidfile))  # another bus's: one line
        # Bound first, before the bus socket and before daemonising: a busy port
        # is one line on the terminal, never a bus that listens for a moment and
        # dies, nor a daemon that dies out of sight.
        web_sock = _metrics_listener(config) if config.metrics else None
        sock, printable, socket_file = _listener(config, log)
        default_target = None
        if config.foreground:
            close_stdin_stdout()
            ready = None
        else:
            pidfile = os.path.abspath(config.pidfile)
            keep_stderr = config.log_file is None and stderr_is_a_file()
            line = _where_it_went(config, printable, pidfile, keep_stderr) if announce else None
            ready = daemonize(pidfile, keep_stderr=keep_stderr, announce=line)
            if not keep_stderr:
                # The caller's terminal or pipe is not ours: the system log takes
                # over, now or when a reload drops the log file.
                default_target = logsetup.SYSLOG
                if config.log_file is None:
                    _log_to(config, default_target, source)
        reloading = None
        if reload is not None:
            reloading = _Reloading(reload, default_target, source, log, hangup_stops)
        handed_over = _serve(
            config, log, ready, socket_file, printable, reloading, early, start_dir, successors,
            listener=sock, web_sock=web_sock, from_terminal=from_terminal, owed=owed,
        )  # fmt: skip
    except KeyboardInterrupt:
        pass  # a signal before our handlers were installed: still a clean stop
    except DaemonError:
        status = 1  # the parent that is still on the terminal reports why
    finally:
        if not handed_over:
            _clean_up(socket_file, pidfile)
    if handed_over and take_over:
        linger(config.metrics, log, successors)
    elif handed_over and from_terminal and foreground.holds_terminal():
        # the terminal still waits on us: the bus stays within its reach
        log.info("foreground.kept", pid=os.getpid(), until="the bus stops (Ctrl-C stops it)")
        keep_the_terminal(log, owed)
    log.info("exited", address=printable, status=status, handed_over=handed_over)
    return status


def _where_it_went(
    config: ServerConfig, address: str, pidfile: str, keep_stderr: bool
) -> Callable[[int], str]:
    """The line ``serve`` prints as it goes into the background, given the
    daemon's pid: where it serves, its pid (and pid file), where it logs."""
    if config.log_file == logsetup.SYSLOG or (config.log_file is None and not keep_stderr):
        logs = f"syslog (journalctl -t {logsetup.syslog_ident()})"
    elif config.log_file is not None:
        logs = os.path.abspath(config.log_file)
    else:
        logs = os.path.realpath("/proc/self/fd/2")  # the file this stderr is
    kept = "" if pidfile == os.devnull else f", pid file {pidfile}"

    def line(pid: int) -> str:
        return (
            f"sbus-relay serve: in the background as pid {pid}{kept}, serving {address},"
            f" logging to {logs}; stop it with kill {pid} (-f keeps a bus in the foreground)"
        )

    return line


def _clean_up(socket_file: str | None, pidfile: str | None) -> None:
    """Remove the socket file and pid file this bus owns (not if it handed them over)."""
    if socket_file is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_file)
    if pidfile is not None:
        remove_pidfile(pidfile, os.getpid())


def _take_over(
    config: ServerConfig,
    serving: str,
    log: Any,
    reload: Loader | None,
    source: str,
    early: EarlySignals,
    hangup_stops: bool,
    successors: Successors,
    *,
    from_new_side: bool = False,
) -> int:
    """Be the bus on ``serving``: take it over from the process serving it
    (``hangup_stops``: it runs on the terminal its predecessor was started from).

    ``from_new_side`` (``serve --take-over``): serve metrics on a socket of
    this process's own if it can bind one, the old process's only where that
    port is taken (the same network: the old socket comes with the bus); and
    linger once this process hands the bus on in its turn."""
    from sbus_relay.ops.handover import take_over

    web_sock = None
    if from_new_side and config.metrics:
        from sbus_relay.ops.metrics_server import bind_metrics

        with contextlib.suppress(AddressError):
            web_sock = bind_metrics(config.metrics)
    state, fds, channel = take_over(serving)  # UpgradeError: one line, exit 1
    if web_sock is not None and state["web"] is not None:
        os.close(fds[state["web"]])  # the old process's, in its network: not ours
        state["web"] = None
    socket_file = state["socket_file"]
    pidfile = None
    default_target = None
    if not config.foreground:
        pidfile = os.path.abspath(config.pidfile)
        write_pidfile(pidfile, os.getpid(), successor_of=state["from_pid"])
        if not stderr_is_a_file():
            # a daemon's stderr is nobody's: it logs where its predecessor did
            default_target = logsetup.SYSLOG
            if config.log_file is None:
                _log_to(config, default_target, source)
    reloading = None
    if reload is not None:
        reloading = _Reloading(reload, default_target, source, log, hangup_stops)
    adopted = (state, fds, channel)
    handed_over = False
    try:
        handed_over = _serve(
            config, log, None, socket_file, state["address"], reloading, early, os.getcwd(),
            successors, adopted=adopted, web_sock=web_sock,
        )  # fmt: skip
    except KeyboardInterrupt:
        pass
    finally:
        if not handed_over:
            _clean_up(socket_file, pidfile)
    if handed_over and from_new_side:
        linger(config.metrics, log, successors)
    log.info("exited", address=state["address"], status=0, handed_over=handed_over)
    return 0


def _log_to(config: ServerConfig, default_target: str | None, source: str) -> None:
    """Configure the log from ``config``: its ``log_file``, else ``default_target``
    (None: stderr; a daemon that let go of its caller's stderr: syslog)."""
    configure_logging(
        config.log_level,
        config.log_format,
        config.log_file or default_target,
        fields={"instance": config.instance},
        source=source,
    )


class _Reloading:
    """What SIGHUP does to a running ``serve``: reload, or stop after a hang-up."""

    def __init__(
        self, load: Loader, default_target: str | None, source: str, log: Any, hangup_stops: bool
    ) -> None:
        self.load = load
        self.default_target = default_target
        self.source = source
        self.log = log
        #: a foreground bus started from a terminal: that terminal gone means stop
        self.hangup_stops = hangup_stops

    def is_hangup(self) -> bool:
        """Whether a SIGHUP now means the terminal hung up (``daemon.has_terminal``)."""
        return self.hangup_stops and not has_terminal()

    def reload(self, server: Any) -> None:
        """Read the config again and hand it to the server; an error is one line,
        and the server keeps the config it has."""
        self.log.info("signal", signal="SIGHUP", reload=self.source)
        try:
            loaded = self.load()
            _log_to(loaded, self.default_target, self.source)
        except ConfigError as e:
            server.refuse_reload(str(e))
            return
        try:
            server.reconfigure(loaded)
        except Exception:  # a bug of ours: the bus runs on; logged once, counted (reload)
            if server.stats.bug("reload"):
                self.log.exception("config.reload_failed")
            else:
                self.log.error("config.reload_failed", hint="as before: see the first")


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


def _serve(
    config: ServerConfig,
    log: Any,
    ready: Callable[[], None] | None,
    socket_file: str | None,
    printable: str,
    reloading: _Reloading | None,
    early: EarlySignals,
    start_dir: str,
    successors: Successors,
    *,
    listener: socket.socket | None = None,
    web_sock: socket.socket | None = None,
    adopted: tuple[dict[str, Any], list[int], socket.socket] | None = None,
    from_terminal: bool = False,
    owed: list[int] | None = None,
) -> bool:
    """Serve until stopped; True if a newer process took the bus over.
    ``from_terminal``: typed at a terminal, whose foreground an upgrade keeps;
    then the signals that come once the bus is handed over are noted in
    ``owed``, for the process that waits for the new bus to pass on."""
    # Imported here, after any fork: gevent's hub must start in the daemon.
    import gevent

    from sbus_relay.bus.server import Server

    if adopted is not None:
        server = Server.adopt(config, adopted[0], adopted[1], log=log)
        if web_sock is None:
            web_sock = server.web_listener
        else:
            server.web_listener = web_sock
    else:
        assert listener is not None
        server = Server(config, listener, log=log, socket_file=socket_file)
        server.web_listener = web_sock

    def passed_on(signum: int) -> bool:
        if server.handed_over and owed is not None:
            owed.append(signum)
        return server.handed_over

    def stop(signum: int) -> None:
        if passed_on(signum):
            return
        log.info("signal", signal=signal.Signals(signum).name)
        server.stop()

    def upgrade() -> None:
        if not passed_on(UPGRADE_SIGNAL):
            successors.start(server, log, start_dir, from_terminal)

    def hup() -> None:
        if passed_on(RELOAD_SIGNAL):
            return
        if reloading is None or reloading.is_hangup():
            log.info("signal", signal="SIGHUP", hangup=reloading is not None)
            server.stop()
        else:
            reloading.reload(server)

    for signum in STOP_SIGNALS:
        gevent.signal_handler(signum, stop, signum)
    gevent.signal_handler(RELOAD_SIGNAL, hup)
    gevent.signal_handler(UPGRADE_SIGNAL, upgrade)
    web = None
    if web_sock is not None:
        # Only when asked: prometheus_client is not free to import.
        from sbus_relay.ops.metrics_server import serve_from_config

        # cast: the server declares the config protocol with settable attributes,
        # which a frozen dataclass (rightly) does not satisfy for mypy.
        web = serve_from_config(_Running(server), server, listener=web_sock)
    server.start()
    if adopted is not None:
        from sbus_relay.ops import handover

        if server.nats is not None:  # on NATS before the old process leaves it
            server.nats.wait_joined(server.nats.join_wait)

        outcome = handover.confirm(adopted[2], adopted[0]["from_pid"])
        if outcome == handover.PREDECESSOR_SERVES:
            # it stopped waiting for us and thawed: two processes must never
            # serve one bus; leave at once, touching nothing it serves with
            log.error(
                "upgrade.abandoned",
                from_pid=adopted[0]["from_pid"],
                reason="the old process stopped waiting for this one and serves on",
            )
            os._exit(EXIT_ABANDONED)
        if outcome == handover.PREDECESSOR_GONE:
            log.warning("upgrade.predecessor_gone", from_pid=adopted[0]["from_pid"])
        if os.environ.get(UPGRADE_STDERR_ENV):
            # its stderr was the pipe its predecessor read until now: nobody's hereafter
            with open(os.devnull, "wb") as devnull:
                os.dup2(devnull.fileno(), 2)
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
    if early.stop_asked:
        log.info("signal", signal="stop", while_starting=True)
        server.stop()
    elif early.reload_asked and reloading is not None:
        reloading.reload(server)  # asked for while starting: the file may be newer
    try:
        server.serve_forever()
    finally:
        if web is not None:
            web.stop()
    return server.handed_over


def _bus_answers(address: str) -> bool:
    """Whether a bus answers on the socket file of ``address`` (``serve --take-over``)."""
    try:
        parsed = parse_address(address)
        return parsed.kind == "path" and answers(parsed.path)
    except (AddressError, OSError):
        return False


class _Running:
    """The metrics server's view of the config: the server's, as a reload leaves it."""

    def __init__(self, server: Any) -> None:
        self._server = server

    @property
    def metrics(self) -> str | None:
        return cast(str | None, self._server.config.metrics)

    @property
    def instance(self) -> str:
        return cast(str, self._server.config.instance)
