"""``python -m tests.hardening.harness.host --stats FILE [serve flags]``: a bus that reports.

The same ``Server`` the CLI runs, in the foreground, with one addition: on
SIGUSR1 (and at exit) it writes its ``Stats`` counters and ``Gauges`` as JSON to
``FILE``.  The hardening runs use it where they must compare what clients saw
with what the server counted (drops, reconnects) without opening a TCP port for
/metrics: everything stays on Unix sockets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from dataclasses import fields
from typing import Any


def _dump(server: Any, path: str) -> None:
    data = {
        "stats": dataclasses.asdict(server.stats),
        "gauges": dataclasses.asdict(server.gauges()),
        "pid": os.getpid(),
    }
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        json.dump(data, out)
    os.replace(tmp, path)  # readers never see half a file


def main(argv: list[str] | None = None) -> int:
    """Parse serve's flags plus ``--stats``; serve until SIGINT/SIGTERM/SIGHUP."""
    from sbus_relay.cli import serve
    from sbus_relay.ops import logsetup
    from sbus_relay.ops.config import ServerConfig, load_config

    parser = argparse.ArgumentParser(prog="sbus-harden-host")
    parser.add_argument("--stats", required=True, help="write counters here on SIGUSR1")
    serve.add_arguments(parser)
    args = parser.parse_args(argv)
    config = load_config(args.config) if args.config else ServerConfig()
    overrides = {f.name: getattr(args, f.name, None) for f in fields(ServerConfig)}
    config = config.merged(**overrides)
    logsetup.configure(config.log_level, config.log_format)
    import gevent
    import structlog

    from sbus_relay.bus.server import Server

    log = structlog.get_logger("sbus_relay").bind(instance=config.instance)
    sock, printable, socket_file = serve._listener(config)
    server = Server(config, sock, log=log)
    for signum in serve.STOP_SIGNALS:
        gevent.signal_handler(signum, server.stop)
    gevent.signal_handler(signal.SIGUSR1, _dump, server, args.stats)
    server.start()
    log.info("listening", address=printable, pid=os.getpid(), relay=bool(config.upstream))
    try:
        server.serve_forever()
    finally:
        _dump(server, args.stats)
        if socket_file is not None and os.path.exists(socket_file):
            os.unlink(socket_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
