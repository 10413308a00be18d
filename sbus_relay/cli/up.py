"""Start and supervise a hierarchy of buses: sbus-relay up HIERARCHY.yaml.

For development and demos on one machine: ``sbus-relay up
configs/dev-hierarchy.yaml`` starts a master and its relays, restarts any that
dies, and stops them all (relays first) on Ctrl-C or SIGTERM, exiting 0.  The
file format is in docs/relays.md; a bad file is one error line and status 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from sbus_relay.ops.config import COMMAND_LINE
from sbus_relay.protocol.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from sbus_relay.ops.supervisor import BusSpec

#: Signals that stop the whole hierarchy.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
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
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """HIERARCHY.yaml and --check."""
    parser.add_argument(
        "hierarchy",
        metavar="HIERARCHY.yaml",
        help="the buses to run (see configs/dev-hierarchy.yaml)",
    )
    parser.add_argument(
        "--check", action="store_true", help="only validate the file and print the start order"
    )


class _Refused(Exception):
    """argparse's complaint, raised instead of exiting."""


class _Parser(argparse.ArgumentParser):
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
                f"{'/'.join(flags)} is not for args: {owner} sets it",
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


def run(args: argparse.Namespace) -> int:
    """Validate, start every bus, supervise until a stop signal."""
    from sbus_relay.ops.supervisor import Supervisor, SupervisorError, load_hierarchy

    hierarchy = load_hierarchy(args.hierarchy)  # ConfigError -> one line, status 2 (cli)
    supervisor = Supervisor(hierarchy)
    for spec in hierarchy.buses:
        _check_own_args(args.hierarchy, spec.name, spec.args)
        flags = supervisor.argv(spec)[len(supervisor.command) :]
        parent = hierarchy.bus(spec.upstream).address if spec.upstream else None
        _check_serve_flags(args.hierarchy, spec.name, flags, parent, spec.metrics)
    if args.check:
        for spec in hierarchy.buses:
            print(" ".join(supervisor.argv(spec)))
        return 0
    running = supervisor.already_running()
    if running:
        print(f"sbus-relay up: {_already_up(args.hierarchy, running)}", file=sys.stderr)
        return EXIT_START_FAILED

    def stop(signum: int, _frame: object) -> None:
        supervisor.request_stop()

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    # SIGUSR2 (``sbus-relay upgrade``): every bus handed to the installed version
    signal.signal(signal.SIGUSR2, lambda _signum, _frame: supervisor.request_upgrade())
    try:
        supervisor.start()
        supervisor.run()
    except SupervisorError as exc:
        print(f"sbus-relay up: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    finally:
        supervisor.stop()
    return 0
