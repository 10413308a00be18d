"""The Spark options, one definition for every command that runs Spark.

``analyze`` (and ``submit.py`` under spark-submit) and ``spark-server`` take
the same ``--master``, ``--memory`` and ``--conf``; ``analyze`` also takes
``--remote`` (a Spark Connect server).  ``spark_settings`` turns them into the
pipeline's ``SparkSettings``.
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sbus_relay.pipeline.session import SparkSettings

#: A JVM memory size as Spark takes it: a number and a unit (512m, 4g).
MEMORY = re.compile(r"^[1-9][0-9]*[kmgt]$")


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
