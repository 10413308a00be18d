"""One timed run of an analysis engine, and what the benchmark says of many.

What it owns: how a run is timed (end to end, the machine's load average before and
after it, peak memory, analyze's own breakdown of its time), the table of
medians, and the rule for stating a ratio or a target: only from runs taken
at a load average of at most LOAD_LIMIT, else one line saying why not.
What it may touch: the processes it runs and the files they write.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sbus_relay.bench import sparkstages
from sbus_relay.bench.rss import Sampler
from sbus_relay.ops import children

#: Highest load average (1 minute) at which a run's figures back a ratio or a
#: target: above it, other work shares the cores, and a ratio of two engines
#: says how each suffers, not how fast it is.
LOAD_LIMIT = 2.0
#: Before each run, the benchmark waits (at most its ``settle`` seconds) for
#: the load average to fall below SETTLE_LOAD: the previous run's own load (two
#: busy cores for a minute make a load average of 1.3) is not the next one's.
SETTLE_LOAD = 1.0
#: Seconds between looks at the load average while settling.
SETTLE_POLL_S = 1.0
#: The timing analyze prints (runner.Outcome.line) and the peer's.
SPARK_TIMING = re.compile(r"\((?:Spark start|connected) ([0-9.]+) s, analysis ([0-9.]+) s")
PEER_TIMING = re.compile(r"^analysis ([0-9.]+) s$", re.M)
#: The variable naming the file where analyze writes its breakdown (runner.TIMINGS_ENV).
TIMINGS_ENV = "SBUS_ANALYZE_TIMINGS"
#: Analyze's phases, in order, as the breakdown names them.
PHASES = (
    ("inputs", "inputs checked, rollups planned (and merged)"),
    ("session", "Spark: pyspark imported, the session up"),
    ("job", "the Spark job, its result on the driver"),
    ("tables", "tables derived and written"),
    ("stop", "the session let go"),
    ("report", "the report drawn"),
)


@dataclass
class Run:
    """One engine's figures in one round."""

    engine: str
    #: Command start to output written.
    seconds: float
    #: The analysis alone (analyze's "analysis" figure; DuckDB's); None if not printed.
    analysis: float | None
    #: Spark's start (or the connection to the server), from analyze's line.
    start: float | None
    #: Peak RSS (MiB): driver (or server) JVM, executor JVM, everything else.
    driver_jvm: float
    executor_jvm: float
    other: float
    ok: bool
    #: Wall clock (ms since the epoch) of the run: its stages in an event log.
    start_ms: int = 0
    end_ms: int = 0
    #: The 1-minute load average just before and just after the run.
    load_before: float = 0.0
    load_after: float = 0.0
    #: analyze's breakdown (TIMINGS_ENV): phase -> seconds, plus "before" (the
    #: interpreter and its imports) and "after" (its exit).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def load(self) -> float:
        return max(self.load_before, self.load_after)


def load_average() -> float:
    return os.getloadavg()[0]


def settle(seconds: float) -> None:
    """Wait until the load average is below SETTLE_LOAD, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while load_average() >= SETTLE_LOAD and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)


def timed(
    engine: str,
    cmd: list[str],
    log: Path,
    worker: int | None = None,
    server: int | None = None,
    settle_s: float = 0.0,
) -> Run:
    """Run ``cmd`` to its end (its stderr into ``log``), once the load average
    has settled (``settle``, at most ``settle_s`` seconds); its figures."""
    settle(settle_s)
    timings = log.with_suffix(".timings.json")
    timings.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    env[TIMINGS_ENV] = str(timings)
    load_before = load_average()
    start_ms = time.time_ns() // 10**6
    started = time.time()
    t0 = time.monotonic()
    proc = children.spawn(cmd, log=log, append=False, stdout="pipe", text=True, env=env)
    with Sampler(proc.pid, worker, server) as sampler:
        out, _ = proc.communicate()
    seconds = time.monotonic() - t0
    ended = time.time()
    if proc.returncode:
        err = log.read_text(errors="replace")
        sys.stderr.write(f"{engine} FAILED: {err[-3000:]}\n")
    found = SPARK_TIMING.search(out) or PEER_TIMING.search(out)
    analysis = float(found.groups()[-1]) if found else None
    start = float(found.group(1)) if found and len(found.groups()) > 1 else None
    run = Run(
        engine, seconds, analysis, start, sampler.driver_jvm, sampler.executor_jvm, sampler.other,
        proc.returncode == 0, start_ms, time.time_ns() // 10**6, load_before, load_average(),
    )  # fmt: skip
    try:
        said = json.loads(timings.read_text())
        run.phases = {k: float(v) for k, v in said["phases"].items()}
        run.phases["before"] = float(said["started"]) - started
        run.phases["after"] = ended - float(said["ended"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return run


def median(values: Iterable[float]) -> float:
    found = list(values)
    return statistics.median(found) if found else math.nan


def loads(runs: Iterable[Run]) -> tuple[float, float]:
    """The lowest and highest load average around ``runs``."""
    found = [x for r in runs for x in (r.load_before, r.load_after)]
    return (min(found), max(found)) if found else (math.nan, math.nan)


def quiet(runs: Iterable[Run]) -> bool:
    """Whether every one of ``runs`` ran at a load average of at most LOAD_LIMIT."""
    return all(r.load <= LOAD_LIMIT for r in runs)


def verdict(claim: str, runs: list[Run], met: bool) -> str:
    """``claim``: met or not, or, when a run ran above LOAD_LIMIT, that it is not judged."""
    if quiet(runs):
        return f"{claim}: {'met' if met else 'NOT met'}"
    high = max(r.load for r in runs)
    return (
        f"{claim}: not judged (runs at load average up to {high:.1f}, above {LOAD_LIMIT:g}: "
        "measure on a quiet machine)"
    )


def table(results: dict[str, list[Run]]) -> dict[str, dict[str, float]]:
    """Print the medians per engine (with each run and the load around them); return them."""
    print(
        "| engine | end to end: median (each run) | load average | Spark start | "
        "analysis, session up | peak RSS, driver JVM | peak RSS, executor JVM | "
        "peak RSS, other |"
    )
    print("|---|---|---|---|---|---|---|---|")
    med: dict[str, dict[str, float]] = {}
    for engine, rs in results.items():
        if not rs:
            continue
        m = {
            "seconds": median(r.seconds for r in rs),
            "analysis": median(r.analysis for r in rs if r.analysis is not None),
            "start": median(r.start for r in rs if r.start is not None),
            "driver_jvm": max(r.driver_jvm for r in rs),
            "executor_jvm": max(r.executor_jvm for r in rs),
            "other": max(r.other for r in rs),
        }
        med[engine] = m
        each = ", ".join(f"{r.seconds:.1f}" for r in rs)
        low, high = loads(rs)
        spark = engine.startswith("spark")
        jvm = f"{m['driver_jvm']:,.0f} MiB" if spark else "-"
        if "connect" in engine:
            jvm += " (the server)"
        ex = f"{m['executor_jvm']:,.0f} MiB" if "cluster" in engine else "-"
        analysis = "-" if math.isnan(m["analysis"]) else f"{m['analysis']:.1f} s"
        start = "-" if math.isnan(m["start"]) else f"{m['start']:.1f} s"
        other = "-" if engine == "follow" else f"{m['other']:,.0f} MiB"
        failed = "" if all(r.ok for r in rs) else " (FAILED)"
        print(
            f"| {engine}{failed} | {m['seconds']:.2f} s ({each}) | {low:.1f} to {high:.1f} | "
            f"{start} | {analysis} | {jvm} | {ex} | {other} |"
        )
    return med


def breakdown(run: Run, events: str | None, title: str) -> None:
    """Print where the time of ``run`` went: analyze's phases (from its own
    clock, and the interpreter before and after it), then the Spark job's
    stages from the event log in ``events``."""
    print(f"\nWhere the time of {title} went ({run.seconds:.2f} s end to end, load average "
          f"{run.load_before:.1f} before, {run.load_after:.1f} after):")  # fmt: skip
    if run.phases:
        print("\n| phase | seconds |\n|---|---|")
        print(f"| the interpreter started, analyze's modules imported | "
              f"{run.phases.get('before', math.nan):.2f} |")  # fmt: skip
        for key, what in PHASES:
            if key in run.phases:
                print(f"| {what} | {run.phases[key]:.2f} |")
        print(f"| the interpreter's exit | {run.phases.get('after', math.nan):.2f} |")
    if events is not None:
        found = sparkstages.stages(events, run.start_ms, run.end_ms)
        job = run.phases.get("job")
        print(f"\nThe job's stages ({'' if job is None else f'{job:.2f} s of '}the run):\n")
        for line in sparkstages.table(found, job if job is not None else run.seconds):
            print(line)
