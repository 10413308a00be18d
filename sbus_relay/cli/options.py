"""Options that several commands share, each defined once here.

* ``-a ADDRESS``: the bus a client command uses (``$SBUS_ADDRESS``, else the
  default), or where a server listens;
* ``-C CONFIG``: the server's YAML file;
* ``--metrics HOST:PORT``: where a server serves its metrics, or (repeatable)
  which buses ``top`` watches;
* ``--log-level``, ``--log-format``, ``--log-file``: a server's log; and
  ``configure_logging``, the one call through which a command sets it up.

Each command module has ``add_arguments(parser)`` and ``run(args) -> int``
(registered in ``cli.COMMANDS``) and imports nothing heavy at module level,
so ``sbus-relay --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os

from sbus_relay.ops.addresses import DEFAULT_ADDRESS
from sbus_relay.ops.config import LOG_FORMATS, LOG_LEVELS
from sbus_relay.protocol.errors import ConfigError, UsageError

#: Environment variable naming the bus for client commands (like NATS_URL).
ADDRESS_ENV = "SBUS_ADDRESS"
#: What the address is, in every help text that takes one.
ADDRESS_FORMS = "a socket path, /dev/unix/abstract[/HEX] or /dev/fd/N"


def add_address_argument(
    parser: argparse.ArgumentParser, *, listen: bool = False, flags: tuple[str, ...] = ()
) -> None:
    """``-a ADDRESS``: the bus to use (see ``bus_address``), or with ``listen``
    where a server listens (``dest`` ``address``, unset: None)."""
    if listen:
        text = f"where to listen: {ADDRESS_FORMS} (default {DEFAULT_ADDRESS})"
    else:
        text = f"the bus to use: {ADDRESS_FORMS} (default: ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})"
    parser.add_argument(
        *(flags or ("-a", "--address")), dest="address", metavar="ADDRESS", help=text
    )


def bus_address(args: argparse.Namespace) -> str:
    """-a, else $SBUS_ADDRESS, else the default; read when run, not when parsed.

    An empty ``-a ''`` is an address too (parse_address refuses it), and so is
    an empty ``$SBUS_ADDRESS``: a variable that is set names the bus, so set
    but empty is an error, never "use the default".
    """
    given = getattr(args, "address", None)
    if given is not None:
        return str(given)
    named = os.environ.get(ADDRESS_ENV)
    if named is None:
        return DEFAULT_ADDRESS
    if not named:
        raise UsageError(
            f"${ADDRESS_ENV} is set but empty: unset it, or set it to the bus's address"
        )
    return named


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """``-C CONFIG``: a server's YAML file (``dest`` ``config``)."""
    parser.add_argument(
        "-C", "--config", metavar="CONFIG.yaml", help="YAML config file (flags override it)"
    )


def add_metrics_argument(parser: argparse.ArgumentParser, *, watch: bool = False) -> None:
    """``--metrics HOST:PORT``: where a server serves /metrics, or with ``watch``
    (repeatable, a list) the metrics servers of the buses to watch."""
    if watch:
        parser.add_argument(
            "--metrics",
            action="append",
            default=[],
            metavar="HOST:PORT",
            help="watch the bus whose metrics server is here (repeatable)",
        )
        return
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics, /healthz and /clients here",
    )


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level``, ``--log-format``, ``--log-file`` (unset: None)."""
    parser.add_argument("--log-level", metavar="LEVEL", help="|".join(LOG_LEVELS))
    parser.add_argument("--log-format", metavar="FORMAT", help="|".join(LOG_FORMATS))
    parser.add_argument(
        "--log-file",
        metavar="FILE",
        help="log to FILE (appended), or 'syslog' (default stderr; a daemon: syslog)",
    )


def configure_logging(level: str, fmt: str = "auto", target: str | None = None) -> None:
    """Set up the log (``ops.logsetup``); a log file that cannot be opened is a
    ``ConfigError`` naming it, not a traceback."""
    from sbus_relay.ops import logsetup

    try:
        logsetup.configure(level, fmt, target=target)
    except OSError as exc:
        raise ConfigError(
            "config", "log_file", f"cannot open {target}: {exc.strerror or exc}"
        ) from None
