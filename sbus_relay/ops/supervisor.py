"""Run a whole hierarchy of buses on one machine: the processes of ``sbus-relay up``.

What it owns: the bus processes up starts: their start, watch, restart, live
upgrade, reload signal and stop, and what it says about them.  What it may
touch: those processes (ops.children, signals), each bus's address and log
file; nothing of the file's format, no argv, no exit.

Theory of operation.  ``Supervisor`` starts each bus as an ``sbus-relay serve
-f`` child, parents first, and waits for each socket before starting its
children.  A child that dies is restarted with capped exponential back-off (a
relay whose master restarts reconnects by itself, docs/protocol.md, Relays).
``stop()`` stops the children in reverse order -- relays before their
upstream, so no relay logs a needless outage -- with SIGTERM, then SIGKILL
after a grace period.

Children are started with ``children.spawn``: in their own session, so that a
Ctrl-C on the terminal reaches only the supervisor, which then stops them in
order; and each asks the kernel for SIGTERM if the supervisor dies, so none is
orphaned.

``reload()`` (SIGHUP to ``up``) reads the hierarchy file again: buses new to
it start, buses gone from it stop, every bus that stays is sent SIGHUP (it
reloads its own config file), and what a running bus cannot take -- a new
address, upstream, metrics address or args -- is named in one line and kept
until ``up`` restarts (docs/relays.md, "Reloading a tree";
``hierarchy.plan_tree_reload`` decides it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from sbus_relay.protocol.errors import AddressError, ConfigError, SbusError
from sbus_relay.protocol.limits import UPGRADE_WAIT

from . import children, natscluster
from .addresses import connect, parse_address, peer_ucred
from .handover import SUPERVISED_ENV, TAKE_OVER_ENV
from .hierarchy import BusSpec, Hierarchy, plan_tree_reload

#: Seconds a bus gets to listen after it was started.
START_TIMEOUT = 15.0
#: Seconds a bus gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT = 10.0
#: Seconds between checks of the children (how fast a death is noticed).
POLL_INTERVAL = 0.1
#: A child that ran this long before dying gets the shortest restart delay again.
STABLE_AFTER = 10.0
#: Failed starts in a row (exited or never listening, each within STABLE_AFTER
#: of its start) after which a bus is given up on rather than restarted forever.
START_ATTEMPTS = 5
#: Seconds between checks that a starting bus listens.
LISTEN_POLL = 0.05
#: Seconds a look at who listens at an address may wait for the connect: a
#: process that listens there but never accepts fills its backlog, and each
#: look (one every LISTEN_POLL while a bus starts) would then wait for ever.
LISTENER_PROBE_TIMEOUT = 1.0
#: Bytes of a process's command line read to tell whose it is.
CMDLINE_BYTES = 4096


class SupervisorError(SbusError):
    """A bus could not be started (it exited, or never listened)."""


# --- running ---------------------------------------------------------------------


class Child:
    """One supervised bus process and its restart state."""

    def __init__(self, spec: BusSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.delay = 0.0
        self.restart_at: float | None = None
        self.restarts = 0
        #: failed starts in a row; the bus is given up on at START_ATTEMPTS
        self.failures = 0
        self.gave_up = False


class Supervisor:
    """Starts, watches and stops the buses of a ``Hierarchy``."""

    def __init__(
        self,
        hierarchy: Hierarchy,
        *,
        command: Sequence[str] = (sys.executable, "-P", "-m", "sbus_relay", "serve"),
        out: Callable[[str], None] | None = None,
        err: Callable[[str], None] | None = None,
        load: Callable[[], Hierarchy] | None = None,
        source: str = "hierarchy",
    ) -> None:
        self.hierarchy = hierarchy
        self.command = tuple(command)
        self.out = out or _printer(sys.stdout)
        self.err = err or _printer(sys.stderr)
        self.children = [Child(spec) for spec in hierarchy.buses]
        #: reads the hierarchy file again for ``reload`` (raises ``ConfigError``)
        self.load = load
        self.source = source  # that file's name, in errors
        self._stopping = False
        self._upgrade_asked = False
        self._reload_asked = False
        self.nats: list[subprocess.Popen[bytes]] = []  # the NATS cluster's servers

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start every bus, parents first, each listening before the next starts.

        Raises ``SupervisorError`` (after stopping what was started) if one fails;
        then what this start created is removed again: the logs, but the one the
        error names, and ``log_dir`` if it made it and nothing else is in it.
        """
        log_dir = self.hierarchy.log_dir
        made_dir = bool(log_dir) and not os.path.isdir(log_dir or "")
        fresh = [path for path in self._log_paths() if not os.path.lexists(path)]
        try:
            self._start()
        except SupervisorError as exc:
            self.stop()
            for path in fresh:
                if path not in str(exc):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            if made_dir and log_dir:
                with contextlib.suppress(OSError):  # not empty: someone else's files
                    os.rmdir(log_dir)
            raise

    def _log_paths(self) -> list[str]:
        """Every log file of this tree: its buses' and its NATS servers'."""
        paths = [self.hierarchy.log_path(spec) for spec in self.hierarchy.buses]
        log_dir = self.hierarchy.log_dir
        paths += [natscluster.log_path(node, log_dir) for node in self.hierarchy.nats_cluster]
        return [path for path in paths if path is not None]

    def _start(self) -> None:
        if self.hierarchy.log_dir:
            try:
                os.makedirs(self.hierarchy.log_dir, exist_ok=True)
            except OSError as exc:
                raise SupervisorError(
                    f"cannot create log_dir {self.hierarchy.log_dir}: {exc.strerror or exc}"
                ) from None
        if self.hierarchy.nats_cluster:
            try:
                self.nats = natscluster.start(self.hierarchy.nats_cluster, self.hierarchy.log_dir)
            except OSError as exc:
                raise SupervisorError(f"cannot start the NATS cluster: {exc}") from None
            self.out("NATS cluster: " + ", ".join(n.url for n in self.hierarchy.nats_cluster))
        for child in self.children:
            if self._stopping:
                return
            child.delay = self.hierarchy.restart_min
            self._spawn(child)
        buses = "1 bus" if len(self.children) == 1 else f"{len(self.children)} buses"
        self.out(
            f"sbus-relay up: {buses} running; Ctrl-C stops them all,"
            f" kill -HUP {os.getpid()} reloads them"
        )

    def run(self) -> None:
        """Watch the children until ``request_stop()``; restart those that die.

        Raises ``SupervisorError`` once every bus has been given up on.
        """
        while not self._stopping:
            if self._upgrade_asked:
                self._upgrade_asked = False
                self.upgrade()
            if self._reload_asked:
                self._reload_asked = False
                self.reload()
            now = time.monotonic()
            for child in self.children:
                if self._stopping:
                    break
                self._watch(child, now)
            if all(child.gave_up for child in self.children):
                raise SupervisorError("every bus failed to start repeatedly; nothing left to run")
            time.sleep(POLL_INTERVAL)

    def status(self) -> dict[str, str]:
        """Each bus's state: running (pid N), restarting, or gave up."""
        result = {}
        for child in self.children:
            if child.gave_up:
                result[child.spec.name] = f"gave up after {child.failures} failed starts"
            elif child.restart_at is not None:
                result[child.spec.name] = "restarting"
            elif child.proc is not None and child.proc.poll() is None:
                result[child.spec.name] = f"running (pid {child.proc.pid})"
            else:
                result[child.spec.name] = "stopped"
        return result

    def request_stop(self) -> None:
        """Ask ``run`` to return (safe to call from a signal handler)."""
        self._stopping = True

    def request_upgrade(self) -> None:
        """Ask ``run`` to upgrade every bus (safe to call from a signal handler)."""
        self._upgrade_asked = True

    # --- a live upgrade of the tree (docs/deploy.md, "Upgrade") ------------------------

    def upgrade(self) -> int:
        """Hand each running bus, the master first, to a new process of the installed
        version; how many were not upgraded (each says why in one line)."""
        failed = 0
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None and not self._stopping:
                failed += not self._upgrade(child)
        done = sum(1 for c in self.children if c.proc is not None) - failed
        self.out(
            f"sbus-relay up: upgraded {done} {'bus' if done == 1 else 'buses'}"
            + (f", {failed} not" if failed else "")
        )
        return failed

    def _upgrade(self, child: Child) -> bool:
        old = child.proc
        assert old is not None
        spec = child.spec
        env = {**os.environ, SUPERVISED_ENV: "1", TAKE_OVER_ENV: spec.address}
        try:
            new = children.spawn(
                self.argv(spec), log=self.hierarchy.log_path(spec), new_session=True, env=env
            )
        except OSError as exc:
            self.err(f"sbus-relay up: {spec.name} not upgraded: {exc.strerror or exc}")
            return False
        address = parse_address(spec.address)
        deadline = time.monotonic() + UPGRADE_WAIT
        while True:
            status = new.poll()
            if status is not None:
                why = self._why(child, None)
                self.err(
                    f"sbus-relay up: {spec.name} not upgraded: the new process"
                    f" {children.how_it_ended(status)}{why}; pid {old.pid} serves on"
                )
                return False
            if old.poll() is not None and listener_pid(address) == new.pid:
                break
            if time.monotonic() > deadline:
                self._terminate_quietly_proc(new)
                self.err(
                    f"sbus-relay up: {spec.name} not upgraded within {UPGRADE_WAIT:g}s;"
                    f" pid {old.pid} serves on"
                )
                return False
            time.sleep(LISTEN_POLL)
        child.proc = new
        child.started_at = time.monotonic()
        self.out(f"{spec.name} upgraded: pid {old.pid} -> pid {new.pid}")
        return True

    def request_reload(self) -> None:
        """Ask ``run`` to ``reload`` (safe to call from a signal handler)."""
        self._reload_asked = True

    # --- reloading ---------------------------------------------------------------

    def reload(self) -> None:
        """Read the hierarchy file again and apply it (the module's docstring);
        a file with an error is one line, and nothing changes."""
        if self.load is None:
            return
        try:
            new = self.load()
            plan = plan_tree_reload(self.hierarchy, new, source=self.source)
        except ConfigError as exc:
            self.err(f"sbus-relay up: reload refused: {exc}; every bus runs on as it was")
            return
        by_name = {child.spec.name: child for child in self.children}
        for name in reversed(plan.stopped):  # deepest first, as ``stop`` does
            self._terminate(by_name.pop(name))
        self.hierarchy = plan.hierarchy
        self.children = [by_name.get(s.name) or Child(s) for s in plan.hierarchy.buses]
        reloaded = 0
        for child in self.children:
            if child.spec.name in plan.started:
                continue
            proc = child.proc
            if child.gave_up:  # its config may be fixed now: try it again
                child.gave_up = False
                child.failures = 0
                child.restart_at = time.monotonic()
            elif proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGHUP)
                reloaded += 1
        for child in self.children:
            if child.spec.name in plan.started and not self._stopping:
                child.delay = self.hierarchy.restart_min
                try:
                    self._spawn(child)
                except SupervisorError as exc:
                    self._terminate_quietly(child)
                    self._schedule(child, time.monotonic(), f"failed to start ({exc})", failed=True)
        done = [f"{reloaded} reloaded"]
        if plan.started:
            done.append("started " + ", ".join(plan.started))
        if plan.stopped:
            done.append("stopped " + ", ".join(plan.stopped))
        if plan.kept:  # before the summary: whoever waits for that has both
            self.err(
                "sbus-relay up: kept as they run until up restarts: "
                + "; ".join(f"{name} ({why})" for name, why in plan.kept)
            )
        self.out(f"sbus-relay up: reloaded the hierarchy: {'; '.join(done)}")

    def stop(self) -> None:
        """Stop every child: deepest relays first, the master last."""
        self._stopping = True
        for child in reversed(self.children):
            self._terminate(child)
        natscluster.stop(self.nats)
        self.nats = []

    def already_running(self) -> list[tuple[BusSpec, int]]:
        """The buses whose address a process already answers on, with its pid.

        Checked before anything starts: a second ``up`` of a running tree (or a
        bus whose address another process holds) touches none of its files.
        """
        taken = []
        for spec in self.hierarchy.buses:
            pid = listener_pid(parse_address(spec.address))
            if pid is not None:
                taken.append((spec, pid))
        return taken

    # --- one child ---------------------------------------------------------------

    def argv(self, spec: BusSpec) -> list[str]:
        """The command line that runs ``spec``: our ``serve`` command and its flags."""
        return [*self.command, *self.hierarchy.serve_flags(spec)]

    def start_order(self) -> list[list[str]]:
        """Every command ``start`` runs, in its order: the NATS cluster's servers
        (a found nats-server, else its bare name), then the buses."""
        nodes = self.hierarchy.nats_cluster
        server = natscluster.binary() or natscluster.SERVER_NAME
        return [
            *(natscluster.argv(server, node, nodes) for node in nodes),
            *(self.argv(spec) for spec in self.hierarchy.buses),
        ]

    def _spawn(self, child: Child) -> None:
        spec = child.spec
        log_path = self.hierarchy.log_path(spec)
        try:
            # Its own session: Ctrl-C is for us; we stop the children in order.
            child.proc = children.spawn(
                self.argv(spec),
                log=log_path,
                new_session=True,
                env={**os.environ, SUPERVISED_ENV: "1"},  # upgrades are ours to start
            )
        except OSError as exc:  # the log, the interpreter moved or vanished, fds exhausted ...
            if log_path is not None and exc.filename == log_path:
                raise SupervisorError(
                    f"cannot open the log of {spec.name}, {log_path}: {exc.strerror or exc}"
                ) from None
            raise SupervisorError(f"cannot start {spec.name}: {exc.strerror or exc}") from None
        child.started_at = time.monotonic()
        child.restart_at = None
        self._wait_listening(child)
        where = [f"pid {child.proc.pid}"]
        if spec.metrics:
            where.append(f"metrics http://{spec.metrics}/metrics")
        if log_path:
            where.append(f"log {log_path}")
        role = f"relay of {spec.upstream}" if spec.upstream else "master"
        self.out(f"{spec.name} ({role}) listening at {spec.address} ({', '.join(where)})")

    def _wait_listening(self, child: Child) -> None:
        """Poll until the child itself accepts a connection (or exits, or we stop).

        "Something accepts at the address" is not enough: another process may
        hold it.  The test connection's SO_PEERCRED pid must be the child's.
        """
        assert child.proc is not None
        address = parse_address(child.spec.address)
        deadline = time.monotonic() + START_TIMEOUT
        other: int | None = None
        while not self._stopping:
            status = child.proc.poll()
            if status is not None:
                raise SupervisorError(
                    f"bus {child.spec.name} {children.how_it_ended(status)} before listening"
                    + self._why(child, other)
                )
            listener = listener_pid(address)
            if listener == child.proc.pid:
                return
            if listener is not None:
                other = listener
            if time.monotonic() > deadline:
                raise SupervisorError(
                    f"bus {child.spec.name} not listening at {child.spec.address}"
                    f" after {START_TIMEOUT}s" + self._why(child, other)
                )
            time.sleep(LISTEN_POLL)

    def _why(self, child: Child, other: int | None) -> str:
        """The likely reason a start failed: another listener, the log's last line."""
        notes = []
        if other is not None:
            notes.append(f"another process (pid {other}) listens at {child.spec.address}")
        log_path = self.hierarchy.log_path(child.spec)
        if log_path:
            last = children.last_line(log_path)
            notes.append(f"{last} (log {log_path})" if last else f"see {log_path}")
        return ": " + "; ".join(notes) if notes else ""

    def _watch(self, child: Child, now: float) -> None:
        if child.gave_up:
            return
        proc = child.proc
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restarts += 1
                try:
                    self._spawn(child)
                except SupervisorError as exc:
                    self._terminate_quietly(child)
                    why = f"failed to start ({exc})"
                    self._schedule(child, time.monotonic(), why, failed=True)
            return
        if proc is None or proc.poll() is None:
            return
        self._schedule(
            child,
            now,
            children.how_it_ended(proc.returncode),
            failed=now - child.started_at < STABLE_AFTER,
        )

    def _schedule(self, child: Child, now: float, why: str, *, failed: bool) -> None:
        """Plan a restart with capped exponential back-off, or give up on the bus."""
        if failed:
            child.failures += 1
        else:
            child.failures = 0
            child.delay = self.hierarchy.restart_min  # it ran fine for a while
        if child.failures >= START_ATTEMPTS:
            child.gave_up = True
            child.restart_at = None
            self.err(
                f"sbus-relay up: {child.spec.name} {why}; giving up on it after"
                f" {child.failures} failed starts in a row (the other buses keep running)"
            )
            return
        delay = child.delay
        child.delay = min(delay * 2, self.hierarchy.restart_max)
        child.restart_at = now + delay
        self.err(f"sbus-relay up: {child.spec.name} {why}; restarting in {delay:g}s")

    def _terminate_quietly(self, child: Child) -> None:
        """Stop a child that failed to start (it may still be running)."""
        if child.proc is not None:
            self._terminate_quietly_proc(child.proc)

    @staticmethod
    def _terminate_quietly_proc(proc: subprocess.Popen[Any]) -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def _terminate(self, child: Child) -> None:
        proc = child.proc
        if proc is None:
            return
        child.proc = None  # stopped once, reported once
        if proc.poll() is not None:
            return  # it exited by itself (and said so, or failed to start): nothing to stop
        if children.stop(proc, STOP_TIMEOUT):
            self.err(f"sbus-relay up: {child.spec.name} ignored SIGTERM; it was killed")
        self.out(f"{child.spec.name} stopped")


def listener_pid(address: Any) -> int | None:
    """The pid of the process listening at ``address``, or None if none answers
    (within ``LISTENER_PROBE_TIMEOUT``)."""
    try:
        sock = connect(address, timeout=LISTENER_PROBE_TIMEOUT)
    except (OSError, AddressError):
        return None
    try:
        return peer_ucred(sock)[0]
    except OSError:
        return None
    finally:
        sock.close()


def supervisor_of(pid: int) -> int | None:
    """The pid of the ``sbus-relay up`` that runs bus ``pid``, if one does."""
    status = children.process_status(pid)
    if status is None:
        return None
    parent = status[1]
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as stream:
            argv = stream.read(CMDLINE_BYTES).split(b"\0")
    except OSError:
        return None
    if any(b"sbus" in arg for arg in argv) and b"up" in argv:
        return parent
    return None


def tree_of(up_pid: int) -> str | None:
    """The hierarchy file that the ``sbus-relay up`` of pid ``up_pid`` runs (an
    absolute path), from its command line and directory; None if unknown."""
    try:
        with open(f"/proc/{up_pid}/cmdline", "rb") as stream:
            argv = [a.decode(errors="replace") for a in stream.read(CMDLINE_BYTES).split(b"\0")]
        cwd = os.readlink(f"/proc/{up_pid}/cwd")
    except OSError:
        return None
    if "up" not in argv:
        return None
    given = [a for a in argv[argv.index("up") + 1 :] if a and not a.startswith("-")]
    if len(given) != 1:
        return None
    path = os.path.join(cwd, given[0])
    return path if os.path.isfile(path) else None


def _printer(stream: IO[str]) -> Callable[[str], None]:
    def write(line: str) -> None:
        # A terminal that hung up, a pipe nobody reads: the line is lost, never
        # the supervision (the buses are still stopped in order).
        with contextlib.suppress(OSError, ValueError):
            stream.write(line + "\n")
            stream.flush()

    return write
