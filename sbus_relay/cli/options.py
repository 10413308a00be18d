"""Options that several commands share, each defined once here.

What it owns: the options several commands share and the logging set up from
them.  What it may touch: argparse parsers, ops.logsetup.

* ``-a ADDRESS``: the bus a client command uses (``$SBUS_ADDRESS``, else the
  default), or where a server listens;
* ``-C CONFIG``: the server's YAML file;
* ``--metrics HOST:PORT``: where a server serves its metrics, or (repeatable)
  which buses ``top`` watches;
* ``--log-level``, ``--log-format``, ``--log-file``: a server's log; and
  ``configure_logging``, the one call through which a command sets it up;
* ``--master``/``--remote``, ``--memory``, ``--conf``: the Spark of ``analyze``
  (and ``submit.py`` under spark-submit) and ``spark-server``; ``spark_settings``
  turns them into the pipeline's ``SparkSettings``;
* ``positive_number``, ``count``, ``port_number``: argument types for seconds,
  counts and ports;
* ``CommandParser``: a command's own parser, which reports the arguments it
  does not know itself.

Each command module has ``add_arguments(parser)`` and ``run(args) -> int``
(registered in ``cli.COMMANDS``) and imports nothing heavy at module level,
so ``sbus-relay --help`` stays fast.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sbus_relay.ops.addresses import ADDRESS_ENV, DEFAULT_ADDRESS, named_address
from sbus_relay.ops.config import LOG_FORMATS, LOG_LEVELS
from sbus_relay.ops.suggest import nearest
from sbus_relay.protocol.errors import ConfigError

if TYPE_CHECKING:
    from sbus_relay.pipeline.session import SparkSettings

#: What the address is, in every help text that takes one.
ADDRESS_FORMS = "a socket path, /dev/unix/abstract[/HEX] or /dev/fd/N"
#: A JVM memory size as Spark takes it: a number and a unit (512m, 4g).
MEMORY = re.compile(r"^[1-9][0-9]*[kmgt]$")


class CommandParser(argparse.ArgumentParser):
    """A command's parser that refuses the arguments it does not know with its
    own usage, naming them, and the option nearest to a misspelled one.

    argparse leaves a subcommand's unknown arguments to the top-level parser,
    which then shows the top-level usage instead of the command's."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(self.unrecognized(extra))
        return parsed, extra

    def unrecognized(self, extra: Sequence[str]) -> str:
        """argparse's complaint about ``extra``, with the nearest known option."""
        message = f"unrecognized arguments: {' '.join(extra)}"
        flag = next((arg for arg in extra if arg.startswith("-") and arg != "-"), None)
        if flag is not None:
            # Alike without their dashes: every option shares those.
            known = {option.lstrip("-"): option for option in self._option_string_actions}
            hint = nearest(flag.partition("=")[0].lstrip("-"), known)
            if hint is not None:
                message += f" (did you mean {known[hint]}?)"
        return message


def positive_number(text: str) -> float:
    """Argument type: a number above zero (seconds, mostly)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def count(text: str) -> int:
    """Argument type: a whole number, at least 1 (messages, mostly)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port_number(text: str) -> int:
    """Argument type: a TCP port, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (1 to 65535)")
    return value


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
    """-a, else $SBUS_ADDRESS, else the default (``addresses.named_address``:
    set but empty is an error); read when run, not when parsed."""
    given = getattr(args, "address", None)
    return named_address(None if given is None else str(given))


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """``-C CONFIG``: a server's YAML file (``dest`` ``config``)."""
    parser.add_argument(
        "-C",
        "--config",
        metavar="CONFIG.yaml",
        help="YAML config file (flags override it); SIGHUP makes the bus read it again",
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


def configure_logging(
    level: str,
    fmt: str = "auto",
    target: str | None = None,
    *,
    fields: Mapping[str, Any] | None = None,
    source: str = "config",
) -> None:
    """Set up the log (``ops.logsetup``), ``fields`` on every line; a log file
    that cannot be opened is a ``ConfigError`` naming it (in ``source``), not a
    traceback, and the log stays as it was."""
    from sbus_relay.ops import logsetup

    try:
        logsetup.configure(level, fmt, target=target, fields=fields)
    except OSError as exc:
        raise ConfigError(
            source, "log_file", f"cannot open {target}: {exc.strerror or exc}"
        ) from None


def _memory(text: str) -> str:
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    if not MEMORY.match(value):
        raise argparse.ArgumentTypeError(f"not a memory size: {text!r} (e.g. 4g or 512m)")
    return value


def add_spark_arguments(
    parser: argparse.ArgumentParser,
    *,
    remote: bool = True,
    memory_default: str = "sized from the input",
    master_default: str = "local[*], or whatever spark-submit was given",
) -> None:
    """Declare --master (and --remote), --memory and --conf on ``parser``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        metavar="URL",
        help=f"Spark master URL, e.g. spark://host:7077 or local[4] (default: {master_default})",
    )
    if remote:
        where.add_argument(
            "--remote",
            metavar="sc://HOST:PORT",
            help="run on a Spark Connect server, e.g. one started by `sbus-relay spark-server` "
            "(default: $SPARK_REMOTE when set and --master is not given)",
        )
    parser.add_argument(
        "--memory",
        type=_memory,
        metavar="SIZE",
        help=f"heap of the Spark driver JVM that this command starts, e.g. 4g "
        f"(default: {memory_default})",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting (repeatable); wins over the command's own",
    )


def spark_settings(args: argparse.Namespace) -> SparkSettings:
    """The parsed options as ``SparkSettings`` (InputError for a bad --conf)."""
    from sbus_relay.pipeline.session import SparkSettings, parse_conf

    return SparkSettings(
        master=args.master,
        remote=getattr(args, "remote", None),
        memory=args.memory,
        conf=parse_conf(args.conf),
    )
