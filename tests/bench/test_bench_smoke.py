"""Smoke tests of ``sbus-relay bench``: real servers, quick-sized runs, the JSON's shape.

No speed is asserted here -- targets belong in the printed benchmark, not in
timed tests.  What is asserted: each scenario produced figures on every side,
every reading subscriber of a lossless side received every message (the
loadgen counts them itself), the reference column is there when a reference
binary is given and left out, with its reason, when not.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sbus_relay.bench.build import BuildError
from sbus_relay.bench.reference import build_reference, find_sources
from sbus_relay.bench.report import TARGETS
from sbus_relay.bench.runner import SCENARIO_NAMES
from sbus_relay.cli.bench import EXIT_TARGETS_MISSED

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 3_000
#: Scenarios of the smoke run: one of each kind of load the runner drives.
SMOKE = ("1to1", "wildcards", "1to100", "stalled", "churn", "clients_1000", "relay_up")
#: Seconds for the whole smoke run (it is about 40 s on 2 idle cores).
RUN_TIMEOUT = 240

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def bench(
    tmp: Path, *args: str, timeout: float = RUN_TIMEOUT, status: int = 0
) -> tuple[dict[str, Any], str, str]:
    """Run ``sbus-relay bench --quick ARGS --json``; return the JSON, stdout and stderr."""
    out = tmp / "out.json"
    cmd = [sys.executable, "-m", "sbus_relay", "bench", "--quick", "--json", str(out)]
    cmd += ["--messages", str(MESSAGES), "--repeat", "1", "--cache-dir", str(tmp / "cache")]
    proc = subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT
    )
    assert out.exists(), f"no JSON written (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    assert proc.returncode == status, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def reference_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, reason = find_sources()
    if source is None:
        pytest.skip(reason)
    try:
        return build_reference(source, tmp_path_factory.mktemp("refbuild"))
    except BuildError as exc:
        pytest.fail(f"the reference sources are there but do not build: {exc}")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, reference_binary: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bench")
    only = [arg for name in SMOKE for arg in ("--only", name)]
    data, stdout, _ = bench(tmp, "--reference", str(reference_binary), *only)
    data["_stdout"] = stdout
    return data


def lossless(side: dict[str, Any]) -> None:
    for run in side["runs"]:
        assert run["delivered"] == run["expected"] > 0, run
        assert run["gaps"] == 0 and run["reordered"] == 0 and run["truncated"] == 0, run
        assert not run["stalled"], run


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_every_side_measured_and_lossless(live: dict[str, Any]) -> None:
    scenarios = live["scenarios"]
    assert set(scenarios) == set(SMOKE)
    broken = {n: s.get("reason") for n, s in scenarios.items() if s["status"] != "ok"}
    assert not broken, f"scenarios not measured: {broken}"
    for name, s in scenarios.items():
        for side_name, side in s["sides"].items():
            assert len(side["runs"]) == 1, (name, side_name)
            for key in (
                "median",
                "p50_us",
                "p99_us",
                "cpu_us_per_delivery",
                "rss_bytes",
                "load_cpu_us_per_delivery",
            ):
                assert side[key] > 0, (name, side_name, key, side[key])
            if not (name == "stalled" and side_name == "reference"):
                lossless(side)


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_reference_column_is_live(live: dict[str, Any], reference_binary: Path) -> None:
    # by name, never by the path it had here (a run's file is read elsewhere)
    resolved = reference_binary.resolve()
    assert live["meta"]["reference"] == f"{resolved.parent.name}/{resolved.name}"
    one = live["scenarios"]["1to1"]
    assert set(one["sides"]) == {"ours", "reference"}
    assert one["ratio"] == pytest.approx(
        one["sides"]["ours"]["median"] / one["sides"]["reference"]["median"]
    )
    assert [t["label"] for t in one["targets"]] == ["1 -> 1, ours / reference"]
    assert "reference" in live["_stdout"]
    assert "1 -> 1, ours / reference" in live["_stdout"]


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_stalled_reference_reported_as_stalled(live: dict[str, Any]) -> None:
    s = live["scenarios"]["stalled"]
    assert set(s["sides"]) == {"ours", "clean", "reference"}
    ref = s["sides"]["reference"]
    # The reference blocks on the subscriber that never reads: the run ends by
    # the benchmark's timeout, with the publisher unfinished.
    assert ref["stalled"] is True
    assert ref["delivered"] < ref["expected"]
    assert s["overhead"] == pytest.approx(
        1 - s["sides"]["ours"]["median"] / s["sides"]["clean"]["median"]
    )
    assert "stalls" in live["_stdout"]


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_every_target_has_a_verdict_a_script_can_read(live: dict[str, Any]) -> None:
    verdicts = live["targets"]
    assert [v["label"] for v in verdicts] == [t.label for t in TARGETS if t.scenario in SMOKE]
    for v in verdicts:
        assert v["verdict"] in ("met", "missed", "noise", "unmeasured"), v
        assert v["met"] is (
            None if v["verdict"] in ("noise", "unmeasured") else v["verdict"] == "met"
        )
        if v["verdict"] in ("met", "missed"):
            assert v["value"] > 0 and not (v["metric"] == "overhead" and v["value"] > 1), v
    assert sum(live["summary"].values()) == len(verdicts)
    assert live["meta"]["load_before"] >= 0 and live["meta"]["load_after"] >= 0


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_churn_runs_beside_the_same_traffic_without_it(live: dict[str, Any]) -> None:
    churn = live["scenarios"]["churn"]
    assert set(churn["sides"]) == {"ours", "calm"} and churn["compare"] == "calm"
    assert churn["sides"]["ours"]["churn_per_s"] > 0, "subscriptions changed beside the traffic"
    assert churn["sides"]["calm"]["churn_per_s"] == 0
    assert churn["ratio"] is not None
    assert "(un)subscriptions/s" in live["_stdout"]


@pytest.mark.timeout(120)
def test_an_idle_relay_is_shown_beside_its_floor(tmp_path: Path) -> None:
    data, stdout, _ = bench(tmp_path, "--no-reference", "--only", "footprint", timeout=100)
    foot = data["scenarios"]["footprint"]
    assert foot["status"] == "ok", foot
    floor = list(foot["floor"].values())
    assert 0 < floor[0] < floor[1] < floor[2], "python, + gevent, + structlog: each adds"
    assert foot["idle_relay_rss"] > floor[0]
    assert set(foot["on_demand"]) == {
        "yaml (with a config file)",
        "prometheus_client (with --metrics)",
    }
    assert "its floor, in a fresh interpreter:" in stdout and "+ gevent + structlog" in stdout


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_relay_compared_with_direct_path(live: dict[str, Any]) -> None:
    s = live["scenarios"]["relay_up"]
    assert set(s["sides"]) == {"ours", "direct"}
    assert s["compare"] == "direct" and s["ratio"] > 0
    assert len(s["sides"]["ours"]["runs"]) == 1


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_fan_out_and_crowd_count_every_connection(live: dict[str, Any]) -> None:
    wide = live["scenarios"]["1to100"]["sides"]["ours"]
    assert wide["expected"] == 100 * (MESSAGES // 20)
    crowd = live["scenarios"]["clients_1000"]
    assert crowd["sides"]["ours"]["expected"] == crowd["sides"]["reference"]["expected"] > 0
    assert crowd["p99_us"] == crowd["sides"]["ours"]["p99_us"]


@pytest.mark.timeout(120)
def test_no_reference_leaves_the_column_out_with_a_reason(tmp_path: Path) -> None:
    data, stdout, stderr = bench(tmp_path, "--no-reference", "--only", "1to1")
    s = data["scenarios"]["1to1"]
    assert set(s["sides"]) == {"ours"}
    assert s["reference_left_out"] == "--no-reference given"
    assert s["ratio"] is None and s["targets"][0]["met"] is None
    assert data["meta"]["reference"] is None
    assert "--no-reference given; its column is left out" in stderr
    assert "reference left out: --no-reference given" in stdout


@pytest.mark.timeout(120)
def test_check_exits_non_zero_when_a_target_is_not_met(tmp_path: Path) -> None:
    # Without a reference the 1 -> 1 ratio cannot be judged: under --check that
    # is a target not met, in the exit status, on stderr and in the JSON.
    data, stdout, stderr = bench(
        tmp_path, "--check", "--no-reference", "--only", "1to1", status=EXIT_TARGETS_MISSED
    )
    assert stderr.splitlines()[-1] == "sbus-relay bench: --check: 1 of 1 targets not met"
    (verdict,) = data["targets"]
    assert verdict["label"] == "1 -> 1, ours / reference"
    assert (verdict["verdict"], verdict["met"]) == ("unmeasured", None)
    assert data["summary"] == {"met": 0, "missed": 0, "noise": 0, "unmeasured": 1}
    assert data["meta"]["check"] is True and data["meta"]["only"] == ["1to1"]
    assert "targets: 0 met, 1 not measured of 1" in stdout


@pytest.mark.timeout(120)
def test_missing_sources_named_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBUS_REFERENCE_SRC", str(tmp_path / "nowhere"))
    data, _, stderr = bench(tmp_path, "--only", "1to1")
    reason = data["scenarios"]["1to1"]["reference_left_out"]
    assert "SBUS_REFERENCE_SRC" in reason and "sbusd.c" in reason
    assert f"reference sbusd: {reason}; its column is left out" in stderr.splitlines()


@pytest.mark.timeout(30)
def test_bad_reference_is_one_clear_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sbus_relay", "bench", "--reference", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"sbus-relay bench: --reference {tmp_path / 'missing'}: not an executable file"
    ]


@pytest.mark.timeout(180)
def test_profile_draws_a_flame_graph(tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "py-spy").exists() and not shutil.which("py-spy"):
        pytest.skip("py-spy not installed")
    svg = tmp_path / "flame.svg"
    data, stdout, _ = bench(tmp_path, "--no-reference", "--only", "1to1", "--profile", str(svg))
    prof = data["profile"]
    denied = ("Permission denied", "not permitted")
    if prof["status"] != "ok" and any(word in prof["reason"] for word in denied):
        pytest.skip(f"py-spy may not sample processes here: {prof['reason']}")
    assert prof["status"] == "ok", prof
    assert "<svg" in svg.read_text()
    assert prof["samples"] > 0 and prof["own"][0]["percent"] > 0
    assert any("sbus_relay/" in row["function"] for row in prof["own"])
    assert f"flame graph: {svg}" in stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_of_every_scenario(tmp_path: Path, reference_binary: Path) -> None:
    out = tmp_path / "quick.json"
    cmd = [sys.executable, "-m", "sbus_relay", "bench", "--quick", "--json", str(out)]
    cmd += ["--reference", str(reference_binary), "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert list(data["scenarios"]) == list(SCENARIO_NAMES)
    assert all(s["status"] == "ok" for s in data["scenarios"].values())
    mem = data["scenarios"]["memory"]
    assert set(mem["sides"]) == {"ours", "reference"}
    for side in mem["sides"].values():
        assert side["per_client_bytes"] > 0 and side["per_pattern_bytes"] > 0
    for target in TARGETS:
        assert target.label in proc.stdout


@pytest.mark.timeout(180)
def test_upgrade_and_restart_count_every_message_across_the_switch(tmp_path: Path) -> None:
    data, stdout, _ = bench(tmp_path, "--no-reference", "--only", "upgrade", "--only", "restart")
    up, restart = data["scenarios"]["upgrade"], data["scenarios"]["restart"]
    assert up["status"] == "ok" and restart["status"] == "ok", (up, restart)
    # two publishers (on relay A and on the master), two subscribers (on the
    # master and on relay B): every message counted, none lost across the upgrade
    assert up["expected"] == 2 * up["published"] > 0
    assert (up["delivered"], up["gaps"], up["reordered"]) == (up["expected"], 0, 0)
    assert len(up["handover_ms"]) == 2 and all(ms > 0 for ms in up["handover_ms"])
    # a restart loses what was published while no master ran, and says how much
    assert restart["lost"] == restart["expected"] - restart["delivered"] >= 0
    assert len(restart["relays_ready_ms"]) == 2
    assert all(ms >= 0 for ms in restart["relays_ready_ms"])
    assert [v["scenario"] for v in data["targets"]] == ["upgrade", "upgrade", "restart"]
    assert "live upgrade of the master and a relay under load:" in stdout
    assert "after the new master listened" in stdout
