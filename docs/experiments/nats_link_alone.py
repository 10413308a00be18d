"""What the NATS link process costs per message, each way, with nothing else
of the project running: two link processes driven straight through their
socket pairs (docs/nats.md, "Measured side by side": each side apart).

    PYTHONPATH=. .venv/bin/python docs/experiments/nats_link_alone.py \
        [--messages N] [--rate R] [--batch B] [--engine nats.c|nats-py] \
        [--callgrind] [--profile]

One nats-server on free loopback ports, and two link processes
(``python -m sbus_relay.cli.link``), host ``a`` and host ``b``, each on a
socket pair whose other end this script holds, acting as their buses: it
sends each its ``link/hello``, host ``b`` one pattern (``cost/``) and both
``interest/ready``, then waits until ``a`` has heard ``b``'s interest (the
``SUB`` it passes on) and ``b`` is subscribed on NATS.  Then it writes N
messages of 100 bytes on 1,000 keys to ``a`` as a bus would (packed batches of
B messages, paced to R a second) and reads them back from ``b``'s end.  So the
messages cross the sending link (envelope, ledger, publish), nats-server and
the receiving link (envelope, origins, packed batches to its bus), and every
figure printed is the two links' own:

* CPU time per message of each link process (every thread, from /proc), and
  its context switches per message (each a wake-up or a preemption);
* with ``--callgrind``: both processes run under ``valgrind --tool=callgrind``
  and the instructions each spent on the N messages are counted (the counters
  are dumped just before the first message and after the last has arrived, so
  start-up is not in them), divided by N: a figure that does not move with
  the machine's load.  The dumps stay in ``--keep DIR`` if given
  (``callgrind_annotate`` reads them);
* with ``--profile``: py-spy (``--native``) records both processes while the
  messages cross, into ``link-a.txt`` and ``link-b.txt`` (raw collapsed
  stacks) in the working directory.

The load average is printed beside every figure: above 1 they are indicative.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sbus_relay.bench.procs import cpu_seconds
from sbus_relay.protocol import codec, frames, linkwire
from sbus_relay.protocol.limits import MAX_PACKET, SEND_BUFFER
from tests.nats.cluster import NatsServer, free_port, nats_server_binary, wait_until

PAYLOAD = 100
KEYS = 1000
PATTERN = b"cost/"


def switches(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


class Link:
    """One link process and the bus's end of its socket pair (this script)."""

    def __init__(self, host: str, server: str, engine: str, wrap: list[str]) -> None:
        self.host = host
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (ours, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        hello = linkwire.Hello(host=host, servers=[server], engine=engine, log_level="warning")
        ours.sendall(linkwire.encode_hello(hello))
        argv = [*wrap, sys.executable, "-m", "sbus_relay.cli.link", "--fd", str(theirs.fileno())]
        self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.stats = linkwire.Stats()
        self.interest: set[bytes] = set()
        self.synced = False
        self.received = 0
        self.logs: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                packet = self.sock.recv(MAX_PACKET)
            except OSError:
                return
            if not packet:
                return
            if frames.is_batch(packet):
                self.received += len(frames.unpack(packet)[0])
                continue
            if frames.is_msg(packet):
                self.received += 1
                continue
            event = codec.decode(packet)
            if isinstance(event, codec.Subscribe):
                self.interest.add(event.pattern)
            elif isinstance(event, codec.Unsubscribe):
                self.interest.discard(event.pattern)
            elif isinstance(event, codec.Control):
                payload = event.payload or b""
                if event.key == linkwire.STATS:
                    self.stats = linkwire.decode_stats(payload)
                elif event.key == linkwire.SYNCED:
                    self.synced = True
                elif event.key == linkwire.LOG:
                    self.logs.append(payload.decode("utf-8", "replace"))

    def send(self, packet: bytes) -> None:
        self.sock.sendall(packet)

    def measure(self) -> tuple[float, int]:
        return cpu_seconds(self.proc.pid), switches(self.proc.pid)

    def stop(self) -> None:
        self.sock.close()  # the link's EOF: it says goodbye and ends
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def callgrind_dump(pid: int) -> None:
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)


def instructions(out: Path, pid: int, part: int) -> int:
    """The instructions counted in dump ``part`` of ``pid`` (its ``totals:`` line)."""
    for line in (out / f"callgrind.out.{pid}.{part}").read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in callgrind.out.{pid}.{part}")


def frames_of(count: int, batch: int, start: int) -> list[bytes]:
    """Packed batches of ``batch`` messages (the last one shorter), keys ``cost/<i>``."""
    payload = b"x" * PAYLOAD
    out = []
    for first in range(start, start + count, batch):
        frame = frames.BatchFrame(SEND_BUFFER // 2)
        for i in range(first, min(first + batch, start + count)):
            frame.add(codec.msg_head(PATTERN + b"%d" % (i % KEYS)), payload)
        out.append(frame.frame())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=64, help="messages per packed batch")
    parser.add_argument("--engine", default="nats.c", choices=("nats.c", "nats-py"))
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep the callgrind dumps here")
    args = parser.parse_args()
    nats_server_binary()
    tmp = Path(tempfile.mkdtemp(prefix="sbus-linkalone-"))
    out = args.keep or tmp
    out.mkdir(parents=True, exist_ok=True)
    wrap: list[str] = []
    if args.callgrind:
        wrap = ["valgrind", "--tool=callgrind", "--quiet", "--collect-atstart=yes",
                f"--callgrind-out-file={out}/callgrind.out.%p"]  # fmt: skip
    server = NatsServer(tmp, "n0", free_port(), free_port(), [])
    links: list[Link] = []
    spies: list[subprocess.Popen[bytes]] = []
    slow = 60 if args.callgrind else 20
    try:
        a = Link("a", server.url, args.engine, wrap)
        b = Link("b", server.url, args.engine, wrap)
        links += [a, b]
        b.send(codec.encode_sub(PATTERN))
        for link in links:
            link.send(codec.encode_cmsg(linkwire.READY, b""))
        wait_until(lambda: a.stats.settled and b.stats.settled, slow, "both links settled")
        wait_until(lambda: b.synced and PATTERN in a.interest, slow, "b's interest at a")
        # a first round, not measured: caches, the origin's first message
        for frame in frames_of(KEYS, args.batch, 0):
            a.send(frame)
        wait_until(lambda: b.received >= KEYS, slow, "the first round")
        base = b.received
        todo = frames_of(args.messages, args.batch, 0)
        if args.callgrind:
            for link in links:
                callgrind_dump(link.proc.pid)
        if args.profile:
            spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or "py-spy"
            seconds = str(int(args.messages / args.rate) + 2)
            for link in links:
                spies.append(subprocess.Popen(
                    [spy, "record", "--native", "-r", "250", "-d", seconds, "-p",
                     str(link.proc.pid), "-f", "raw", "-o", f"link-{link.host}.txt"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            time.sleep(1)
        before = [link.measure() for link in links]
        load = os.getloadavg()[0]
        start = time.perf_counter()
        sent = 0
        for frame in todo:
            ahead = start + sent / args.rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            a.send(frame)
            sent += args.batch
        deadline = time.monotonic() + (3600 if args.callgrind else 120)
        while b.received - base < args.messages and time.monotonic() < deadline:
            last = b.received
            time.sleep(2 if args.callgrind else 0.5)
            if b.received == last and b.received - base < args.messages:
                break  # nothing more comes: some were lost (said below)
        elapsed = time.perf_counter() - start
        after = [link.measure() for link in links]
        got = b.received - base
        if args.callgrind:
            for link in links:
                callgrind_dump(link.proc.pid)
            time.sleep(1)
        print(
            f"{args.messages:,} messages of {PAYLOAD} bytes, {KEYS:,} keys, batches of"
            f" {args.batch}, {args.rate:,}/s asked ({got / elapsed:,.0f}/s done), engine"
            f" {args.engine}: {got:,} arrived; load {load:.2f} -> {os.getloadavg()[0]:.2f}"
        )
        for link, (c0, s0), (c1, s1) in zip(links, before, after, strict=True):
            role = "sending  " if link is a else "receiving"
            line = (
                f"  {role} link: {(c1 - c0) * 1e6 / max(got, 1):.2f} us CPU per message,"
                f" {(s1 - s0) / max(got, 1):.3f} context switches per message"
            )
            if args.callgrind:
                ir = instructions(out, link.proc.pid, 2)
                line += f", {ir / max(got, 1):,.0f} instructions per message"
            print(line)
        for link in links:
            for record in link.logs:
                print(f"  link {link.host} said: {record}")
    finally:
        for spy_proc in spies:
            spy_proc.wait(60)
        for link in links:
            link.stop()
        server.stop(signal.SIGTERM)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
