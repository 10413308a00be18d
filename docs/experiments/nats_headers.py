"""What NATS headers cost: nats-py publishing and receiving 100-byte messages
with no header, with one (``Sbus: <host> <incarnation> <seq>``) and with two
(``Sbus-Origin: <host> <incarnation>``, ``Sbus-Seq: <seq>``), and what HPUB
costs the nats-server, in CPU time per message (the figures of
docs/decisions.md, "Many hosts over NATS").

    PYTHONPATH=. .venv/bin/python docs/experiments/nats_headers.py [messages] [rounds]

One nats-server on a free loopback port; per variant a subscriber process and
a publisher process (each reports its own CPU time for its loop), the
server's CPU time read from /proc around the run.  The variants alternate,
round after round; the medians are printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from sbus_relay.bench.procs import cpu_seconds

VARIANTS = ("none", "one", "two", "fast")
SUBJECT = "sbus.k.bench.headers"
PAYLOAD = b"x" * 100


def headers_for(variant: str, seq: int) -> dict[str, str] | None:
    if variant == "one":
        return {"Sbus": "hosta 1714000000000000000 %d" % seq}
    if variant == "fast":
        return {"Sbus-Origin": "hosta 1714000000000000000 %d" % seq}
    if variant == "two":
        return {"Sbus-Origin": "hosta 1714000000000000000", "Sbus-Seq": "%d" % seq}
    return None


async def connect(url: str, variant: str) -> Any:
    """nats-py's client, or (``fast``) one that writes its one header whole
    (``natsenvelope.hpub``) and reads a section that holds only it at once
    (``natsenvelope.from_block``), anything else as nats-py does."""
    import nats

    if variant != "fast":
        return await nats.connect(url)
    from nats.aio.client import Client

    from sbus_relay.protocol import natsenvelope

    class Fast(Client):  # type: ignore[misc]
        async def publish_enveloped(self, subject: bytes, payload: bytes, value: str) -> None:
            self.stats["out_msgs"] += 1
            await self._send_command(natsenvelope.hpub(subject, value, payload))
            if self._flush_queue is not None and self._flush_queue.empty():
                await self._flush_pending()

        async def _process_headers(self, headers: Any) -> Any:
            value = natsenvelope.from_block(headers) if headers else None
            if value is not None:
                return {natsenvelope.HEADER: value}
            return await super()._process_headers(headers)

    nc = Fast()
    await nc.connect(url)
    return nc


async def publisher(url: str, variant: str, n: int) -> None:
    nc = await connect(url, variant)
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = time.process_time()
    if variant == "fast":
        subject = SUBJECT.encode()
        for i in range(n):
            await nc.publish_enveloped(subject, PAYLOAD, "hosta 1714000000000000000 %d" % (i + 1))
    else:
        for i in range(n):
            await nc.publish(SUBJECT, PAYLOAD, headers=headers_for(variant, i + 1))
    await nc.flush()
    print(json.dumps({"cpu": time.process_time() - cpu}), flush=True)
    await nc.close()


async def subscriber(url: str, variant: str, n: int) -> None:
    nc = await connect(url, variant)
    done = asyncio.Event()
    got = 0
    seqs = 0
    cpu = [0.0]

    async def cb(msg: object) -> None:
        nonlocal got, seqs
        if got == 0:
            cpu[0] = time.process_time()
        got += 1
        h = msg.headers  # type: ignore[attr-defined]
        if variant == "one":
            seqs += int(h["Sbus"].rpartition(" ")[2])
        elif variant == "fast":
            seqs += int(h["Sbus-Origin"].rpartition(" ")[2])
        elif variant == "two":
            h["Sbus-Origin"]
            seqs += int(h["Sbus-Seq"])
        if got == n:
            done.set()

    await nc.subscribe(SUBJECT, cb=cb, pending_msgs_limit=-1, pending_bytes_limit=-1)
    await nc.flush()
    print("ready", flush=True)
    try:
        await asyncio.wait_for(done.wait(), 120)
    except asyncio.TimeoutError:
        pass
    print(json.dumps({"cpu": time.process_time() - cpu[0], "got": got}), flush=True)
    await nc.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(role: str, url: str, variant: str, n: int) -> subprocess.Popen[str]:
    code = (
        "import asyncio, sys; sys.path.insert(0, %r); "
        "from docs.experiments import nats_headers as m; "
        "asyncio.run(m.%s(%r, %r, %d))" % (os.getcwd(), role, url, variant, n)
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    return p


def one_run(url: str, server_pid: int, variant: str, n: int) -> dict[str, float]:
    sub = worker("subscriber", url, variant, n)
    pub = worker("publisher", url, variant, n)
    server0 = cpu_seconds(server_pid)
    assert pub.stdin is not None and pub.stdout is not None and sub.stdout is not None
    pub.stdin.write("go\n")
    pub.stdin.flush()
    pub_fig = json.loads(pub.stdout.readline())
    sub_fig = json.loads(sub.stdout.readline())
    server1 = cpu_seconds(server_pid)
    for p in (pub, sub):
        p.wait(30)
    assert sub_fig["got"] == n, (variant, sub_fig)
    return {
        "pub_us": pub_fig["cpu"] * 1e6 / n,
        "sub_us": sub_fig["cpu"] * 1e6 / n,
        "server_us": (server1 - server0) * 1e6 / n,
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    binary = os.path.join(os.path.dirname(sys.executable), "nats-server")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sbus-hdr-") as tmp:
        log = open(os.path.join(tmp, "nats.log"), "wb")
        server = subprocess.Popen(
            [binary, "-a", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
        try:
            url = f"nats://127.0.0.1:{port}"
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            figures: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
            load0 = os.getloadavg()[0]
            for _ in range(rounds):
                for v in VARIANTS:
                    figures[v].append(one_run(url, server.pid, v, n))
            load1 = os.getloadavg()[0]
        finally:
            server.terminate()
            server.wait(10)
            log.close()
    print(f"{n} messages of {len(PAYLOAD)} bytes, {rounds} rounds, load {load0:.1f} -> {load1:.1f}")
    print("CPU per message, medians (us):  publisher  subscriber  nats-server")
    for v in VARIANTS:
        med = {k: statistics.median(f[k] for f in figures[v]) for k in figures[v][0]}
        print(f"  {v:5s} {med['pub_us']:10.2f} {med['sub_us']:11.2f} {med['server_us']:12.2f}")


if __name__ == "__main__":
    main()
