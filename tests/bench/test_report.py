"""The benchmark's verdicts and exit status, from figures made up here (no servers).

A figure no real run can give (a stalled subscriber that made the others
faster, memory that shrank) is noise and judges nothing; every target of the
scenarios run has a verdict in the JSON; ``--check`` turns a target not met
into a non-zero exit.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from sbus_relay.bench import report
from sbus_relay.bench.report import MET, MISSED, NOISE, TARGETS, UNMEASURED
from sbus_relay.cli.bench import EXIT_FAILED, EXIT_TARGETS_MISSED, exit_status

pytestmark = pytest.mark.timeout(10)


def side(rate: float, **more: Any) -> dict[str, Any]:
    return {"median": rate, "p50_us": 10.0, "p99_us": 20.0, "cpu_us_per_delivery": 1.0,
            "rss_bytes": 1 << 20, "stalled": False, **more}  # fmt: skip


def stalled_entry(ours: float, clean: float) -> dict[str, Any]:
    entry = {
        "title": "stalled",
        "status": "ok",
        "compare": "clean",
        "sides": {"ours": side(ours), "clean": side(clean), "reference": side(1, stalled=True)},
    }
    report.evaluate("stalled", entry)
    return entry


def results_of(**entries: dict[str, Any]) -> dict[str, Any]:
    results = {"meta": {"only": list(entries), "repeat": 1, "payload_bytes": 64, "cpus": 2},
               "scenarios": entries}  # fmt: skip
    results["targets"] = report.all_verdicts(results)
    results["summary"] = report.summarize(results["targets"])
    return results


def test_a_stalled_subscriber_that_speeds_the_others_up_is_noise_not_a_negative_cost() -> None:
    entry = stalled_entry(ours=203_000, clean=100_000)  # ours 2.03x the clean side
    (verdict,) = entry["targets"]
    assert verdict["verdict"] == NOISE and verdict["met"] is None
    assert "ours ran 2.03x the clean side" in verdict["note"]
    table = "\n".join(report.format_targets(results_of(stalled=entry)))
    line = next(x for x in table.splitlines() if x.startswith("stalled subscriber"))
    assert " noise " in line and not re.search(r"-\d", line), line  # no "-103.0 %"
    assert "targets: 0 met, 1 noise of 1" in table


def test_a_real_cost_is_judged() -> None:
    assert stalled_entry(ours=97_000, clean=100_000)["targets"][0]["verdict"] == MET
    missed = stalled_entry(ours=50_000, clean=100_000)["targets"][0]
    assert (missed["verdict"], missed["met"]) == (MISSED, False)
    assert missed["value"] == pytest.approx(0.5)


def test_memory_that_shrank_is_noise() -> None:
    ours = {"per_client_bytes": 430.0, "per_pattern_bytes": -3.0}
    entry = {"title": "memory", "status": "ok", "sides": {"ours": ours}}
    report.evaluate("memory", entry)
    verdicts = {v["label"]: v["verdict"] for v in entry["targets"]}
    assert verdicts == {"memory per idle client": MET, "memory per stored pattern": NOISE}


def test_every_target_of_the_scenarios_run_has_a_verdict() -> None:
    entry = stalled_entry(ours=97_000, clean=100_000)
    failed = {"title": "1to1", "status": "failed", "reason": "boom"}
    results = results_of(stalled=entry, **{"1to1": failed})
    assert [v["label"] for v in results["targets"]] == [
        t.label for t in TARGETS if t.scenario in ("stalled", "1to1")
    ]
    one = next(v for v in results["targets"] if v["scenario"] == "1to1")
    assert one["verdict"] == UNMEASURED and one["note"] == "scenario failed: boom"
    assert results["summary"] == {MET: 1, MISSED: 0, NOISE: 0, UNMEASURED: 1}


def test_exit_status_fails_on_a_missed_target_only_with_check() -> None:
    met = results_of(stalled=stalled_entry(ours=97_000, clean=100_000))
    missed = results_of(stalled=stalled_entry(ours=50_000, clean=100_000))
    noisy = results_of(stalled=stalled_entry(ours=300_000, clean=100_000))
    assert exit_status(met, check=True) == (0, "")
    assert exit_status(missed, check=False) == (0, "")
    assert exit_status(missed, check=True) == (
        EXIT_TARGETS_MISSED,
        "--check: 1 of 1 targets not met",
    )
    assert exit_status(noisy, check=True)[0] == EXIT_TARGETS_MISSED
    broken = copy.deepcopy(met)
    broken["scenarios"]["1to1"] = {"status": "failed", "reason": "boom"}
    assert exit_status(broken, check=False) == (EXIT_FAILED, "1 scenario(s) failed: 1to1")


def run(rate: float, p99: float = 20.0, cpu: float = 1.0) -> dict[str, Any]:
    return {"rate": rate, "lat_p99_us": p99, "cpu_us_per_delivery": cpu}


def paired(ours: list[float], reference: list[float]) -> dict[str, Any]:
    """A 1 -> 1 entry whose sides ran these rates, interleaved."""
    entry = {
        "title": "1to1",
        "status": "ok",
        "compare": "reference",
        "sides": {
            "ours": side(report.median(ours), runs=[run(r) for r in ours]),
            "reference": side(report.median(reference), runs=[run(r) for r in reference]),
        },
    }
    report.evaluate("1to1", entry)
    return entry


def test_a_figure_whose_repeats_straddle_the_bound_is_noise() -> None:
    entry = paired([140, 170, 155], [100, 100, 100])  # 1.4x, 1.7x, 1.55x against 1.5x
    [v] = entry["targets"]
    assert v["spread"] == [1.4, 1.7]
    assert v["verdict"] == NOISE and v["noise"] == "spread"
    assert "1.55x" in "\n".join(report.format_targets(results_of(**{"1to1": entry})))


def test_a_figure_clear_of_its_bound_by_more_than_its_spread_is_judged() -> None:
    [v] = paired([180, 200, 190], [100, 100, 100])["targets"]  # 1.8x to 2.0x
    assert v["spread"] == [1.8, 2.0] and v["verdict"] == MET
    [v] = paired([120, 125, 130], [100, 100, 100])["targets"]
    assert v["verdict"] == MISSED


def test_one_run_has_no_spread_and_is_judged_as_it_is() -> None:
    [v] = paired([151], [100])["targets"]
    assert v["spread"] is None and v["verdict"] == MET


def test_a_scenario_may_give_its_own_per_run_figures() -> None:
    entry = {"title": "upgrade", "status": "ok", "handover_max_ms": 990.0,
             "lost_or_reordered": 0, "per_run": {"handover_max_ms": [10.0, 990.0]}}  # fmt: skip
    report.evaluate("upgrade", entry)
    longest = next(v for v in entry["targets"] if v["metric"] == "handover_max_ms")
    assert longest["spread"] == [10.0, 990.0] and longest["verdict"] == NOISE


def test_each_side_shows_the_spread_of_its_rates() -> None:
    entry = paired([90, 110, 100], [100, 100, 100])
    table = report.format_table(results_of(**{"1to1": entry}))
    ours_line = next(line for line in table.splitlines() if line.rstrip().endswith("reference"))
    assert " 20% " in ours_line  # (110 - 90) / 100


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
#: An absolute path of some machine, anywhere in a string.
MACHINE_PATH = re.compile(r"(?:^|[\s=:'\"(])/(?:[\w.+-]+/)*[\w.+-]+")


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


@pytest.mark.parametrize("name", ["performance-run.json", "client-run.json"])
def test_committed_run_files_name_no_path_of_the_machine_they_ran_on(name: str) -> None:
    import json

    data = json.loads((ROOT / "docs" / name).read_text())
    found = [s for s in strings(data) if MACHINE_PATH.search(s)]
    assert found == [], f"docs/{name} names paths of the machine it was made on"


def test_the_bench_writes_programs_by_name() -> None:
    from sbus_relay.bench.runner import portable

    assert portable("/work/x/.venv/bin/sbusd") == "sbusd"
    assert portable("/root/.cache/b/reference-7c64/sbusd", 2) == "reference-7c64/sbusd"
    assert portable("-f") == "-f"
    assert MACHINE_PATH.search("/tmp/sbus") and not MACHINE_PATH.search("1 -> 1 / 2")


def test_compare_says_worse_only_beyond_the_runs_noise() -> None:
    from sbus_relay.bench import compare

    def bench_run(ratio: float, cpu: float) -> dict[str, Any]:
        entry = {"status": "ok", "sides": {"ours": {"cpu_us_per_delivery": cpu}}}
        target = {"label": "1 -> 1, ours / reference", "value": ratio}
        return {"meta": {"load_before": 0.3}, "targets": [target], "scenarios": {"1to1": entry}}

    before = [bench_run(1.5, 1.3), bench_run(1.6, 1.2), bench_run(1.4, 1.4)]
    overlapping = [bench_run(1.45, 1.35), bench_run(1.55, 1.3), bench_run(1.5, 1.25)]
    rows = {r["figure"]: r for r in compare.compare(before, overlapping)}
    assert {r["verdict"] for r in rows.values()} == {compare.SAME}
    slower = [bench_run(1.2, 1.6), bench_run(1.3, 1.5), bench_run(1.25, 1.7)]
    rows = {r["figure"]: r for r in compare.compare(before, slower)}
    assert rows["1 -> 1, ours / reference"]["verdict"] == compare.WORSE
    assert rows["1to1: our CPU us per delivery"]["verdict"] == compare.WORSE
    assert "| worse |" in compare.table(list(rows.values()))
    [one] = compare.compare(before[:1], slower[:1])[:1]
    assert one["verdict"] == compare.UNJUDGED  # one run each: no noise to judge against
