"""The analysis benchmark: no ratio or target from runs above load average 2,
the engines each size runs, a run's load and breakdown recorded; and the whole
benchmark at a small size, one host and a fleet, as the lead runs it big."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sbus_relay.bench import pipeline as B
from sbus_relay.bench.timedruns import LOAD_LIMIT, Run, timed, verdict

#: Seconds the small benchmark may take: a Connect server, a cluster, a few runs.
BENCH_TIMEOUT = 1200


def run_at(load: float) -> Run:
    return Run("x", 1.0, None, None, 0.0, 0.0, 0.0, True, load_before=0.1, load_after=load)


def test_no_verdict_from_runs_above_the_load_limit() -> None:
    quiet = [run_at(0.5), run_at(LOAD_LIMIT)]
    assert verdict("target: fast", quiet, True) == "target: fast: met"
    assert verdict("target: fast", quiet, False) == "target: fast: NOT met"
    said = verdict("target: fast", [*quiet, run_at(LOAD_LIMIT + 0.1)], True)
    assert "not judged" in said and "met" not in said.replace("not judged", "")
    assert f"above {LOAD_LIMIT:g}" in said


def test_each_size_runs_its_engines() -> None:
    small = B.engines_for(10_000_000, None)
    assert small == list(B.ENGINES.values())
    assert B.engines_for(1_000_000_000, None) == [B.DUCKDB, B.CONNECT, B.CLUSTER]
    assert B.engines_for(1_000_000_000, None, ("cluster",)) == [B.DUCKDB, B.CONNECT]
    assert B.engines_for(5, ["duckdb", "raw"]) == [B.DUCKDB, B.CONNECT_RAW]


def test_a_run_waits_for_the_load_to_settle_but_not_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sbus_relay.bench import timedruns

    seen = iter([3.0, 2.0, 0.5, 0.4])
    monkeypatch.setattr(timedruns, "SETTLE_POLL_S", 0.0)
    monkeypatch.setattr(timedruns, "load_average", lambda: next(seen))
    timedruns.settle(60.0)
    assert next(seen) == 0.4  # it stopped looking once the load was below 1
    monkeypatch.setattr(timedruns, "load_average", lambda: 5.0)
    timedruns.settle(0.0)  # never waits with no time to wait


#: A command that says what analyze says of its time, as analyze does.
SAYS_ITS_TIME = """
import json, os, time
start = time.time()
time.sleep(0.2)
phases = {"inputs": 0.01, "session": 0.02, "job": 0.1, "tables": 0.03, "stop": 0.0, "report": 0}
with open(os.environ["SBUS_ANALYZE_TIMINGS"], "w") as f:
    json.dump({"phases": phases, "started": start, "ended": time.time()}, f)
print("analysed 1 message (1 key; nothing lost) in 0.2 s (connected 0.1 s, analysis 0.1 s)")
"""


def test_a_run_records_the_load_around_it_and_its_breakdown(tmp_path: Path) -> None:
    run = timed("x", [sys.executable, "-c", SAYS_ITS_TIME], tmp_path / "x.log")
    assert run.ok and run.analysis == 0.1 and run.start == 0.1
    assert run.load_before >= 0 and run.load_after >= 0
    assert run.phases["job"] == 0.1 and run.phases["before"] > 0 and run.phases["after"] >= 0
    assert run.phases["before"] + 0.2 <= run.seconds + 0.05


def bench(*args: str, data: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sbus_relay.bench.pipeline", *args, "--runs", "1",
         "--settle", "0", "--dir", str(data)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BENCH_TIMEOUT - 60,
        env={k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(BENCH_TIMEOUT)
def test_the_benchmark_at_a_small_size_one_host_and_a_fleet(tmp_path: Path) -> None:
    """The commands the lead runs at a billion rows and for a fleet, at a few
    thousand rows: every engine's tables equal DuckDB's and each other's, the
    breakdown printed, the captures kept for the next invocation."""
    data = tmp_path / "data"
    out = bench("--rows", "30000", "--engines", "duckdb,connect,report,cluster", data=data)
    assert "identical to analyze's output" in out and "byte-identical to Connect's" in out
    assert "| spark cluster |" in out and "| spark connect, warm, with the report |" in out
    assert "Where the time of the last warm Connect run" in out
    assert "| the Spark job, its result on the driver |" in out
    assert not (data / "synth30000" / "merged.rollups").exists()  # one file: nothing to merge
    fleet = bench("--fleet", "3", "--rows", "30000", data=data)
    assert "identical to analyze's output" in fleet
    assert "the fleet's report within 1.5x one directory's" in fleet
    assert (data / "fleet3x30000" / "merged.rollups").is_file()
    assert sorted(p.name for p in (data / "fleet3x30000").iterdir() if p.is_dir()) == [
        "host00", "host01", "host02"
    ]  # fmt: skip
    assert not [p for p in data.iterdir() if p.name.startswith("work-")]
