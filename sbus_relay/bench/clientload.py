"""The Python clients of ``bench --only client``, one role per process.

What it owns: one client role per process and the JSON line it prints.  What
it may touch: the client library, nats-py, its own stdin and stdout.

    python -m sbus_relay.bench.clientload sub    -a ADDRESS -n N [--kind client|async] [--batch]
    python -m sbus_relay.bench.clientload natssub --url URL -n N
    python -m sbus_relay.bench.clientload natspub --url URL -n N [-i ID]
    python -m sbus_relay.bench.clientload pub    -a ADDRESS -n N -r RATE [-i ID]

Each prints ``ready`` once it can take part, waits for ``go`` on stdin (the
publishers), and ends with one JSON line.  A subscriber counts what it gets
from its first message to its last (``first_ns``, ``last_ns``, monotonic) and
gives up after ``--idle`` seconds without one; a payload ``<id>:<seq>:...`` is
checked for order (``missing``, ``reordered``) and the longest silence between
two messages is ``max_gap_ms``.

``natspub`` writes the NATS protocol itself (``PUB subject size``, in large
writes, as a C publisher would), so that the publisher is never what limits a
NATS subscriber; ``sub`` is measured against the C load generator's publisher
for the same reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from typing import Any

#: Bytes of every payload, as in the rest of the benchmark.
PAYLOAD_BYTES = 64
#: NATS messages written per ``sendall``.
NATS_WRITE = 2048
#: Subjects and keys of the traffic.
NATS_SUBJECT = "bench"
SBUS_PATTERN = "bench/"


def _now() -> int:
    return time.monotonic_ns()


def _cpu_ns() -> int:
    return time.process_time_ns()


class Tally:
    """What a subscriber counts."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.first = 0
        self.last = 0
        self.max_gap = 0
        self.missing = 0
        self.reordered = 0
        self.next_seq: dict[bytes, int] = {}

    def add(self, payload: bytes, sequenced: bool) -> None:
        now = _now()
        if self.count == 0:
            self.first = now
        elif now - self.last > self.max_gap:
            self.max_gap = now - self.last
        self.last = now
        self.count += 1
        if sequenced:
            who, _, rest = payload.partition(b":")
            seq = int(rest.partition(b":")[0])
            want = self.next_seq.get(who, 0)
            if seq > want:
                self.missing += seq - want
            elif seq < want:
                self.reordered += 1
            self.next_seq[who] = max(want, seq + 1)

    def result(self, **extra: Any) -> dict[str, Any]:
        return {
            "count": self.count,
            "first_ns": self.first,
            "last_ns": self.last,
            "max_gap_ms": round(self.max_gap / 1e6, 1),
            "missing": self.missing,
            "reordered": self.reordered,
            "cpu_ns": _cpu_ns(),
            **extra,
        }


def _sub_blocking(args: argparse.Namespace) -> dict[str, Any]:
    from sbus_relay.client import Client

    tally = Tally(args.n)
    with Client(args.address, batch=args.batch) as client:
        client.flood("blocking/hard/block")  # lossless: the bus waits for us
        client.subscribe(SBUS_PATTERN)
        client.whoami()
        print("ready", flush=True)
        receive = client.receive
        add = tally.add
        sequenced = args.sequenced
        try:
            while tally.count < args.n:
                add(receive(args.idle).payload, sequenced)
        except TimeoutError:
            pass
        stats = client.stats
    outage_ms = [round(o.seconds * 1000, 1) for o in stats.outages]
    return tally.result(batched=stats.batched, outage_ms=outage_ms)


async def _sub_async(args: argparse.Namespace) -> dict[str, Any]:
    from sbus_relay.client import AsyncClient

    tally = Tally(args.n)
    async with AsyncClient(args.address, batch=args.batch) as client:
        await client.flood("blocking/hard/block")
        await client.subscribe(SBUS_PATTERN)
        await client.whoami()
        print("ready", flush=True)
        add = tally.add
        sequenced = args.sequenced
        try:
            while tally.count < args.n:
                add((await client.receive(args.idle)).payload, sequenced)
        except TimeoutError:
            pass
        stats = client.stats
    outage_ms = [round(o.seconds * 1000, 1) for o in stats.outages]
    return tally.result(batched=stats.batched, outage_ms=outage_ms)


async def _nats_sub(args: argparse.Namespace) -> dict[str, Any]:
    import nats

    tally = Tally(args.n)
    done = asyncio.Event()
    add = tally.add

    async def on_message(msg: Any) -> None:
        add(msg.data, False)
        if tally.count >= args.n:
            done.set()

    nc = await nats.connect(args.url, allow_reconnect=False)
    await nc.subscribe(
        NATS_SUBJECT + ".>",
        cb=on_message,
        pending_msgs_limit=args.n + 1,
        pending_bytes_limit=(args.n + 1) * 256,
    )
    await nc.flush()
    print("ready", flush=True)
    while not done.is_set():
        before = tally.count
        try:
            await asyncio.wait_for(done.wait(), args.idle)
        except TimeoutError:
            if tally.count == before:
                break
    await nc.close()
    return tally.result()


def _wait_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit("expected 'go' on stdin")


def _nats_pub(args: argparse.Namespace) -> dict[str, Any]:
    host, _, port = args.url.removeprefix("nats://").rpartition(":")
    sock = socket.create_connection((host, int(port)))
    reader = sock.makefile("rb")
    if not reader.readline().startswith(b"INFO "):
        raise SystemExit("no INFO from the NATS server")
    sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
    if reader.readline() != b"PONG\r\n":
        raise SystemExit("no PONG from the NATS server")
    print("ready", flush=True)
    _wait_go()
    start = _now()
    filler = b"x" * PAYLOAD_BYTES
    for chunk in range(0, args.n, NATS_WRITE):
        parts = []
        for seq in range(chunk, min(args.n, chunk + NATS_WRITE)):
            payload = (b"%d:%d:" % (args.id, seq) + filler)[:PAYLOAD_BYTES]
            subject = b"%s.%d.%d" % (NATS_SUBJECT.encode(), args.id, seq)
            parts.append(b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload))
        sock.sendall(b"".join(parts))
    sock.sendall(b"PING\r\n")
    while reader.readline() != b"PONG\r\n":
        pass
    end = _now()
    sock.close()
    return {"sent": args.n, "start_ns": start, "end_ns": end, "cpu_ns": _cpu_ns()}


def _sbus_pub(args: argparse.Namespace) -> dict[str, Any]:
    """A Python publisher at a fixed rate (the restart run): it keeps publishing
    while the bus is away; what it buffers goes out once it is back."""
    from sbus_relay.client import Client

    filler = b"x" * PAYLOAD_BYTES
    with Client(args.address, batch=True) as client:
        client.whoami()
        print("ready", flush=True)
        _wait_go()
        start = _now()
        interval = 1e9 / args.r
        for seq in range(args.n):
            due = start + seq * interval
            delay = (due - _now()) / 1e9
            if delay > 0:
                time.sleep(delay)
            payload = (b"%d:%d:" % (args.id, seq) + filler)[:PAYLOAD_BYTES]
            client.publish(b"bench/%d/%d" % (args.id, seq), payload)
        client.whoami(30.0)  # back, and everything buffered is in the bus
        stats = client.stats
    return {
        "sent": args.n,
        "start_ns": start,
        "end_ns": _now(),
        "buffered": stats.buffered_total,
        "unsent": stats.unsent,
        "outage_ms": [round(o.seconds * 1000, 1) for o in stats.outages],
        "cpu_ns": _cpu_ns(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clientload")
    parser.add_argument("role", choices=("sub", "natssub", "natspub", "pub"))
    parser.add_argument("-a", "--address")
    parser.add_argument("--url")
    parser.add_argument("-n", type=int, required=True)
    parser.add_argument("-r", type=float, default=0.0)
    parser.add_argument("-i", "--id", type=int, default=0)
    parser.add_argument("--kind", choices=("client", "async"), default="client")
    parser.add_argument("--batch", action="store_true")
    parser.add_argument("--sequenced", action="store_true")
    parser.add_argument("--idle", type=float, default=2.0)
    args = parser.parse_args(argv)
    result: dict[str, Any]
    if args.role == "sub":
        result = asyncio.run(_sub_async(args)) if args.kind == "async" else _sub_blocking(args)
    elif args.role == "natssub":
        result = asyncio.run(_nats_sub(args))
    elif args.role == "natspub":
        result = _nats_pub(args)
    else:
        result = _sbus_pub(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
