"""The ``fleet`` scenario's publisher and subscriber processes (bench/fleet.py).

Each prints ``ready`` once it can take part, a publisher waits for ``go`` on
its stdin, and each prints one JSON line of figures at the end.  A payload's
first 8 bytes are its send time on CLOCK_MONOTONIC, one clock for every
process of the machine.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from typing import Any

from sbus_relay.client import Client

_STAMP = struct.Struct("!q")
#: Seconds a subscriber waits for the next message before it reports what it got.
QUIET = 3.0
#: Distinct keys (subjects) a publisher goes round: ``<key>/<i mod KEYS>``.
KEYS = 1000
#: Messages in one ``publish_many`` of the batched publisher.
CHUNK = 256


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _report(count: int, last_ns: int, latencies: list[int]) -> None:
    latencies.sort()

    def q(f: float) -> float:
        return round(latencies[min(int(f * len(latencies)), len(latencies) - 1)] / 1000, 1)

    figures: dict[str, Any] = {"count": count, "last_ns": last_ns}
    figures["p50_us"] = q(0.5) if latencies else None
    figures["p99_us"] = q(0.99) if latencies else None
    _say(json.dumps(figures))


def _payloads(n: int, size: int) -> bytes:
    return b"x" * (size - _STAMP.size)


def _pace(i: int, start: float, rate: int) -> None:
    if rate:
        ahead = start + i / rate - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)


def sbus_sub(address: str, key: str, n: int, batch: bool = False) -> None:
    latencies: list[int] = []
    last = 0
    with Client(address, timeout=30, batch=batch) as c:
        c.subscribe(key + "/")
        c.whoami()  # the SUB is in before we say ready
        _say("ready")
        while len(latencies) < n:
            try:
                m = c.receive(timeout=QUIET)
            except TimeoutError:
                break
            last = time.monotonic_ns()
            latencies.append(last - _STAMP.unpack_from(m.payload)[0])
    _report(len(latencies), last, latencies)


def sbus_pub(address: str, key: str, n: int, rate: int, size: int) -> None:
    pad = _payloads(n, size)
    with Client(address, timeout=30) as c:
        # the other host's interest has reached this one: a probe goes through
        _say("ready")
        sys.stdin.readline()
        first = time.monotonic_ns()
        start = time.perf_counter()
        keys = [b"%s/%d" % (key.encode(), j) for j in range(KEYS)]
        for i in range(n):
            _pace(i, start, rate)
            c.publish(keys[i % KEYS], _STAMP.pack(time.monotonic_ns()) + pad)
    _say(json.dumps({"first_ns": first}))


def sbus_pub_batched(address: str, key: str, n: int, size: int) -> None:
    """The client library's batched mode: ``publish_many`` of CHUNK messages."""
    pad = _payloads(n, size)
    with Client(address, timeout=30, batch=True) as c:
        _say("ready")
        sys.stdin.readline()
        first = time.monotonic_ns()
        keys = [b"%s/%d" % (key.encode(), j) for j in range(KEYS)]
        for i in range(0, n, CHUNK):
            now = _STAMP.pack(time.monotonic_ns())
            c.publish_many((keys[j % KEYS], now + pad) for j in range(i, min(i + CHUNK, n)))
    _say(json.dumps({"first_ns": first}))


def nats_sub(url: str, subject: str, n: int) -> None:
    asyncio.run(_nats_sub(url, subject, n))


async def _nats_sub(url: str, subject: str, n: int) -> None:
    import nats

    latencies: list[int] = []
    last = [0]
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        last[0] = time.monotonic_ns()
        latencies.append(last[0] - _STAMP.unpack_from(msg.data)[0])
        if len(latencies) >= n:
            done.set()

    nc = await nats.connect(url)
    await nc.subscribe(subject + ".>", cb=cb, pending_msgs_limit=-1, pending_bytes_limit=-1)
    await nc.flush()
    _say("ready")
    while not done.is_set():
        before = len(latencies)
        try:
            await asyncio.wait_for(done.wait(), QUIET)
        except TimeoutError:
            if len(latencies) == before:
                break
    await nc.close()
    _report(len(latencies), last[0], latencies)


def nats_pub(url: str, subject: str, n: int, rate: int, size: int) -> None:
    asyncio.run(_nats_pub(url, subject, n, rate, size))


async def _nats_pub(url: str, subject: str, n: int, rate: int, size: int) -> None:
    import nats

    pad = _payloads(n, size)
    nc = await nats.connect(url)
    _say("ready")
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    first = time.monotonic_ns()
    start = time.perf_counter()
    subjects = ["%s.%d" % (subject, j) for j in range(KEYS)]
    for i in range(n):
        if rate:
            ahead = start + i / rate - time.perf_counter()
            if ahead > 0:
                await nc.flush()
                await asyncio.sleep(ahead)
        await nc.publish(subjects[i % KEYS], _STAMP.pack(time.monotonic_ns()) + pad)
    await nc.flush()
    await nc.close()
    _say(json.dumps({"first_ns": first}))
