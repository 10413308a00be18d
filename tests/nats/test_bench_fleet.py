"""The ``fleet`` bench scenario end to end, scaled down: both sides deliver
every message and the entry has the figures docs/nats.md quotes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from sbus_relay.bench import fleet
from sbus_relay.bench.procs import ProcessSet
from sbus_relay.bench.scenarios import child_env, find_tools
from tests.nats.cluster import nats_server_binary

pytestmark = pytest.mark.timeout(180)


def test_fleet_scenario(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nats_server_binary()  # skips without one
    monkeypatch.setattr(fleet, "QUICK_MESSAGES", 3000)
    monkeypatch.setattr(fleet, "QUICK_LATENCY_S", 0.2)
    tools = find_tools({"loadgen": Path("/nonexistent")}, None, None)
    said: list[str] = []
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    (work / "logs").mkdir()
    with ProcessSet(work / "logs", child_env()) as procs:
        entry = fleet.run(tools, procs, work, True, said.append)
    assert entry["status"] == "ok", entry
    buses, native = entry["sides"]["buses"], entry["sides"]["native"]
    assert buses["delivered"] == [3000] and native["delivered"] == [3000]
    assert buses["median"] > 0 and native["median"] > 0 and entry["ratio"] > 0
    assert buses["p99_us"] >= buses["p50_us"] > 0
    assert len(buses["cpu_us_per_msg"]) == 2 and all(c > 0 for c in buses["cpu_us_per_msg"])
    assert said and said[-1].startswith("fleet: buses ")
