"""Soak: steady traffic with a stalled subscriber, memory and fds sampled throughout.

A ``harness.host`` server runs with a small hard limit (``--hard-limit-bytes``,
``--hard-limit-messages``).  A stalled subscriber takes everything and never
reads (default modes: soft/queue, hard/discard), a reading subscriber must get
every message, publishers send at a steady rate, and short-lived clients come
and go.  The server's RSS (/proc/PID/statm) and fd count (/proc/PID/fd) are
sampled; RSS must stay under baseline + hard limit + ``OVERHEAD_KIB``, and fds
and (within ``RETURN_SLACK_KIB``) RSS must come back once the clients leave.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from typing import Any

from .common import Child, Closed, Conn, ServerProc, cleanup_dir, short_dir

#: Stated allowance over baseline + hard limit: per-message Python objects (a
#: bytes header and deque slot per queued packet), the 400 KiB receive buffer,
#: allocator fragmentation and gevent's per-client objects.
OVERHEAD_KIB = 8 * 1024
#: How much RSS may still grow after every client has left (none expected).
RETURN_SLACK_KIB = 1024
PAYLOAD = 1024


def _publish(address: str, duration: float, rate: float, tag: int) -> int:
    """Publish ``soak/<tag>/<seq>`` at ``rate`` per second; how many were sent."""
    sent = 0
    payload = b"p" * PAYLOAD
    with Conn(address, timeout=30.0) as conn:
        start = time.monotonic()
        while (now := time.monotonic()) - start < duration:
            due = int((now - start) * rate)
            while sent < due:
                conn.pub(b"soak/%d/%d" % (tag, sent), payload)
                sent += 1
            time.sleep(0.002)
    return sent


def _churn(address: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Short-lived clients: connect, subscribe, publish, sometimes vanish unread."""
    rng = random.Random(1)
    while not stop.is_set():
        try:
            with Conn(address, timeout=5.0) as conn:
                conn.sub(b"churn/%d" % rng.randrange(100))
                conn.sub(b"soak/" if rng.random() < 0.2 else b"churn/")
                conn.pub(b"churn/%d" % rng.randrange(100), b"c" * rng.randrange(2000))
                if rng.random() < 0.5:
                    conn.sync()
            counts["churned"] += 1
        except (OSError, Closed, TimeoutError):
            counts["churn_errors"] += 1
        time.sleep(0.01)


def run_soak(
    *,
    duration: float = 120.0,
    rate: float = 2000.0,
    publishers: int = 2,
    hard_limit_bytes: int = 4 * 1024 * 1024,
    hard_limit_messages: int = 4096,
    sample_every: float = 0.5,
) -> dict[str, Any]:
    """Soak for ``duration`` seconds; figures and ``failures``."""
    workdir = short_dir()
    server = ServerProc(
        os.path.join(workdir, "bus"),
        ["--hard-limit-bytes", str(hard_limit_bytes),
         "--hard-limit-messages", str(hard_limit_messages)],
        kind="host",
    )  # fmt: skip
    failures: list[str] = []
    samples: list[tuple[float, int, int]] = []
    counts = {"churned": 0, "churn_errors": 0}
    stop = threading.Event()
    try:
        base_fds = server.settled_fd_count()
        base_rss = server.rss_kib()
        stalled = Conn(server.address)
        stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        stalled.sub(b"soak/")
        stalled.sync()
        reader = Conn(server.address, timeout=30.0)
        reader.sub(b"soak/")
        reader.sync()
        got = {"n": 0, "bad": 0}
        last: dict[bytes, int] = {}

        def read() -> None:
            while not stop.is_set() or got["n"] < expected[0]:
                try:
                    packet = reader.recv(0.5)
                except TimeoutError:
                    if stop.is_set() and expected[0] >= 0:
                        return
                    continue
                tag, seq = packet[9 : packet.index(b"\0")].split(b"/")
                if last.get(tag, -1) + 1 != int(seq):
                    got["bad"] += 1
                last[tag] = int(seq)
                got["n"] += 1

        expected = [1 << 62]
        reading = threading.Thread(target=read, daemon=True)
        reading.start()
        churn = threading.Thread(target=_churn, args=(server.address, stop, counts), daemon=True)
        churn.start()
        pubs = [Child(_publish, server.address, duration, rate, t) for t in range(publishers)]
        start = time.monotonic()
        while time.monotonic() - start < duration:
            samples.append((time.monotonic() - start, server.rss_kib(), server.fd_count()))
            time.sleep(sample_every)
        sent = sum(p.result(duration + 60) for p in pubs)
        expected[0] = sent
        stop.set()
        churn.join(10)
        reading.join(30)
        stats = server.stats()
        drops = stats["stats"]["drops"]
        queued_stalled = stats["gauges"]["largest_queue_bytes"]
        stalled.close()
        reader.close()
        deadline = time.monotonic() + 10
        while server.fd_count() != base_fds and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        end_fds = server.fd_count()
        end_rss = server.rss_kib()
        alive = server.alive()
        tracebacks = "Traceback" in server.log_text()
    finally:
        stop.set()
        server.kill()
    peak_rss = max(s[1] for s in samples)
    peak_fds = max(s[2] for s in samples)
    limit_kib = base_rss + hard_limit_bytes // 1024 + OVERHEAD_KIB
    if got["n"] != sent or got["bad"]:
        failures.append(f"reader got {got['n']} of {sent} ({got['bad']} out of order or missing)")
    if peak_rss > limit_kib:
        failures.append(f"RSS peaked at {peak_rss} KiB, over {limit_kib} KiB")
    if end_fds != base_fds:
        failures.append(f"fds {base_fds} at start, {end_fds} after the clients left")
    # glibc keeps freed heap for reuse, so RSS need not fall back to the baseline; it
    # must not grow once the clients have left, and must stay within the bound
    if end_rss > min(peak_rss + RETURN_SLACK_KIB, limit_kib):
        failures.append(f"RSS {end_rss} KiB after the clients left (peak {peak_rss} KiB)")
    half = [s[1] for s in samples if s[0] >= duration / 2]
    first = [s[1] for s in samples if s[0] < duration / 2]
    growth = max(half, default=0) - max(first, default=0)
    if drops["hard_discard"] == 0:
        failures.append("the stalled subscriber never reached its hard limit (no drops)")
    if not alive:
        failures.append("the server died")
    if tracebacks:
        failures.append("traceback in the server log")
    if not failures:
        cleanup_dir(workdir)
    return {
        "seconds": duration,
        "published": sent,
        "reader_received": got["n"],
        "stalled_dropped_hard_discard": drops["hard_discard"],
        "stalled_queue_bytes_at_end": queued_stalled,
        "clients_churned": counts["churned"],
        "hard_limit_kib": hard_limit_bytes // 1024,
        "overhead_allowed_kib": OVERHEAD_KIB,
        "rss_kib": {
            "baseline": base_rss,
            "peak": peak_rss,
            "limit": limit_kib,
            "end": end_rss,
            "growth_second_half": growth,
        },
        "fds": {"baseline": base_fds, "peak": peak_fds, "end": end_fds},
        "failures": failures,
    }
