"""``sbus-relay`` subcommands, one module each (registered in ``cli.COMMANDS``).

Each module has ``add_arguments(parser)`` and ``run(args) -> int`` and imports
nothing heavy at module level, so ``sbus-relay --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os

#: Environment variable naming the bus for client commands (like NATS_URL).
ADDRESS_ENV = "SBUS_ADDRESS"
#: The reference sbusd's default address (docs/protocol.md, Addresses).
DEFAULT_ADDRESS = "/run/sbus.socket"


def add_address_argument(parser: argparse.ArgumentParser) -> None:
    """``-a ADDRESS`` for client commands; see ``bus_address``."""
    parser.add_argument(
        "-a",
        "--address",
        metavar="ADDRESS",
        help=f"the bus to use (default: ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})",
    )


def bus_address(args: argparse.Namespace) -> str:
    """-a, else $SBUS_ADDRESS, else the default; read when run, not when parsed.
    An empty ``-a ''`` is an address too (parse_address refuses it), not "unset"."""
    given = getattr(args, "address", None)
    if given is not None:
        return str(given)
    return os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
