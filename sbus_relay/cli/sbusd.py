"""The ``sbusd`` drop-in: exactly the reference daemon's flags, plus ``-h``.

What it owns: the reference daemon's flags, parsed as getopt does.  What it
may touch: cli.serve, which runs the bus.

    sbusd [-a ADDRESS] [-f | -p PIDFILE] [-u USER]... [-cgor]

Short flags combine as in getopt (``-fc``, ``-cgor``, ``-fa/tmp/s``).
"""

from __future__ import annotations

import argparse

from .options import add_address_argument

#: The usage line, as the reference prints it.
USAGE = "sbusd [-a ADDRESS] [-f | -p PIDFILE] [-u USER]... [-cgor]"
#: What ``sbusd -h`` says above the flags.
DESCRIPTION = (
    "Run an sbus message bus on a Unix SOCK_SEQPACKET socket; a drop-in for the "
    "reference sbusd.  Without -f it daemonises once listening and writes a pid file."
)
#: ... and below them.
EPILOG = "example: sbusd -f -r -a /tmp/sbus.socket    (protocol: docs/protocol.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The reference flags; every unset flag is None so the defaults apply."""
    add_address_argument(parser, listen=True, flags=("-a",))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "-f",
        dest="foreground",
        action="store_true",
        default=None,
        help="stay in the foreground; stdin and stdout are closed once listening",
    )
    mode.add_argument(
        "-p",
        dest="pidfile",
        metavar="PIDFILE",
        help="daemonise and write the pid here (default /run/sbus.pid; /dev/null: none)",
    )
    parser.add_argument(
        "-u",
        dest="users",
        action="append",
        metavar="USER",
        help="let only these users (name or uid, repeatable) and our own connect",
    )
    parser.add_argument(
        "-c",
        dest="exit_when_empty",
        action="store_true",
        default=None,
        help="exit once the last client has disconnected",
    )
    parser.add_argument(
        "-g",
        dest="group_access",
        action="store_true",
        default=None,
        help="let the socket's group connect (mode 0770)",
    )
    parser.add_argument(
        "-o",
        dest="other_access",
        action="store_true",
        default=None,
        help="let everyone else connect (mode 0707; 0777 with -g)",
    )
    parser.add_argument(
        "-r",
        dest="remove_stale",
        action="store_true",
        default=None,
        help="remove a file left at the socket path first (never a live server's socket)",
    )


def parser() -> argparse.ArgumentParser:
    """A parser for ``sbusd``'s argv."""
    result = argparse.ArgumentParser(
        prog="sbusd", usage=USAGE, description=DESCRIPTION, epilog=EPILOG
    )
    add_arguments(result)
    return result


def run(args: argparse.Namespace) -> int:
    """Serve with the defaults overridden by the flags.  There is no config
    file to reload: SIGHUP stops, as it does the reference daemon."""
    from . import serve

    return serve.run_server(serve.config_from(args))
