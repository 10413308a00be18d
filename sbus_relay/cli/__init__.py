"""Command-line entry points: the only code that reads argv or exits.

What it owns: the command table and its dispatch, argv and the exit status.
What it may touch: every command module, loaded on demand.

``sbusd`` is a drop-in for the reference daemon and takes exactly its flags
(docs/protocol.md).  ``sbus-relay`` is a family of subcommands listed in ``COMMANDS``;
a command's module is imported only when it is run (or for ``--help``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from sbus_relay import __version__
from sbus_relay.protocol.errors import AddressError, ConfigError, UpgradeError, UsageError

from .options import CommandParser

#: name -> module with ``add_arguments(parser)`` and ``run(args) -> int``.
#: One entry per line: other commands are added here by their authors.
COMMANDS: dict[str, str] = {
    "serve": "sbus_relay.cli.serve",
    "pub": "sbus_relay.cli.pub",
    "sub": "sbus_relay.cli.sub",
    "bench": "sbus_relay.cli.bench",
    "up": "sbus_relay.cli.up",
    "record": "sbus_relay.cli.record",
    "analyze": "sbus_relay.cli.analyze",
    "spark-server": "sbus_relay.cli.spark_server",
    "top": "sbus_relay.cli.top",
    "upgrade": "sbus_relay.cli.upgrade",
}

#: Exit status for bad flags, config or addresses (argparse uses it too).
EXIT_USAGE = 2
#: Exit status after SIGINT in an interactive command (128 + SIGINT).
EXIT_INTERRUPTED = 130
#: Modules of the optional ``spark`` extra (record, analyze): missing, they are
#: one line saying how to install them, not a traceback.
SPARK_EXTRA = frozenset({"pyspark", "pyarrow", "matplotlib", "py4j"})
#: Exit status when a command needs an optional extra that is not installed.
EXIT_MISSING_EXTRA = 3


#: What each command does, and one example: its line in ``sbus-relay --help``
#: and the top of its own ``--help``.
HELP: dict[str, tuple[str, str]] = {
    "serve": (
        "Run a bus: a master, or with --upstream a relay of another bus.",
        "sbus-relay serve -C configs/default.yaml",
    ),
    "pub": (
        "Publish one message, and wait until the bus has taken it.",
        "sbus-relay pub sensors/kitchen/temp 21.5",
    ),
    "sub": (
        "Print every message whose key matches a pattern, one line each.",
        "sbus-relay sub 'sensors/*/temp' 'alerts/'",
    ),
    "bench": (
        "Measure the bus on realistic traffic, beside the reference sbusd run live.",
        "sbus-relay bench --quick",
    ),
    "up": (
        "Run a master and its relays from one file; restart any that dies.",
        "sbus-relay up configs/dev-hierarchy.yaml",
    ),
    "record": (
        "Record bus traffic to rotating Parquet files.",
        "sbus-relay record --duration 60 --out captures",
    ),
    "analyze": (
        "Compute traffic statistics and a report with charts from recordings (PySpark).",
        "sbus-relay analyze captures --out report",
    ),
    "spark-server": (
        "Run a long-lived Spark Connect server for analyze --remote (from the installed pyspark).",
        "sbus-relay spark-server --port 15002 --memory 4g",
    ),
    "upgrade": (
        "Upgrade running buses in place: nobody is disconnected, nothing is lost.",
        "sbus-relay upgrade -a /run/sbus.socket",
    ),
    "top": (
        "Watch buses live: their clients, rates, drops and queues, per client, relay or user.",
        "sbus-relay top configs/dev-hierarchy.yaml",
    ),
}
#: Where the protocol is described, named at the end of ``sbus-relay --help``.
PROTOCOL_DOC = "docs/protocol.md"


def _build_parser(only: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sbus-relay",
        description="A local sbus message bus, with relays.",
        epilog=f"Each command's -h says more; the protocol is described in {PROTOCOL_DOC}"
        " of the sbus_relay source tree.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=CommandParser
    )
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        summary, example = HELP.get(name, ("", ""))
        sub = subparsers.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=f"example: {example}" if example else None,
        )
        module.add_arguments(sub)
        sub.set_defaults(_module=module)
    return parser


def _drop_inherited_alarm() -> None:
    """Cancel an alarm pending from the process that exec'd a bus: not the bus's
    own, its SIGALRM would end a foreground bus at a moment nobody chose (a
    forked daemon drops it anyway).  The reference's test program arms one
    second before each daemon it starts, then tests that daemon for longer.
    First thing, before the imports that take a loaded machine a while."""
    signal.alarm(0)


def main(argv: Sequence[str] | None = None) -> int:
    """``sbus-relay COMMAND ...``; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["serve"]:
        _drop_inherited_alarm()
    # Import only the command being run; build every parser for --help.
    only = args_list[0] if args_list and args_list[0] in COMMANDS else None
    parser = _build_parser(only)
    args = parser.parse_args(args_list)
    status = _run(f"sbus-relay {args.command}", args._module, args)
    if argv is None and args.command in ENDS_AT_ONCE:
        _end_at_once(status)
    return status


def _run(prog: str, module: ModuleType, args: argparse.Namespace) -> int:
    try:
        return int(module.run(args))
    except (ConfigError, AddressError, UsageError) as exc:
        # One line, no traceback: the user can fix this.
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UpgradeError as exc:
        print(f"{prog}: upgrade: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in SPARK_EXTRA:
            raise
        print(
            f"{prog}: needs {top}, from the optional 'spark' extra; install it with"
            " `.venv/bin/pip install -e '.[spark]'` in a clone (`make test` does),"
            " or `pip install 'sbus_relay[spark]'`",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA
    except RecursionError:
        # Only input nested thousands deep recurses this far (a YAML file, say).
        print(f"{prog}: input nested too deeply", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def sbusd_main(argv: Sequence[str] | None = None) -> int:
    """``sbusd``: the drop-in daemon; returns the exit status."""
    _drop_inherited_alarm()
    from . import sbusd

    args = sbusd.parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    status = _run("sbusd", sbusd, args)
    if argv is None:
        _end_at_once(status)
    return status


#: Commands whose process ends at once when they are done (``_end_at_once``).
ENDS_AT_ONCE = frozenset({"serve", "analyze"})


def _end_at_once(status: int) -> NoReturn:
    """End a command's process at once once it is done -- a bus that has
    stopped, its socket and pid file removed and its last line logged; an
    analysis whose output is written and said: the interpreter's teardown only
    frees a heap the kernel frees anyway.  For a bus on a loaded machine it
    took most of the second within which a stop signal ends the bus
    (docs/protocol.md); for analyze, the modules of pyspark, pandas and
    pyarrow took 0.2 to 0.5 s of a two-second report (docs/pipeline.md)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
