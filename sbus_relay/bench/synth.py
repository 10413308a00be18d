"""Synthetic captures: realistic-looking traffic for benchmarks and demos.

What it owns: the synthetic traffic's laws and the capture files they are
written to.  What it may touch: the output directory.

    python -m sbus_relay.bench.synth --messages 10000000 --out /tmp/synth

Key families follow a Zipf-like popularity, payload sizes a log-normal law capped
at the sbus packet limit, and a few short bursts sit on top of a steady rate.
Files have the capture schema (``capture.CAPTURE_SCHEMA``) and are written in
chunks, so memory stays bounded whatever ``--messages`` is.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sbus_relay.pipeline.capture import CAPTURE_SCHEMA, COMPRESSION

#: Rows generated and written per file; bounds memory (about 100 MB per chunk).
CHUNK_ROWS = 1_000_000
#: Largest payload generated: the sbus packet limit (docs/protocol.md) minus a short key.
MAX_SIZE = 409_000
#: Share of messages that fall into bursts.
BURST_SHARE = 0.05
#: Number of burst windows in a capture.
BURSTS = 5
#: Length of one burst, seconds.
BURST_SECONDS = 30

FAMILIES = (
    "sensors/temperature", "sensors/humidity", "app/orders", "app/payments", "app/sessions",
    "logs/kernel", "logs/auth", "metrics/cpu", "metrics/memory", "media/frames",
    "chat/rooms", "jobs/queue",
)  # fmt: skip


def _keys(rng: np.random.Generator, per_family: int) -> list[str]:
    keys = []
    for fam in FAMILIES:
        keys += [f"{fam}/{i}" for i in range(per_family)]
    rng.shuffle(keys)
    return keys


def generate(
    out: Path,
    messages: int,
    *,
    seconds: float = 86_400.0,
    instances: int = 3,
    keys_per_family: int = 200,
    payload: bool = False,
    seed: int = 1,
    start_ns: int = 1_700_000_000 * 10**9,
    instance_names: Sequence[str] | None = None,
) -> list[Path]:
    """Write ``messages`` synthetic rows under ``out``; return the files written.
    Their instances are ``host0``... (``instances`` of them), or ``instance_names``."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    keys = np.array(_keys(rng, keys_per_family), dtype=object)
    # Zipf-like popularity: key i gets weight 1/(i+1).
    weights = 1.0 / np.arange(1, len(keys) + 1)
    weights /= weights.sum()
    # Media-like families carry big payloads; the rest small ones.
    big = np.array([k.startswith(("media/", "logs/")) for k in keys])
    if instance_names is None:
        instance_names = [f"host{i}" for i in range(instances)]
    instances = len(instance_names)
    names = np.array(list(instance_names), dtype=object)
    span_ns = int(seconds * 1e9)
    burst_starts = rng.integers(0, max(1, span_ns - BURST_SECONDS * 10**9), BURSTS)
    files = []
    done = 0
    part = 0
    while done < messages:
        n = min(CHUNK_ROWS, messages - done)
        t = rng.integers(0, span_ns, n)
        in_burst = rng.random(n) < BURST_SHARE
        nb = int(in_burst.sum())
        t[in_burst] = burst_starts[rng.integers(0, BURSTS, nb)] + rng.integers(
            0, BURST_SECONDS * 10**9, nb
        )
        t.sort()  # a recorder writes in receive order
        k = rng.choice(len(keys), n, p=weights)
        mean = np.where(big[k], 9.0, 5.0)  # e^9 ~ 8 KB, e^5 ~ 150 B
        sizes = np.minimum(rng.lognormal(mean, 1.0), MAX_SIZE).astype(np.int32)
        pay = (
            pa.array([rng.bytes(int(s)) for s in sizes], pa.binary())
            if payload
            else pa.nulls(n, pa.binary())
        )
        table = pa.Table.from_arrays(
            [
                pa.array(t + start_ns, pa.int64()),
                pa.array(keys[k], pa.string()),
                pa.array(sizes, pa.int32()),
                pay,
                pa.array(names[rng.integers(0, instances, n)], pa.string()),
            ],
            schema=CAPTURE_SCHEMA,
        )
        path = out / f"synth-{part:05d}.parquet"
        pq.write_table(table, path, compression=COMPRESSION, row_group_size=n // 4 + 1)
        files.append(path)
        done += n
        part += 1
    return files


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (``python -m sbus_relay.bench.synth``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=86_400.0, help="capture span (default a day)")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--payload", action="store_true", help="write random payload bytes too")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    t0 = time.monotonic()
    files = generate(
        Path(a.out), a.messages, seconds=a.seconds, instances=a.instances,
        payload=a.payload, seed=a.seed,
    )  # fmt: skip
    print(f"wrote {a.messages:,} messages in {len(files)} files in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
