"""Can a bus learn what native NATS clients subscribe to from NATS itself?
What the servers' subscription listing (the monitoring port's ``/subsz``)
says, what it costs and how soon (docs/decisions.md, "Many hosts over NATS").

    PYTHONPATH=. .venv/bin/python docs/experiments/nats_native_interest.py

A 3-node cluster on free loopback ports.  Native nats-py clients on member 0
hold N subscriptions under ``sbus.k.``; member 1's ``/subsz?subs=1`` is asked
(what a bus joined to member 1 would ask): whether the clients of member 0
appear there, how long one listing takes and how big it is, and how long a
new subscription on member 0 takes to appear on member 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory

from tests.nats.cluster import Cluster


def subsz(port: int, query: str = "subs=1&limit=1000000") -> tuple[dict, float, int]:
    t = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/subsz?{query}", timeout=30) as r:
        body = r.read()
    return json.loads(body), time.perf_counter() - t, len(body)


async def main() -> None:
    import nats

    with TemporaryDirectory(prefix="sbus-native-") as tmp:
        cluster = Cluster(Path(tmp))
        try:
            m0, m1 = cluster.servers[0], cluster.servers[1]
            print(f"load {os.getloadavg()[0]:.1f}")
            for n in (10, 1000, 10000):
                nc = await nats.connect(m0.url)
                for i in range(n):
                    await nc.subscribe(f"sbus.k.native.{i}.>")
                await nc.flush()
                await asyncio.sleep(0.5)
                here, _, _ = subsz(m0.monitor)
                there, _, size = subsz(m1.monitor)
                times = [subsz(m1.monitor)[1] for _ in range(5)]
                listed = [s["subject"] for s in there.get("subscriptions_list") or []]
                print(
                    f"{n:6d} subscriptions on member 0: member 0 lists "
                    f"{len(here.get('subscriptions_list') or [])}, member 1 lists "
                    f"{len([s for s in listed if s.startswith('sbus.k.native.')])} of them "
                    f"(num_subscriptions {there['num_subscriptions']}); one listing of "
                    f"member 1: {statistics.median(times) * 1000:.1f} ms, {size:,} bytes"
                )
                await nc.close()
            # how soon a new subscription on member 0 shows on member 1
            nc = await nats.connect(m0.url)
            delays = []
            for i in range(20):
                t = time.perf_counter()
                await nc.subscribe(f"sbus.k.fresh.{i}")
                await nc.flush()
                while True:
                    doc, _, _ = subsz(m1.monitor, "subs=1&test=sbus.k.fresh.%d" % i)
                    if doc.get("num_matches") or doc.get("subscriptions_list"):
                        break
                    if time.perf_counter() - t > 5:
                        break
                delays.append(time.perf_counter() - t)
            await nc.close()
            print(
                "a new subscription on member 0 listed on member 1 after "
                f"{statistics.median(delays) * 1000:.1f} ms (median of 20, "
                f"max {max(delays) * 1000:.1f} ms)"
            )
        finally:
            cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
