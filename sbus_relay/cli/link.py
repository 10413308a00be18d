"""``python -m sbus_relay.cli.link --fd N``: a bus's NATS link process (docs/nats.md).

Started by its bus (``bus/natslink.py``), never by a person: it reads its
settings from the socket pair's first packet (``link/hello``: secrets never
cross argv), sends its log records to the bus, which writes them where it
logs, runs the engine chosen (``link/engine.py``) and ends when the bus
closes its end, when SIGTERM comes, or when its parent dies (the bus set
``PR_SET_PDEATHSIG``).  Exit status 0 after a stop, 2 for a bad start.

What it owns: the process's argv, its log setup and its exit status.  What it
may touch: the socket it is given, and ``sbus_relay.link`` (which does the work).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import socket
import sys
from dataclasses import fields
from typing import Any

#: Seconds to wait for the bus's hello.
HELLO_TIMEOUT = 10.0
#: prctl(2): the name the process's main thread shows in ps and top.
_PR_SET_NAME = 15
PROCESS_NAME = b"sbus-nats-link"


def _name_process() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, PROCESS_NAME, 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sbus-relay-link", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the link's end of the socket pair")
    args = parser.parse_args(argv)
    from sbus_relay.ops import logsetup
    from sbus_relay.protocol import linkwire
    from sbus_relay.protocol.errors import PeerError
    from sbus_relay.protocol.limits import MAX_PACKET

    _name_process()
    sock = socket.socket(fileno=args.fd)
    sock.settimeout(HELLO_TIMEOUT)
    try:
        first = sock.recv(MAX_PACKET)
        got = linkwire.control(first)
        if got is None or got[0] != linkwire.HELLO:
            raise PeerError("protocol_error", "the first packet is not link/hello")
        hello = linkwire.decode_hello(got[1])
    except (OSError, PeerError) as e:
        print(f"sbus-relay link: no settings from the bus: {e}", file=sys.stderr)
        return 2
    sock.setblocking(False)
    dropped = [0]

    def send(level: str, event: str, fields: dict[str, Any]) -> None:
        # a log line never waits: a full socket drops it (counted in the next line)
        if dropped[0]:
            fields["lines_dropped_before"] = dropped[0]
        try:
            sock.send(linkwire.encode_log(level, event, fields))
            dropped[0] = 0
        except OSError:
            dropped[0] += 1

    logsetup.configure_relay(hello.log_level, send)
    import structlog

    log = structlog.get_logger("sbus_relay.link").bind(nats_host=hello.host)
    from sbus_relay.link import choice
    from sbus_relay.link import engine as engines
    from sbus_relay.link.bridge import serve

    name = choice.choose(hello.engine, lambda line: log.info("nats.engine", notice=line))
    settings = engines.EngineSettings(
        **{f.name: getattr(hello, f.name) for f in fields(engines.EngineSettings)
           if f.name not in ("servers", "name", "tls")},
        servers=tuple(hello.servers),
        name="sbus-relay " + hello.host,
        tls=hello.tls_ca is not None or any(s.startswith("tls://") for s in hello.servers),
    )  # fmt: skip
    if name == engines.NATS_C and hello.nkey is not None:
        log.info("nats.engine", notice="the NATS link runs nats-py: nats.c takes no nkey seed file")
        name = engines.NATS_PY
    engine = choice.make(name, settings)
    asyncio.run(serve(sock, hello, engine, log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
