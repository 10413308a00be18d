"""Start and supervise a hierarchy of buses: sbus-relay up HIERARCHY.yaml.

What it owns: the up command's arguments and lines.  What it may touch:
ops.hierarchy and ops.supervisor.

For development and demos on one machine: ``sbus-relay up
configs/dev-hierarchy.yaml`` starts a master and its relays, restarts any that
dies, and stops them all (relays first) on Ctrl-C or SIGTERM, exiting 0.
SIGHUP (or ``sbus-relay up --reload HIERARCHY.yaml``) reloads the whole tree:
the file is read again and every bus reloads its own config; a SIGHUP that
finds the terminal ``up`` was started from gone is a hang-up and stops it.
The file format is in docs/relays.md; a bad file is one error line and status 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from sbus_relay.ops.config import COMMAND_LINE
from sbus_relay.protocol.errors import ConfigError, UsageError

from .options import CommandParser

if TYPE_CHECKING:
    from sbus_relay.ops.hierarchy import BusSpec, Hierarchy

#: Signals that stop the whole hierarchy.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The signal that reloads it.
RELOAD_SIGNAL = signal.SIGHUP
#: Exit status when a bus cannot be started (or the tree is already up).
EXIT_START_FAILED = 1
#: serve settings that the hierarchy file itself decides for each bus, and the
#: file's key (or the reason) for each: a bus's ``args`` may not override them,
#: or what up prints, the tree check and the supervision itself would be wrong.
OWNED_BY_THE_FILE = {
    "address": "its 'address' key",
    "upstream": "its 'upstream' key",
    "metrics": "its 'metrics' key",
    "instance": "its 'name' key",
    "foreground": "up runs every bus in the foreground",
    "pidfile": "up runs every bus in the foreground, without a pid file",
    "remove_stale": "up restarts a bus over the socket a crash left",
    "check": "up runs every bus; `up --check` checks the file",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """HIERARCHY.yaml and --check."""
    parser.add_argument(
        "hierarchy",
        metavar="HIERARCHY.yaml",
        help="the buses to run (see configs/dev-hierarchy.yaml)",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--check", action="store_true", help="only validate the file and print the start order"
    )
    action.add_argument(
        "--reload",
        action="store_true",
        help="reload the tree of this file that an `up` runs (as SIGHUP to that `up` does)",
    )


class _Refused(Exception):
    """argparse's complaint, raised instead of exiting."""


class _Parser(CommandParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def _serve_parser() -> _Parser:
    from sbus_relay.cli import serve

    parser = _Parser(prog="serve", add_help=False)
    serve.add_arguments(parser)
    return parser


def _check_own_args(source: str, name: str, args: tuple[str, ...]) -> None:
    """Refuse a bus whose ``args:`` set what the file decides (``OWNED_BY_THE_FILE``)."""
    parser = _serve_parser()
    try:
        given = parser.parse_args(list(args))
    except _Refused as exc:
        raise ConfigError(source, f"buses[{name}].args", str(exc)) from None
    for dest, owner in OWNED_BY_THE_FILE.items():
        if getattr(given, dest, None) is not None:
            flags = next(a.option_strings for a in parser._actions if a.dest == dest)
            raise ConfigError(
                source,
                f"buses[{name}].args",
                f"{'/'.join(flags)} is not for args: "
                + (f"{owner} sets it" if owner.startswith("its ") else owner),
            )


def _check_serve_flags(
    source: str, name: str, flags: list[str], upstream: str | None, metrics: str | None
) -> None:
    """Refuse, before anything starts, a bus whose ``serve`` flags (its ``args:``
    included) serve would refuse, or whose ``-C`` file in ``args`` sets what the
    hierarchy file decides: one line naming the bus's ``args``."""
    from sbus_relay.cli import serve

    try:
        config = serve.config_from(_serve_parser().parse_args(flags))
    except ConfigError as exc:
        reason = f"{exc.key}: {exc.reason}" if exc.source == COMMAND_LINE else str(exc)
        raise ConfigError(source, f"buses[{name}].args", reason) from None
    except (_Refused, UsageError) as exc:
        raise ConfigError(source, f"buses[{name}].args", str(exc)) from None
    for key, wanted, got in (
        ("upstream", upstream, config.upstream),
        ("metrics", metrics, config.metrics),
    ):
        if got != wanted:
            raise ConfigError(
                source,
                f"buses[{name}].args",
                f"its config file sets {key} {got}: the bus's own '{key}' key decides that",
            )


def _already_up(source: str, running: list[tuple[BusSpec, int]]) -> str:
    """One line: this tree is already up (and where), or who holds its addresses."""
    from sbus_relay.ops.supervisor import supervisor_of

    spec, pid = running[0]
    more = len(running) - 1
    also = f"; {more} more of its buses answer too" if more else ""
    owner = supervisor_of(pid)
    if owner is not None:
        return (
            f"{source} is already up: sbus-relay up pid {owner} runs it ({spec.name} answers"
            f" at {spec.address}, pid {pid}{also}); stop that one first (Ctrl-C where it"
            f" runs, or kill {owner})"
        )
    return (
        f"{source}: {spec.name}'s address {spec.address} is in use by pid {pid}, which no"
        f" sbus-relay up runs{also}; stop it or give the bus another address"
    )


def load_checked(path: str) -> Hierarchy:
    """Read and validate the hierarchy file, the ``serve`` flags of each bus
    included (what ``up`` runs, and reloads); raises ``ConfigError``."""
    from sbus_relay.ops.hierarchy import load_hierarchy

    hierarchy = load_hierarchy(path)
    for spec in hierarchy.buses:
        _check_own_args(path, spec.name, spec.args)
        flags = hierarchy.serve_flags(spec)
        parent = hierarchy.bus(spec.upstream).address if spec.upstream else None
        _check_serve_flags(path, spec.name, flags, parent, spec.metrics)
    return hierarchy


def _ask_to_reload(source: str, hierarchy: Hierarchy) -> int:
    """``--reload``: SIGHUP to the ``up`` that runs this tree."""
    from sbus_relay.ops.supervisor import Supervisor, supervisor_of

    owners = {supervisor_of(pid) for _spec, pid in Supervisor(hierarchy).already_running()}
    owners.discard(None)
    if len(owners) != 1:
        why = "none of its buses answers" if not owners else "its buses belong to several"
        print(f"sbus-relay up: {source} is not up under one sbus-relay up ({why})", file=sys.stderr)
        return EXIT_START_FAILED
    (owner,) = owners
    assert owner is not None
    os.kill(owner, RELOAD_SIGNAL)
    print(f"sbus-relay up: asked sbus-relay up pid {owner} to reload {source}; it says how it went")
    return 0


def run(args: argparse.Namespace) -> int:
    """Validate, start every bus, supervise until a stop signal; reload on SIGHUP."""
    from sbus_relay.ops.daemon import has_terminal
    from sbus_relay.ops.supervisor import Supervisor, SupervisorError

    hierarchy = load_checked(args.hierarchy)  # ConfigError -> one line, status 2 (cli)
    if args.reload:
        return _ask_to_reload(args.hierarchy, hierarchy)
    supervisor = Supervisor(
        hierarchy, load=lambda: load_checked(args.hierarchy), source=args.hierarchy
    )
    if args.check:
        from sbus_relay.ops import natscluster

        for command in supervisor.start_order():
            print(" ".join(command))
        if hierarchy.nats_cluster and natscluster.binary() is None:
            why = natscluster.NO_SERVER
            print(f"sbus-relay up: the NATS cluster would not start: {why}", file=sys.stderr)
        return 0
    running = supervisor.already_running()
    if running:
        print(f"sbus-relay up: {_already_up(args.hierarchy, running)}", file=sys.stderr)
        return EXIT_START_FAILED
    # a SIGHUP that finds our terminal gone is a hang-up (daemon.has_terminal)
    hangup_stops = has_terminal() and signal.getsignal(RELOAD_SIGNAL) is not signal.SIG_IGN

    def stop(signum: int, _frame: object) -> None:
        supervisor.request_stop()

    def hup(signum: int, _frame: object) -> None:
        if hangup_stops and not has_terminal():
            supervisor.request_stop()
        else:
            supervisor.request_reload()

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    # SIGUSR2 (``sbus-relay upgrade``): every bus handed to the installed version
    signal.signal(signal.SIGUSR2, lambda _signum, _frame: supervisor.request_upgrade())
    signal.signal(RELOAD_SIGNAL, hup)
    try:
        supervisor.start()
        if hierarchy.nats_cluster:
            _try_the_fleet(hierarchy)
        supervisor.run()
    except SupervisorError as exc:
        print(f"sbus-relay up: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    finally:
        supervisor.stop()
    return 0


def _try_the_fleet(hierarchy: Hierarchy) -> None:
    """How to see a message cross from one host to another (docs/nats.md)."""
    masters = [b for b in hierarchy.buses if b.upstream is None]
    if len(masters) < 2:
        return

    def edge(master: BusSpec) -> BusSpec:  # its relay if it has one
        return next((b for b in hierarchy.buses if b.upstream == master.name), master)

    one, other = edge(masters[0]), edge(masters[-1])
    program = _program()
    print(f"try: {program} sub -a {other.address} 'demo/'")
    print(f" and: {program} pub -a {one.address} demo/hello 'from {masters[0].name}'", flush=True)


def _program() -> str:
    """``sbus-relay`` as the user can run it again: the path it was started by
    (``.venv/bin/sbus-relay`` from a checkout) unless the shell finds it by name."""
    started = sys.argv[0]
    if os.path.basename(started) != "sbus-relay":
        return "sbus-relay"  # python -m sbus_relay, or a wrapper
    found = shutil.which("sbus-relay")
    if found is not None and os.path.realpath(found) == os.path.realpath(started):
        return "sbus-relay"
    return shlex.quote(started)
