"""How long a host's NATS link takes to notice and get over each fault, and
what crosses meanwhile (the figures of docs/nats.md, "Failures").

    PYTHONPATH=. .venv/bin/python docs/experiments/nats_faults.py

A 3-node cluster on free loopback ports; host A (master and relay) joined to
one member with the others listed, host B to another.  A publisher on A's
relay sends 1,000 msg/s to a subscriber on B throughout; each fault is made
and undone, and the subscriber's gap and count are reported, with what A's
link counted as handed to a server that never confirmed it (``unconfirmed``).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

from sbus_relay.client import Client
from tests.nats.cluster import Cluster, Host, wait_until

RATE = 1000


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sbus-natsfaults-"))
    cluster = Cluster(tmp)
    a = Host(tmp, "hosta", cluster.urls(0, 1, 2))
    b = Host(tmp, "hostb", cluster.urls(1, 2, 0))
    stop = threading.Event()
    sent = [0]
    got: list[tuple[float, int]] = []
    try:
        wait_until(lambda: a.link()["settled"] and b.link()["settled"], 30, "settled")
        sub = Client(b.master.address, timeout=30)
        sub.subscribe(b"f/")
        wait_until(lambda: a.link()["remote_patterns"] >= 1, 20, "interest")

        def publish() -> None:
            with Client(a.relay.address, timeout=30) as pub:
                start = time.perf_counter()
                while not stop.is_set():
                    pub.publish(b"f/x", b"%d" % sent[0])
                    sent[0] += 1
                    ahead = start + sent[0] / RATE - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)

        def receive() -> None:
            while not stop.is_set():
                try:
                    m = sub.receive(timeout=0.5)
                except TimeoutError:
                    continue
                got.append((time.monotonic(), int(bytes(m.payload))))

        threads = [threading.Thread(target=publish), threading.Thread(target=receive)]
        for t in threads:
            t.start()
        time.sleep(2)

        def episode(name: str, make: object, undo: object, hold: float) -> None:
            before_sent, before_got = sent[0], len(got)
            before_unconfirmed = a.link()["unconfirmed_total"]
            reconnects = a.link()["reconnects"]
            t0 = time.monotonic()
            make()  # type: ignore[operator]
            wait_until(
                lambda: not a.link()["connected"] or a.link()["reconnects"] > reconnects,
                20,
                f"{name}: noticed",
            )
            noticed = time.monotonic() - t0
            wait_until(lambda: a.link()["reconnects"] > reconnects, 30, f"{name}: elsewhere")
            back = time.monotonic() - t0
            time.sleep(hold)
            undo()  # type: ignore[operator]
            time.sleep(5)
            window = got[before_got:]
            end_sent = sent[0]
            n_sent = end_sent - before_sent
            # of those sent meanwhile, how many arrived (whenever), how many were counted
            arrived = len({s for _, s in got if before_sent <= s < end_sent})
            unconfirmed = a.link()["unconfirmed_total"] - before_unconfirmed
            seqs = [s for _, s in window]
            gaps = [y - x for (x, _), (y, _) in zip(window, window[1:], strict=False)]
            late = sum(1 for x, y in zip(seqs, seqs[1:], strict=False) if y < x)
            print(
                f"{name}: noticed after {noticed:.2f} s, connected again after {back:.2f} s;"
                f" {late} arrived out of order;"
                f" sent {n_sent}, received {len(window)} ({len(set(seqs))} distinct),"
                f" longest gap {max(gaps, default=0):.2f} s;"
                f" of the {n_sent} sent, {arrived} arrived and {unconfirmed} were counted"
                f" unconfirmed (arrived + counted >= sent: {arrived + unconfirmed >= n_sent});"
                f" drops {a.link()['drops']}"
            )

        member = next(
            s for s in cluster.servers if a.link()["server"].endswith(":%d" % s.port)
        )
        episode("member killed (A moves on)", member.stop, lambda: None, 0)
        member.start()
        time.sleep(2)
        member = next(
            s for s in cluster.servers if a.link()["server"].endswith(":%d" % s.port)
        )
        episode("member paused 5 s (SIGSTOP)", member.pause, member.resume, 5)
    finally:
        stop.set()
        a.stop()
        b.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
