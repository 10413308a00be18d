"""A bus process's life beside serving: its signals, its live upgrade's
successor, and what it does once it handed the bus on (linger, or keep its
terminal).

What it owns: which signals stop, reload and upgrade a bus, the signals that
come before the bus serves, the processes it starts to take it over
(``Successors``), and the end of a process that handed its bus on.  What it
may touch: signal dispositions, the successor processes it starts, its own
stderr, and the server only through ``Serving``.

Theory of operation (docs/deploy.md, "Upgrade").  ``serve`` runs a bus; on
SIGUSR2 it starts the installed version of itself (``Successors.start``: the
same command line, from the directory the bus was started in, with
``$SBUS_TAKE_OVER`` naming the address it serves) and watches it in a
greenlet: a successor that ends, or does not take the bus over within
``UPGRADE_WAIT``, is said in one line (its last stderr line where its stderr
comes to us) and killed if it still runs; the bus serves on.  Nothing here
waits on the hub: the watch yields (``gevent.sleep``).

A process whose bus a newer one took over either ends, keeps its terminal's
foreground for its successors (``keep_the_terminal``), or -- a
``--take-over`` bus that handed itself to a process it did not start --
lingers (``linger``): a container whose process ends is started again, and
would take the bus back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any, Protocol

from sbus_relay.protocol.errors import AddressError
from sbus_relay.protocol.limits import UPGRADE_STDERR_TAIL, UPGRADE_WAIT

from . import children, foreground
from .daemon import stderr_is_a_file
from .handover import SUPERVISED_ENV, TAKE_OVER_ENV, UPGRADE_STDERR_ENV

#: Signals that stop the server cleanly (docs/protocol.md, Addresses).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The signal that reloads ``serve``'s config (and stops ``sbusd``).
RELOAD_SIGNAL = signal.SIGHUP
#: The signal that upgrades a running bus in place (as nginx's binary upgrade).
UPGRADE_SIGNAL = signal.SIGUSR2
#: Seconds between two looks at a successor that has not taken the bus over yet.
SUCCESSOR_POLL = 0.1
#: Seconds between a lingering bus's looks at whether it was told to stop (a
#: signal wakes it at once; the timer only keeps gevent's loop from ending).
LINGER_TICK = 60.0


class Serving(Protocol):
    """What a successor's watch reads of the server it is to take over."""

    address: str
    handed_over: bool


class EarlySignals:
    """Signals that arrive before gevent's handlers are installed, remembered
    and acted on once the server runs: a stop signal (SIGHUP too without a
    reload) stops it at once; with a reload, a SIGHUP reloads it.  (Raising
    from the handler instead would be lost where Python swallows exceptions,
    in the middle of an import.)"""

    def __init__(self, reloads: bool) -> None:
        self.stop_asked = False
        self.reload_asked = False
        stops = STOP_SIGNALS if reloads else (*STOP_SIGNALS, RELOAD_SIGNAL)
        for signum in stops:
            signal.signal(signum, self._stop)
        if reloads:
            signal.signal(RELOAD_SIGNAL, self._reload)
        # an upgrade asked that early is not yet one this process can do (caught
        # and let pass: its default action would end it, and an ignored signal
        # would stay ignored by the loop that handles it later)
        signal.signal(UPGRADE_SIGNAL, _too_early)

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stop_asked = True

    def _reload(self, _signum: int, _frame: object) -> None:
        self.reload_asked = True


def _too_early(_signum: int, _frame: object) -> None:
    """SIGUSR2 before the bus serves: nothing to hand over yet."""


class Successors:
    """The processes this bus started to take it over (SIGUSR2), each watched
    until it took the bus over, ended, or ran out of ``UPGRADE_WAIT``."""

    def __init__(self) -> None:
        self.started: list[Any] = []  # subprocess.Popen, each

    def running(self) -> bool:
        """Whether one of them still runs (once the bus is handed over: the taker)."""
        return any(child.poll() is None for child in self.started)

    def start(self, server: Serving, log: Any, start_dir: str, from_terminal: bool) -> None:
        """Start the installed version of this bus, to take it over: the same
        command line, from the directory this bus was started in (a daemon
        has left it; relative paths in the command line are relative to it).
        A bus typed at a terminal that still holds its foreground will wait
        for its successors (``ops.foreground``): they are to be its children."""
        if os.environ.get(SUPERVISED_ENV):
            log.warning(
                "upgrade.supervised",
                hint="this bus is run by `sbus-relay up`: upgrade the tree with"
                " `sbus-relay upgrade`",
            )
            return
        import subprocess

        import gevent

        env = {**os.environ, TAKE_OVER_ENV: server.address}
        if from_terminal and foreground.holds_terminal():
            foreground.become_subreaper()  # its successors' successors stay within our reach
        # Where our stderr goes nowhere (a daemon), the new process's goes to us
        # until it serves, so that a failure can say why in our log.
        listen_to_it = not stderr_is_a_file() and not os.isatty(2)
        if listen_to_it:
            env[UPGRADE_STDERR_ENV] = "1"
        try:
            child = subprocess.Popen(
                sys.orig_argv,
                env=env,
                cwd=start_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE if listen_to_it else None,
                close_fds=True,
            )
        except OSError as exc:
            log.warning("upgrade.failed", reason=f"cannot start {sys.orig_argv[0]}: {exc}")
            return
        self.started.append(child)
        log.info("upgrade.started", pid=child.pid, command=" ".join(sys.orig_argv), cwd=start_dir)
        gevent.spawn(_watch, server, child, log)


def _watch(server: Serving, child: Any, log: Any) -> None:
    """Say why, in one line, if the new process ends before it took the bus over."""
    import gevent
    from gevent.os import make_nonblocking

    said = b""  # the end of what it wrote to stderr, where that comes to us
    if child.stderr is not None:
        make_nonblocking(child.stderr.fileno())

    def hear() -> None:
        nonlocal said
        if child.stderr is not None:
            with contextlib.suppress(BlockingIOError):  # nothing more for now
                while chunk := os.read(child.stderr.fileno(), UPGRADE_STDERR_TAIL):
                    said = (said + chunk)[-UPGRADE_STDERR_TAIL:]

    try:
        deadline = time.monotonic() + UPGRADE_WAIT
        while not server.handed_over and time.monotonic() < deadline:
            hear()
            status = child.poll()
            if status is not None:
                hear()
                lines = said.decode(errors="replace").strip().splitlines()
                why = f": {lines[-1]}" if lines else " (its own log says why)"
                log.warning(
                    "upgrade.failed",
                    reason=f"the new process (pid {child.pid}) {children.how_it_ended(status)} "
                    f"before taking the bus over; this one serves on{why}",
                )
                return
            gevent.sleep(SUCCESSOR_POLL)
        if not server.handed_over:
            child.kill()
            log.warning(
                "upgrade.failed",
                reason=f"the new process (pid {child.pid}) did not take the bus over within "
                f"{UPGRADE_WAIT:g} s and was killed; this one serves on",
            )
    finally:
        if child.stderr is not None:
            child.stderr.close()


def linger(metrics: str | None, log: Any, successors: Successors) -> None:
    """After handing the bus to a process it did not start, a ``--take-over``
    bus stays until stopped: in a container, its end would start it again, and
    that start would take the bus back.  It answers ``/healthz`` (200) on its
    metrics address where that is free (its own network namespace), so that its
    pod's liveness probe leaves it be until the pod is deleted.  A bus whose
    successor (one it started) still runs ends as always."""
    if successors.running():
        return
    import gevent
    from gevent.event import Event
    from prometheus_client import CollectorRegistry

    from .metrics_server import bind_metrics, serve

    web = None
    if metrics:
        with contextlib.suppress(AddressError):  # taken: the successor answers there
            web = serve(bind_metrics(metrics), 0, CollectorRegistry(), lambda: True)
    stopped = Event()
    for signum in STOP_SIGNALS:
        gevent.signal_handler(signum, stopped.set)
    log.info("upgrade.lingering", healthz=web is not None, until="SIGTERM")
    while not stopped.wait(LINGER_TICK):  # a timer keeps the loop alive; signals do not
        pass
    if web is not None:
        web.stop()


def keep_the_terminal(log: Any, owed: list[int]) -> None:
    """Become the small process that waits for the bus (``cli.foreground``),
    passing it the signals ``owed`` to the bus; returns only if that cannot
    start (this one then ends as it would have)."""
    sys.stdout.flush()
    sys.stderr.flush()
    # from now until it waits for them, signals stay pending (through the exec)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, foreground.WAITED)
    command = [sys.executable, "-P", "-m", "sbus_relay.cli.foreground", *map(str, owed)]
    try:
        os.execv(command[0], command)
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        log.warning("foreground.lost", reason=f"cannot run {command[0]}: {exc}")
