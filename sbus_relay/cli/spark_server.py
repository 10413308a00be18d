"""``sbus-relay spark-server``: a long-lived Spark Connect server for ``analyze --remote``.

What it owns: the spark-server command.  What it may touch: pipeline.connect
and the process it starts.

Runs in the foreground (under systemd, compose, or a terminal) until SIGINT or
SIGTERM, which stop the server; prints the URL to give to ``analyze --remote``
(or ``$SPARK_REMOTE``) once it accepts connections.  Spark's own log (warnings
and errors) goes to stderr.  See ``sbus_relay.pipeline.connect`` for what it
starts and with which settings.
"""

from __future__ import annotations

import argparse
import signal
import sys
import types
from pathlib import Path

from sbus_relay.pipeline import defaults as D

from .options import add_spark_arguments, port_number, spark_settings

#: Exit status when the server cannot start or dies by itself.
EXIT_FAILED = 1
#: Exit status for a missing extra or bad options.
EXIT_USAGE = 2
PROG = "sbus-relay spark-server"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's options (the CLI owns parsing)."""
    parser.add_argument(
        "--host",
        default=D.CONNECT_HOST,
        help="address to listen on (default %(default)s; the server has no authentication "
        "unless $SPARK_CONNECT_AUTHENTICATE_TOKEN is set)",
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=D.CONNECT_PORT,
        help="port to listen on (default %(default)s)",
    )
    add_spark_arguments(
        parser, remote=False, memory_default=D.CONNECT_MEMORY, master_default="local[*]"
    )


def run(args: argparse.Namespace) -> int:
    """Start the server, say where it listens, wait until told to stop."""
    missing = D.missing_extra(("pyarrow", "pyspark"))
    if missing:
        print(f"{PROG}: {missing}", file=sys.stderr)
        return EXIT_USAGE
    from sbus_relay.pipeline import scratch

    with scratch.directory() as tmp:  # the server's temporary files, removed after it
        return _serve(args, tmp)


def _serve(args: argparse.Namespace, tmp: Path) -> int:
    from sbus_relay.ops import children
    from sbus_relay.pipeline import connect
    from sbus_relay.pipeline.inputs import InputError
    from sbus_relay.pipeline.session import SparkFailed

    try:
        opts = connect.ServerOptions(args.host, args.port, spark_settings(args))
        proc = connect.start(opts, tmp=tmp)
    except InputError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SparkFailed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    stopping: list[int] = []

    def on_signal(signum: int, frame: types.FrameType | None) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        connect.wait_ready(proc, opts, "its log is above")
        print(
            f"Spark Connect server ready: {opts.url} (sbus-relay analyze --remote {opts.url}, "
            f"or export SPARK_REMOTE={opts.url})",
            flush=True,
        )
        status = proc.wait()
    except KeyboardInterrupt:
        connect.stop(proc)
        print(f"{PROG}: stopped", file=sys.stderr)
        return 0
    except SparkFailed as exc:
        connect.stop(proc)
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
    print(f"{PROG}: the server {children.how_it_ended(status)}", file=sys.stderr)
    return EXIT_FAILED
