"""The ``fleet`` bench scenario end to end, scaled down: both sides deliver
every message and the entry has the figures docs/nats.md quotes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from sbus_relay.bench import fleet, report
from sbus_relay.bench.build import BuildError, build_programs
from sbus_relay.bench.procs import ProcessSet
from sbus_relay.bench.scenarios import child_env, find_tools
from tests.nats.cluster import nats_server_binary

pytestmark = pytest.mark.timeout(180)


def test_fleet_scenario(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nats_server_binary()  # skips without one
    monkeypatch.setattr(fleet, "QUICK_MESSAGES", 3000)
    monkeypatch.setattr(fleet, "QUICK_LATENCY_S", 0.2)
    try:  # the C clients' limit where libnats is installed
        programs = build_programs(tmp_path / "cache")
    except BuildError:
        programs = {"loadgen": Path("/nonexistent")}
    tools = find_tools(programs, None, None)
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
    batched = entry["sides"]["batched"]
    assert batched["delivered"] == [3000] and len(batched["cpu_us_per_msg"]) == 2
    if tools.natsload is not None:
        assert entry["sides"]["limit"]["delivered"] == [3000]
    for when in ("rss_idle", "rss_load"):
        assert all(r["master"] > 0 and r["link"] > 0 for r in entry[when]), entry[when]
    assert entry["load_max"] >= 0 and entry["cpu_us_per_msg_max"] > 0
    assert said[0].startswith("fleet (engine ")
    assert any(line.strip().startswith("load average") for line in said)
    # the targets are judged, or refused in one line on a busy machine
    report.evaluate("fleet", entry)
    assert len(entry["targets"]) == 3
    if entry["load_max"] > report.LOAD_MAX:
        assert all(v["verdict"] == report.UNMEASURED for v in entry["targets"])
        assert any("not a measure" in line for line in said)
