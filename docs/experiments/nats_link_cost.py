"""What one bus and its NATS link process cost per message, each way, apart
(the figures of docs/nats.md, "Measured side by side": where the time goes).

    PYTHONPATH=. .venv/bin/python docs/experiments/nats_link_cost.py [RATE] [MESSAGES]

One nats-server on a free loopback port, one master joined to it, and C NATS
clients on the other side (``bench/csrc/natsload.c``, built by the bench), so
that nothing but the bus and its link is Python:

* receiving: a C publisher sends MESSAGES at RATE a second to the bus's
  subjects, a batched sbus client reads them off the bus;
* sending: a batched sbus client publishes MESSAGES on the bus (paced to
  RATE in chunks), a C subscriber reads them off NATS (a second host, whose
  subscriber makes the first send them, reads them too; it is not measured).

Prints, per side, the bus's and the link process's CPU time per message
(from /proc, every thread), what arrived, and the load average.  With
``PROFILE=1`` in the environment, py-spy (``--native``) records the link
process during each side, into ``link-receiving.txt`` and ``link-sending.txt``
(collapsed stacks) in the working directory.  ``ENGINE=nats-py`` (or
``nats.c``) in the environment runs that engine (``nats.engine`` in a config
file the masters are given).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sbus_relay.bench.build import build_programs
from sbus_relay.bench.procs import cpu_seconds
from sbus_relay.client import Client
from tests.nats.cluster import Host, NatsServer, free_port, wait_until

RATE = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
MESSAGES = int(sys.argv[2]) if len(sys.argv) > 2 else 500_000
PAYLOAD = 100
CHUNK = 256


def profile(pid: int, name: str, seconds: float) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if not os.environ.get("PROFILE") or spy is None:
        return None
    argv = [spy, "record", "--native", "-r", "250", "-d", str(int(seconds) + 1), "-p", str(pid),
            "-f", "raw", "-o", f"link-{name}.txt"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def switches(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far (each a wake-up, or a preemption)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def cpu(host: Host) -> tuple[float, float, int]:
    link = host.link()["process"]["pid"]
    return cpu_seconds(host.master.proc.pid), cpu_seconds(link), switches(link)


def report(side: str, host: Host, before: tuple[float, float, int], got: int) -> None:
    after = cpu(host)
    per = 1e6 / max(got, 1)
    bus, link = (after[0] - before[0]) * per, (after[1] - before[1]) * per
    wakes = (after[2] - before[2]) / max(got, 1)
    print(
        f"{side}: {got:,} of {MESSAGES:,} arrived; CPU per message: bus {bus:.2f} us,"
        f" link {link:.2f} us (engine {host.link()['engine']}), link context switches per"
        f" message {wakes:.2f}; load {os.getloadavg()[0]:.2f}"
    )


def receiving(host: Host, server: NatsServer, natsload: Path) -> None:
    got = [0]
    with Client(host.master.address, timeout=30, batch=True) as sub:
        sub.subscribe(b"cost/")
        wait_until(lambda: host.link()["subscriptions"] >= 1, 20, "subscribed on NATS")
        time.sleep(1)

        def read() -> None:
            while True:
                try:
                    sub.receive(timeout=3)
                except TimeoutError:
                    return
                got[0] += 1

        reader = threading.Thread(target=read)
        reader.start()
        before = cpu(host)
        spy = profile(host.link()["process"]["pid"], "receiving", MESSAGES / RATE)
        pub = subprocess.Popen(
            [str(natsload), "pub", "-u", server.url, "-s", "sbus.k.cost.x", "-n", str(MESSAGES),
             "-z", str(PAYLOAD), "-r", str(RATE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert pub.stdout is not None and pub.stdin is not None
        pub.stdout.readline()  # ready
        pub.stdin.write("go\n")
        pub.stdin.flush()
        pub.wait(300)
        reader.join(300)
        report("receiving", host, before, got[0])
        if spy is not None:
            spy.wait(60)


def drain_in_background(address: str, pattern: bytes) -> threading.Event:
    """A batched subscriber on another host, reading until told to stop."""
    ready, stop = threading.Event(), threading.Event()

    def read() -> None:
        with Client(address, timeout=30, batch=True) as c:
            c.subscribe(pattern)
            c.whoami()
            ready.set()
            while not stop.is_set():
                try:
                    c.receive(timeout=0.5)
                except TimeoutError:
                    continue

    threading.Thread(target=read, daemon=True).start()
    ready.wait(30)
    return stop


def sending(host: Host, other: Host, server: NatsServer, natsload: Path) -> None:
    stop = drain_in_background(other.master.address, b"cost/")
    wait_until(lambda: host.link()["remote_patterns"] >= 1, 20, "the other host's interest")
    sub = subprocess.Popen(
        [str(natsload), "sub", "-u", server.url, "-s", "sbus.k.cost.y", "-n", str(MESSAGES)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert sub.stdout is not None
    sub.stdout.readline()  # ready
    with Client(host.master.address, timeout=30, batch=True) as pub:
        payload = b"x" * PAYLOAD
        before = cpu(host)
        spy = profile(host.link()["process"]["pid"], "sending", MESSAGES / RATE)
        start = time.perf_counter()
        for i in range(0, MESSAGES, CHUNK):
            ahead = start + i / RATE - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            pub.publish_many((b"cost/y", payload) for _ in range(min(CHUNK, MESSAGES - i)))
    result = json.loads(sub.stdout.readline())
    sub.wait(60)
    stop.set()
    report("sending", host, before, result["count"])
    if spy is not None:
        spy.wait(60)


def main() -> None:
    natsload = build_programs().get("natsload")
    if natsload is None:
        sys.exit("natsload was not built: install libnats-dev")
    tmp = Path(tempfile.mkdtemp(prefix="sbus-natscost-"))
    server = NatsServer(tmp, "n0", free_port(), free_port(), [])
    extra: list[str] = []
    if os.environ.get("ENGINE"):
        config = tmp / "engine.yaml"
        config.write_text(f"nats:\n  servers: [{server.url}]\n  engine: {os.environ['ENGINE']}\n")
        extra = ["-C", str(config)]
    host = Host(tmp, "hosta", server.url, *extra, relay=False)
    other = Host(tmp, "hostb", server.url, relay=False)
    try:
        wait_until(lambda: host.link()["settled"] and other.link()["settled"], 30, "joined")
        print(f"{MESSAGES:,} messages of {PAYLOAD} bytes at {RATE:,}/s each way")
        receiving(host, server, natsload)
        sending(host, other, server, natsload)
    finally:
        host.master.stop()
        other.master.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
