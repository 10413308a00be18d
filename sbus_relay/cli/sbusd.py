"""The ``sbusd`` drop-in: exactly the reference daemon's flags (SPEC §5).

    sbusd [-a ADDRESS] [-f | -p PIDFILE] [-u USER]... [-cgor]

Short flags combine as in getopt (``-fc``, ``-cgor``, ``-fa/tmp/s``).  There is
no ``-h``: the reference has none, and scripts must get the same errors.
"""

from __future__ import annotations

import argparse

#: The usage line, as the reference prints it.
USAGE = "sbusd [-a ADDRESS] [-f | -p PIDFILE] [-u USER]... [-cgor]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The reference flags; every unset flag is None so the defaults apply."""
    parser.add_argument("-a", dest="address", metavar="ADDRESS")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-f", dest="foreground", action="store_true", default=None)
    mode.add_argument("-p", dest="pidfile", metavar="PIDFILE")
    parser.add_argument("-u", dest="users", action="append", metavar="USER")
    parser.add_argument("-c", dest="exit_when_empty", action="store_true", default=None)
    parser.add_argument("-g", dest="group_access", action="store_true", default=None)
    parser.add_argument("-o", dest="other_access", action="store_true", default=None)
    parser.add_argument("-r", dest="remove_stale", action="store_true", default=None)


def parser() -> argparse.ArgumentParser:
    """A parser for ``sbusd``'s argv."""
    result = argparse.ArgumentParser(prog="sbusd", usage=USAGE, add_help=False)
    add_arguments(result)
    return result


def run(args: argparse.Namespace) -> int:
    """Serve with the defaults (docs/design.md) overridden by the flags."""
    from . import serve

    return serve.run(args)
