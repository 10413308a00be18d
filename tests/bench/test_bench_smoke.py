"""Smoke test of ``sbus-relay bench``: every scenario runs and the bus delivers.

No speed is asserted here -- targets belong in the printed benchmark, not in
timed tests.  What is asserted: each scenario produced positive figures, and in
every case without a stalled subscriber each reading subscriber received every
message that was published (the loadgen counts them itself).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MESSAGES = 20_000
THROUGHPUT = ("1to1", "2to4", "1to2", "1to2_idle", "1to1_stalled", "relay")
EVERY = (*THROUGHPUT, "latency", "memory")

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "out.json"
    cmd = [
        sys.executable,
        "-m",
        "sbus_relay",
        "bench",
        "--quick",
        "--messages",
        str(MESSAGES),
        "--repeat",
        "1",
        "--json",
        str(out),
        "--cache-dir",
        str(out.parent / "cache"),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.exists(), f"no JSON written (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    data: dict[str, Any] = json.loads(out.read_text())
    data["_stdout"] = proc.stdout
    data["_returncode"] = proc.returncode
    return data


@pytest.mark.timeout(320)
def test_every_scenario_ran(results: dict[str, Any]) -> None:
    scenarios = results["scenarios"]
    assert set(EVERY) <= set(scenarios)
    broken = {n: s.get("reason") for n, s in scenarios.items() if s["status"] != "ok"}
    assert not broken, f"scenarios not measured: {broken}"
    assert results["_returncode"] == 0
    assert "1 -> 1, 64 B" in results["_stdout"]


@pytest.mark.timeout(320)
@pytest.mark.parametrize("name", THROUGHPUT)
def test_throughput_positive_and_complete(results: dict[str, Any], name: str) -> None:
    s = results["scenarios"][name]
    assert s["status"] == "ok", s.get("reason")
    assert s["median"] > 0
    for run in s["runs"]:
        assert run["sent"] == MESSAGES
        assert run["rate"] > 0
        if name != "1to1_stalled":
            # deliveries = messages x reading subscribers: nothing lost, nothing extra
            assert run["delivered"] == run["expected"], run
            assert run["gaps"] == 0 and run["reordered"] == 0, run
        else:
            assert run["delivered"] > 0
    if s.get("baseline_runs"):
        assert all(r["delivered"] == r["expected"] for r in s["baseline_runs"])
        assert s["ratio_baseline"] > 0


@pytest.mark.timeout(320)
def test_latency_and_memory_positive(results: dict[str, Any]) -> None:
    lat = results["scenarios"]["latency"]
    assert lat["status"] == "ok", lat.get("reason")
    assert 0 < lat["p50_us"] <= lat["p99_us"]
    assert lat["delivered"] == lat["expected"] == lat["sent"] > 0
    mem = results["scenarios"]["memory"]
    assert mem["status"] == "ok", mem.get("reason")
    assert mem["clients"] == 1000 and mem["patterns"] == 100_000
    assert mem["per_client_bytes"] > 0 and mem["per_pattern_bytes"] > 0
