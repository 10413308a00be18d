"""Run a whole hierarchy of buses on one machine: ``sbus-relay up HIERARCHY.yaml``.

Theory of operation.  A hierarchy file lists buses (a master and relays, each
naming its parent by name).  ``load_hierarchy`` validates it once into frozen
objects, with the same strictness as ``config.py``: unknown or duplicate keys,
wrong types, unknown parents, a bus that is its own parent and cycles are all
one ``ConfigError`` naming the file, the key and the reason.  The tree rule of
docs/protocol.md, Relays ("relays form a tree") is checked here, before anything runs.

``Supervisor`` starts each bus as an ``sbus-relay serve -f`` child, parents
first, and waits for each socket before starting its children.  A child that
dies is restarted with capped exponential back-off (a relay whose master
restarts reconnects by itself, docs/protocol.md, Relays).  ``stop()`` stops the children in
reverse order -- relays before their upstream, so no relay logs a needless
outage -- with SIGTERM, then SIGKILL after a grace period.

Children are started with ``children.spawn``: in their own session, so that a
Ctrl-C on the terminal reaches only the supervisor, which then stops them in
order; and each asks the kernel for SIGTERM if the supervisor dies, so none is
orphaned.  No argv parsing and no exits here: ``cli/up.py`` does that.

``reload()`` (SIGHUP to ``up``) reads the hierarchy file again: buses new to
it start, buses gone from it stop, every bus that stays is sent SIGHUP (it
reloads its own config file), and what a running bus cannot take -- a new
address, upstream, metrics address or args -- is named in one line and kept
until ``up`` restarts (docs/relays.md, "Reloading a tree").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from sbus_relay.protocol.errors import AddressError, ConfigError, SbusError
from sbus_relay.protocol.limits import UPGRADE_WAIT

from . import children, natscluster
from .addresses import connect, parse_address, peer_ucred
from .config import config_from_mapping, read_yaml
from .handover import SUPERVISED_ENV, TAKE_OVER_ENV

#: Keys of the hierarchy file and of each bus entry.
TOP_KEYS = ("buses", "log_dir", "restart_min", "restart_max", "nats_cluster")
BUS_KEYS = ("name", "address", "upstream", "metrics", "args")
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
#: Bytes read from the end of a bus's log to quote its last line on failure.
LOG_TAIL_BYTES = 4096
#: Characters of that last line quoted.
LOG_LINE_QUOTED = 300
#: Default restart back-off, seconds (first delay, cap).
RESTART_MIN = 0.5
RESTART_MAX = 10.0


class SupervisorError(SbusError):
    """A bus could not be started (it exited, or never listened)."""


@dataclass(frozen=True)
class BusSpec:
    """One bus of the hierarchy, as validated from the file."""

    name: str
    address: str
    upstream: str | None  # the parent's name, None for a master
    metrics: str | None
    args: tuple[str, ...]


@dataclass(frozen=True)
class Hierarchy:
    """A validated hierarchy: ``buses`` in start order (every parent before its children)."""

    buses: tuple[BusSpec, ...]
    log_dir: str | None = None
    restart_min: float = RESTART_MIN
    restart_max: float = RESTART_MAX
    #: nats-servers started before the buses and stopped after them (docs/nats.md)
    nats_cluster: tuple[natscluster.NatsNode, ...] = ()

    def bus(self, name: str) -> BusSpec:
        """The bus called ``name``."""
        return next(b for b in self.buses if b.name == name)


# --- loading ---------------------------------------------------------------------


def load_hierarchy(path: str) -> Hierarchy:
    """Read and validate the hierarchy file at ``path``; raises ``ConfigError``."""
    return hierarchy_from_mapping(read_yaml(path), path)


def hierarchy_from_mapping(document: Any, source: str) -> Hierarchy:
    """Validate an already parsed hierarchy document (``source`` names it in errors)."""
    if not isinstance(document, Mapping):
        raise ConfigError(source, "(file)", "expected a mapping with a 'buses' list")
    for key in document:
        if key not in TOP_KEYS:
            raise ConfigError(source, str(key), f"unknown key (known keys: {', '.join(TOP_KEYS)})")
    raw_buses = document.get("buses")
    if not isinstance(raw_buses, list) or not raw_buses:
        raise ConfigError(source, "buses", "expected a non-empty list of buses")
    # The restart delays and log_dir follow config.py's rules for seconds and text.
    timing = _checked(
        source,
        "",
        {
            "reconnect_min": document.get("restart_min", RESTART_MIN),
            "reconnect_max": document.get("restart_max", RESTART_MAX),
        },
        rename={"reconnect_min": "restart_min", "reconnect_max": "restart_max"},
    )
    log_dir = document.get("log_dir")
    if log_dir is not None and (not isinstance(log_dir, str) or not log_dir):
        raise ConfigError(source, "log_dir", f"expected a directory path, got {log_dir!r}")
    specs = [_bus(source, i, raw) for i, raw in enumerate(raw_buses)]
    _check_tree(source, specs)
    ordered = sorted(specs, key=lambda s: _depth(specs, s))  # stable: file order per level
    cluster = document.get("nats_cluster")
    nodes = natscluster.parse_cluster(source, cluster) if cluster is not None else ()
    return Hierarchy(tuple(ordered), log_dir, timing.reconnect_min, timing.reconnect_max, nodes)


def _bus(source: str, i: int, raw: Any) -> BusSpec:
    where = f"buses[{i}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(source, where, "expected a mapping with name and address")
    for key in raw:
        if key not in BUS_KEYS:
            known = ", ".join(BUS_KEYS)
            raise ConfigError(source, f"{where}.{key}", f"unknown key (known keys: {known})")
    name = raw.get("name")
    if not isinstance(name, str) or not name or "/" in name or name.startswith("-"):
        raise ConfigError(source, f"{where}.name", f"expected a short name, got {name!r}")
    where = f"buses[{name}]"
    if "address" not in raw:
        raise ConfigError(source, f"{where}.address", "missing (where the bus listens)")
    checked = _checked(source, where, {"address": raw["address"], "metrics": raw.get("metrics")})
    address = checked.address
    try:
        parsed = parse_address(address)
    except AddressError as exc:
        raise ConfigError(source, f"{where}.address", str(exc)) from None
    if (parsed.kind == "abstract" and parsed.name is None) or parsed.kind == "fd":
        raise ConfigError(source, f"{where}.address", "a supervised bus needs a fixed address")
    upstream = raw.get("upstream")
    if upstream is not None and (not isinstance(upstream, str) or not upstream):
        raise ConfigError(source, f"{where}.upstream", "expected the name of another bus")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(source, f"{where}.args", "expected a list of strings (serve flags)")
    return BusSpec(name, address, upstream, checked.metrics, tuple(args))


def _checked(
    source: str, where: str, values: dict[str, Any], rename: Mapping[str, str] | None = None
) -> Any:
    """Validate ``values`` with config.py's own rules; errors name our key."""
    try:
        return config_from_mapping(values, source)
    except ConfigError as exc:
        key = (rename or {}).get(exc.key, exc.key)
        raise ConfigError(source, f"{where}.{key}" if where else key, exc.reason) from None


def _check_tree(source: str, specs: list[BusSpec]) -> None:
    """Relays form a tree: unique names, addresses and ports, known parents, no cycles."""
    names: dict[str, BusSpec] = {}
    addresses: dict[str, str] = {}
    ports: dict[str, str] = {}
    for spec in specs:
        where = f"buses[{spec.name}]"
        if spec.name in names:
            raise ConfigError(source, f"{where}.name", "two buses have this name")
        names[spec.name] = spec
        # Resolved, so that two spellings of one socket (a symlinked directory,
        # a symlink to the socket) are caught too.
        path = os.path.realpath(spec.address)
        if path in addresses:
            other = addresses[path]
            raise ConfigError(source, f"{where}.address", f"bus {other!r} listens there too")
        addresses[path] = spec.name
        if spec.metrics is not None:
            port = spec.metrics.rsplit(":", 1)[1]
            if port != "0" and port in ports:
                other = ports[port]
                raise ConfigError(source, f"{where}.metrics", f"port also used by bus {other!r}")
            ports[port] = spec.name
    for spec in specs:
        where = f"buses[{spec.name}].upstream"
        if spec.upstream is None:
            continue
        if spec.upstream == spec.name:
            raise ConfigError(source, where, "a bus cannot be its own upstream (a loop)")
        if spec.upstream not in names:
            raise ConfigError(source, where, f"no bus named {spec.upstream!r} in this file")
        seen = {spec.name}
        parent: str | None = spec.upstream
        while parent is not None:
            if parent in seen:
                raise ConfigError(source, where, f"cycle through {parent!r}: relays form a tree")
            seen.add(parent)
            parent = names[parent].upstream
    if all(s.upstream is not None for s in specs):
        raise ConfigError(source, "buses", "no master (a bus without upstream)")


def _depth(specs: list[BusSpec], spec: BusSpec) -> int:
    by_name = {s.name: s for s in specs}
    depth = 0
    while spec.upstream is not None:
        spec = by_name[spec.upstream]
        depth += 1
    return depth


# --- reloading -------------------------------------------------------------------

#: What a running bus cannot take from a changed entry: kept until up restarts.
_BUS_FIELDS = ("address", "upstream", "metrics", "args")


@dataclass(frozen=True)
class TreeReload:
    """What a reload of the hierarchy does: the tree it leaves running, the buses
    it starts and stops, and the buses kept as they run, each with why."""

    hierarchy: Hierarchy
    started: tuple[str, ...]
    stopped: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]


def plan_tree_reload(running: Hierarchy, loaded: Hierarchy, *, source: str) -> TreeReload:
    """Compare the running tree with the file read again.

    A bus of both with the same entry stays; one whose entry changed stays as
    it runs (named in ``kept``); a new one starts; one gone from the file
    stops -- unless a bus that stays still runs under it (then it is kept too).
    ``log_dir`` is kept as it was; the restart delays change.  Raises
    ``ConfigError`` if the tree that would run breaks the tree rules (a new
    bus at a kept bus's address, say).
    """
    old = {spec.name: spec for spec in running.buses}
    kept: list[tuple[str, str]] = []
    specs: dict[str, BusSpec] = {}
    for spec in loaded.buses:
        before = old.get(spec.name)
        if before is None or before == spec:
            specs[spec.name] = spec
            continue
        specs[spec.name] = before
        changed = [f for f in _BUS_FIELDS if getattr(before, f) != getattr(spec, f)]
        kept.append((spec.name, "changed " + ", ".join(changed)))
    needed = True
    while needed:  # a bus gone from the file that a remaining bus runs under stays
        needed = False
        for spec in list(specs.values()):
            parent = spec.upstream
            if parent is not None and parent not in specs:
                specs[parent] = old[parent]
                kept.append((parent, f"gone from the file, but {spec.name} runs under it"))
                needed = True
    if loaded.log_dir != running.log_dir:
        kept.append(("log_dir", f"still {running.log_dir}"))
    # the running buses first, so that a clash is reported on the newcomer
    remaining = sorted(specs.values(), key=lambda s: s.name not in old)
    _check_tree(source, remaining)
    ordered = sorted(remaining, key=lambda s: _depth(remaining, s))
    stopped = tuple(s.name for s in running.buses if s.name not in specs)
    started = tuple(s.name for s in ordered if s.name not in old)
    tree = Hierarchy(tuple(ordered), running.log_dir, loaded.restart_min, loaded.restart_max)
    return TreeReload(tree, started, stopped, tuple(kept))


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

        Raises ``SupervisorError`` (after stopping what was started) if one fails.
        """
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
            try:
                self._spawn(child)
            except SupervisorError:
                self.stop()
                raise
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
                self.argv(spec), log=self._log_path(spec), new_session=True, env=env
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
                    f"sbus-relay up: {spec.name} not upgraded: the new process exited with"
                    f" status {status}{why}; pid {old.pid} serves on"
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
        """The ``serve`` command line for ``spec`` (-r: a crashed bus leaves its socket)."""
        argv = [*self.command, "-f", "-r", "-a", spec.address, "--instance", spec.name]
        if spec.upstream is not None:
            argv += ["--upstream", self.hierarchy.bus(spec.upstream).address]
        if spec.metrics is not None:
            argv += ["--metrics", spec.metrics]
        return [*argv, *spec.args]

    def _log_path(self, spec: BusSpec) -> str | None:
        log_dir = self.hierarchy.log_dir
        return os.path.join(log_dir, f"{spec.name}.log") if log_dir else None

    def _spawn(self, child: Child) -> None:
        spec = child.spec
        log_path = self._log_path(spec)
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
                    f"bus {child.spec.name} exited with status {status} before listening"
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
        log_path = self._log_path(child.spec)
        if log_path:
            last = _last_line(log_path)
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
            f"exited with status {proc.returncode}",
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
    """The pid of the process listening at ``address``, or None if none answers."""
    try:
        sock = connect(address)
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
            argv = stream.read(LOG_TAIL_BYTES).split(b"\0")
    except OSError:
        return None
    if any(b"sbus" in arg for arg in argv) and b"up" in argv:
        return parent
    return None


def _last_line(path: str) -> str:
    """The last non-empty line of a text file ("" if none), shortened."""
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - LOG_TAIL_BYTES))
            lines = [line for line in stream.read().splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].decode("utf-8", "replace")[:LOG_LINE_QUOTED] if lines else ""


def _printer(stream: IO[str]) -> Callable[[str], None]:
    def write(line: str) -> None:
        # A terminal that hung up, a pipe nobody reads: the line is lost, never
        # the supervision (the buses are still stopped in order).
        with contextlib.suppress(OSError, ValueError):
            stream.write(line + "\n")
            stream.flush()

    return write
