"""The recorder benchmark: ``sbus-relay record`` against a flood, and a ``kill -9``.

What it owns: the recorder benchmark: its flood, its kill -9 run and their
figures.  What it may touch: a bus and a recorder it starts, their files.

    python -m sbus_relay.bench.pipeline --recorder 1000000

A fresh bus (``sbusd``) on a private socket: one, then two publishers
(FLOOD_PUBLISHERS) send distinct keys with 64-byte payloads as fast as they
can; the rate the bus routed them at, what the recorder recorded and what it
reports lost are printed.  Then a steady stream (KILL_RATE msgs/s for
KILL_SECONDS) with a ``kill -9`` of the recorder at the end: how many messages
the recovered capture misses.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sbus_relay.ops import children

#: Concurrent flood publishers of the runs: one (the bus's 1-to-1 rate), then two
#: (more than one subscriber's share of the bus on two cores).
FLOOD_PUBLISHERS = (1, 2)
#: Payload size of the flood (bytes).
FLOOD_PAYLOAD = 64
#: Steady rate (msgs/s) and length (s) of the kill -9 run.
KILL_RATE = 4000
KILL_SECONDS = 15
#: Seconds the recorder (and the bus) get to stop after SIGTERM before they are killed.
RECORD_STOP_S = 60.0


def flood(address: str, count: int, tag: str) -> None:
    """Publish ``count`` messages with distinct keys, as fast as the socket takes them."""
    import socket

    from sbus_relay.protocol.codec import encode_msg
    from sbus_relay.protocol.control import WHOAMI_PACKET

    payload = b"p" * FLOOD_PAYLOAD
    packets = [
        encode_msg(b"flood/%s/%d/%d" % (tag.encode(), i % 100, i), payload) for i in range(count)
    ]
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(address)
        send = s.send
        for p in packets:
            send(p)
        s.send(WHOAMI_PACKET)  # answered once the bus has routed them all
        s.recv(4096)


def steady(address: str, rate: int, seconds: float) -> int:
    """Publish at ``rate`` msgs/s for ``seconds``; return how many were sent."""
    import socket

    from sbus_relay.protocol.codec import encode_msg

    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(address)
        t0 = time.monotonic()
        while (now := time.monotonic() - t0) < seconds:
            while sent < now * rate:
                s.send(encode_msg(b"steady/%d" % (sent % 10), b"%d" % sent))
                sent += 1
            time.sleep(0.005)
    return sent


def recorder_benchmark(messages: int) -> int:
    """Flood a fresh bus while ``record`` runs; then the kill -9 run.  Prints the figures."""
    from sbus_relay.pipeline.capture import capture_files, recover

    bin_dir = os.path.dirname(sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix="sbus-rec-", dir="/tmp"))
    address = str(tmp / "bus")
    bus = children.spawn([os.path.join(bin_dir, "sbusd"), "-f", "-a", address],
                         log=os.devnull)  # fmt: skip
    try:
        while not os.path.exists(address):
            time.sleep(0.05)
        time.sleep(0.3)
        record = [os.path.join(bin_dir, "sbus-relay"), "record", "-a", address, "-q"]
        for publishers in FLOOD_PUBLISHERS:
            rec_log = tmp / f"record{publishers}.log"
            rec = children.spawn([*record, "--out", str(tmp / f"flood{publishers}")], log=rec_log)
            time.sleep(3)  # subscribed
            each = messages // publishers
            t0 = time.monotonic()
            pubs = [
                children.spawn([sys.executable, "-P", "-m", "sbus_relay.bench.recording",
                                address, str(each), str(i)])
                for i in range(publishers)
            ]  # fmt: skip
            for p in pubs:
                p.wait()
            routed_s = time.monotonic() - t0
            time.sleep(1)
            children.stop(rec, RECORD_STOP_S)
            err = rec_log.read_text(errors="replace")
            summary = [x for x in err.splitlines() if x.startswith("recorded")]
            total = each * publishers
            print(f"flood: {total:,} messages from {publishers} publisher(s) routed in "
                  f"{routed_s:.1f} s ({total / routed_s:,.0f} msgs/s); record "
                  f"{children.how_it_ended(rec.returncode)}")  # fmt: skip
            print("  " + (summary[0] if summary else err.strip()))

        rec = children.spawn([*record, "--out", str(tmp / "killed")], log=os.devnull)
        time.sleep(3)
        sent = steady(address, KILL_RATE, KILL_SECONDS)
        rec.kill()
        rec.wait()
        found = recover([tmp / "killed"])
        import pyarrow.parquet as pq

        rows = sum(pq.read_metadata(f).num_rows for f in capture_files([str(tmp / "killed")]))
        missing = sent - rows
        print(f"kill -9: {sent:,} messages at {KILL_RATE:,} msgs/s over {KILL_SECONDS} s, "
              f"then kill -9 of the recorder: {rows:,} recovered ({found.line()}), "
              f"{missing:,} missing = {missing / KILL_RATE:.2f} s of traffic")  # fmt: skip
    finally:
        children.stop(bus, RECORD_STOP_S)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":  # one flood publisher: ADDRESS COUNT TAG
    flood(sys.argv[1], int(sys.argv[2]), sys.argv[3])
