"""A subscriber that stops reading is named when its drops begin, not when they end.

Real processes: a bus, a publisher that never stops, and subscribers that never
read.  Each is named in the log within a second of its first dropped message
(who, which modes, which reason), again at a bounded rate while it keeps
dropping, and once more when the episode ends (it read, or it left); the gauge
``sbus_clients_dropping`` and ``/clients`` show it meanwhile
(docs/observability.md, "Slow consumers").
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sbus_relay.protocol.limits import EPISODE_REPORT_INTERVAL
from tests.relay.helpers import WAIT, Bus, Peer, wait_until
from tests.support import short_dir

pytestmark = pytest.mark.timeout(90)

#: Each stalled subscriber's queue bound: it drops soon.
HARD_LIMIT = 50
#: Seconds between publishes.
PAUSE = 0.002
DROPPING = "sbus_clients_dropping"
#: How soon a subscriber's first drop must be in the log.
NAMED_WITHIN = 1.0


class Publisher:
    """Publishes k/<n> until stopped, in a thread."""

    def __init__(self, address: str) -> None:
        self.peer = Peer(address)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self.peer.pub(b"k/%d" % n, b"x" * 64)
            n += 1
            time.sleep(PAUSE)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.peer.sync()  # everything it sent has been routed


def drops_of(bus: Bus, cid: int) -> list[dict[str, Any]]:
    """This client's drop-episode lines, in order."""
    lines = (json.loads(line) for line in bus.log().splitlines() if line.startswith("{"))
    return [e for e in lines if e.get("client") == cid and e["event"].startswith("flood.drop")]


def logged_at(line: dict[str, Any]) -> float:
    """When the bus wrote a log line (its ISO timestamp, UTC), as ``time.time()``."""
    return datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


def client_rows(bus: Bus) -> dict[int, dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{bus.port}/clients", timeout=5) as answer:
        return {c["cid"]: c for c in json.loads(answer.read())["clients"]}


def cid_of(bus: Bus, before: set[int]) -> int:
    (cid,) = set(client_rows(bus)) - before
    return cid


def total_drops(bus: Bus) -> float:
    return sum(v for k, v in bus.metrics().items() if k.startswith("sbus_messages_dropped_total"))


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[Bus]:
    directory = short_dir()
    running = Bus(
        tmp_path, os.path.join(directory, "bus"), "--hard-limit-messages", str(HARD_LIMIT)
    )
    yield running
    running.stop()
    os.rmdir(directory)


def test_a_subscriber_that_never_reads_is_named_when_it_starts_dropping(bus: Bus) -> None:
    queued = Peer(bus.address)  # default modes: queue, then discard over the limit
    queued.sub(b"k/")
    queued_cid = cid_of(bus, set())
    shedding = Peer(bus.address)  # drops whatever its socket cannot take
    shedding.send(b"CMSG blocking/soft/discard")
    shedding.sub(b"k/")
    shedding_cid = cid_of(bus, {queued_cid})
    assert bus.metric(DROPPING) == 0

    publisher = Publisher(bus.address)
    try:
        # Each is named within a second of its own first drop (``/clients`` counts
        # them): the line's own time against the first moment a drop was seen, on
        # the wall clock both share, so that how late this loop comes round on a
        # loaded machine is not counted against the bus.
        first: dict[int, float] = {}
        named: dict[int, float] = {}
        deadline = time.monotonic() + 30
        while len(named) < 2 and time.monotonic() < deadline:
            rows = client_rows(bus)
            seen = time.time()
            for cid in (queued_cid, shedding_cid):
                if rows[cid]["dropped"] and cid not in first:
                    first[cid] = seen
                lines = drops_of(bus, cid)
                if lines and cid not in named:
                    named[cid] = logged_at(lines[0])
            time.sleep(0.02)
        assert set(named) == {queued_cid, shedding_cid}, bus.log()[-2000:]
        for cid, at in named.items():
            assert at - first.get(cid, at) < NAMED_WITHIN, (cid, first, named)
        (began,) = drops_of(bus, queued_cid)
        assert began["event"] == "flood.drop" and began["level"] == "warning"
        assert (began["pid"], began["uid"], began["gid"]) == (os.getpid(), os.getuid(), os.getgid())
        assert (began["reason"], began["soft"], began["hard"]) == (
            "hard_discard",
            "queue",
            "discard",
        )
        assert began["queued_messages"] == HARD_LIMIT
        (began,) = drops_of(bus, shedding_cid)
        assert (began["reason"], began["soft"]) == ("soft_discard", "discard")

        # While they keep dropping: no end line, the gauge and /clients show them.
        bus.wait_metric(DROPPING, 2)
        rows = client_rows(bus)
        assert rows[queued_cid]["dropping"] and rows[shedding_cid]["dropping"]
        publisher_cid = max(rows)
        assert not rows[publisher_cid]["dropping"]
        # ... and again, with the running count, once per interval: never per message
        wait_until(
            lambda: len(drops_of(bus, queued_cid)) > 1,
            "the running count",
            EPISODE_REPORT_INTERVAL + WAIT,
        )
        lines = drops_of(bus, queued_cid)
        assert [e["event"] for e in lines] == ["flood.drop", "flood.drop.ongoing"], lines
        assert lines[1]["count"] > 100 and lines[1]["seconds"] >= EPISODE_REPORT_INTERVAL
        assert bus.metric(DROPPING) == 2
    finally:
        publisher.stop()

    # One reads what waits for it: its episode ends, with the whole count.
    queued.messages(HARD_LIMIT, drain=0.5)
    wait_until(lambda: drops_of(bus, queued_cid)[-1]["event"] == "flood.drop.ended", "the end")
    ended = drops_of(bus, queued_cid)[-1]
    assert ended["count"] == client_rows(bus)[queued_cid]["dropped"]
    # The other leaves: its episode ends at once.
    shedding.close()
    wait_until(lambda: drops_of(bus, shedding_cid)[-1]["event"] == "flood.drop.ended", "its end")
    bus.wait_metric(DROPPING, 0)
    assert not client_rows(bus)[queued_cid]["dropping"]
    queued.close()
