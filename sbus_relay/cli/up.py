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
from typing import NoReturn

from sbus_relay.ops.config import COMMAND_LINE
from sbus_relay.protocol.errors import ConfigError, UsageError

#: Signals that stop the whole hierarchy.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Exit status when a bus cannot be started.
EXIT_START_FAILED = 1


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


def _check_serve_flags(source: str, name: str, flags: list[str]) -> None:
    """Refuse, before anything starts, a bus whose ``serve`` flags (its ``args:``
    included) serve would refuse: one line naming the bus's ``args``."""
    from sbus_relay.cli import serve

    parser = _Parser(prog="serve", add_help=False)
    serve.add_arguments(parser)
    try:
        serve.config_from(parser.parse_args(flags))
    except ConfigError as exc:
        reason = f"{exc.key}: {exc.reason}" if exc.source == COMMAND_LINE else str(exc)
        raise ConfigError(source, f"buses[{name}].args", reason) from None
    except (_Refused, UsageError) as exc:
        raise ConfigError(source, f"buses[{name}].args", str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Validate, start every bus, supervise until a stop signal."""
    from sbus_relay.ops.supervisor import Supervisor, SupervisorError, load_hierarchy

    hierarchy = load_hierarchy(args.hierarchy)  # ConfigError -> one line, status 2 (cli)
    supervisor = Supervisor(hierarchy)
    for spec in hierarchy.buses:
        flags = supervisor.argv(spec)[len(supervisor.command) :]
        _check_serve_flags(args.hierarchy, spec.name, flags)
    if args.check:
        for spec in hierarchy.buses:
            print(" ".join(supervisor.argv(spec)))
        return 0

    def stop(signum: int, _frame: object) -> None:
        supervisor.request_stop()

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    try:
        supervisor.start()
        supervisor.run()
    except SupervisorError as exc:
        print(f"sbus-relay up: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    finally:
        supervisor.stop()
    return 0
