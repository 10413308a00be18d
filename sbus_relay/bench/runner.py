"""Run every scenario of ``sbus-relay bench`` and collect the results.

Each run gets a fresh server process (so a stalled client's queue or the idle
clients' patterns never leak into the next run); bus and limit-baseline runs
alternate so that drift in the machine's speed hits both alike.  A scenario
that fails is reported with its reason and the others still run.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from . import report
from .build import build_programs
from .procs import BenchProcessError, ProcessSet
from .scenarios import (
    Load,
    RunResult,
    Tools,
    bus_argv,
    child_env,
    drive,
    find_tools,
    forwarder_argv,
    measure_memory,
    new_address,
    relay_argv,
    relay_warmup,
    running_server,
)

#: Defaults of the full run (about 3 minutes on 2 cores) and of ``--quick``.
DEFAULT_MESSAGES = 100_000
DEFAULT_REPEAT = 3
QUICK_MESSAGES = 20_000
QUICK_REPEAT = 1
#: Fixed, moderate rate of the latency scenario (packets/s) and its duration.
LATENCY_RATE = 5_000.0
LATENCY_SECONDS = 3.0
QUICK_LATENCY_SECONDS = 1.0
#: Idle clients x non-matching patterns each, in the idle-patterns scenario.
IDLE_CLIENTS = 100
IDLE_PATTERNS = 100
#: The memory scenario: clients, then patterns per client (100,000 in all).
MEMORY_CLIENTS = 1_000
MEMORY_PATTERNS_PER_CLIENT = 100
#: Seconds a subscriber waits for more after the last packet before giving up.
SUB_IDLE_SECONDS = 2.0
QUICK_SUB_IDLE_SECONDS = 1.0

Failure = (BenchProcessError, TimeoutError, OSError, ValueError)


@dataclass(frozen=True)
class BenchOptions:
    """What ``sbus-relay bench`` was asked to do."""

    quick: bool = False
    messages: int | None = None
    repeat: int | None = None
    json_path: Path | None = None
    profile_path: Path | None = None
    sbusd: tuple[str, ...] | None = None
    cache_dir: Path | None = None
    keep: bool = False
    only: tuple[str, ...] = ()

    @property
    def n_messages(self) -> int:
        return self.messages or (QUICK_MESSAGES if self.quick else DEFAULT_MESSAGES)

    @property
    def n_repeat(self) -> int:
        return self.repeat or (QUICK_REPEAT if self.quick else DEFAULT_REPEAT)


@dataclass(frozen=True)
class Scenario:
    """A throughput scenario: the load on our bus and, if any, on forwarder.c."""

    name: str
    title: str
    load: Load
    baseline: Load | None
    relay: bool = False


@dataclass
class _Context:
    tools: Tools
    procs: ProcessSet
    workdir: Path
    options: BenchOptions
    say: Callable[[str], None]
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def idle_s(self) -> float:
        return QUICK_SUB_IDLE_SECONDS if self.options.quick else SUB_IDLE_SECONDS


def scenarios(messages: int) -> list[Scenario]:
    """The throughput scenarios of the issue, in the order they are run."""
    one_one = Load(messages)
    one_two = Load(messages, subscribers=2)
    return [
        Scenario("1to1", "1 -> 1, 64 B", one_one, one_one),
        Scenario("2to4", "2 pubs -> 4 subs", Load(messages, 2, 4), Load(messages, 2, 4)),
        Scenario("1to2", "1 -> 2", one_two, one_two),
        Scenario(
            "1to2_idle",
            f"1 -> 2, {IDLE_CLIENTS} idle x {IDLE_PATTERNS} patterns",
            Load(messages, subscribers=2, idle_clients=IDLE_CLIENTS, idle_patterns=IDLE_PATTERNS),
            one_two,  # forwarder.c does no routing: idle patterns cost it nothing
        ),
        Scenario("1to1_stalled", "1 -> 1 + 1 never-reading sub", Load(messages, stalled=1), None),
        Scenario("relay", "relay -> master, 1 -> 1", one_one, one_one, relay=True),
    ]


def _run_bus(ctx: _Context, sc: Scenario) -> RunResult:
    bus = new_address(ctx.workdir, "bus")
    with running_server(ctx.procs, "sbusd", bus_argv(ctx.tools, bus), bus):
        if not sc.relay:
            return drive(ctx.procs, ctx.tools, sc.load, bus, bus, ctx.idle_s)
        relay = new_address(ctx.workdir, "relay")
        try:
            server = running_server(ctx.procs, "relay", relay_argv(ctx.tools, relay, bus), relay)
            with server:
                return drive(
                    ctx.procs,
                    ctx.tools,
                    sc.load,
                    relay,
                    bus,
                    ctx.idle_s,
                    before_publish=lambda: relay_warmup(relay, bus),
                )
        except Failure as exc:
            raise _Unavailable(str(exc)) from exc


def _run_baseline(ctx: _Context, load: Load) -> RunResult:
    addr = new_address(ctx.workdir, "fwd")
    with running_server(ctx.procs, "forwarder", forwarder_argv(ctx.tools, addr), addr):
        return drive(ctx.procs, ctx.tools, load, addr, addr, ctx.idle_s)


class _Unavailable(Exception):
    """The scenario cannot run here (e.g. the relay does not start)."""


def _throughput(ctx: _Context, sc: Scenario) -> dict[str, Any]:
    entry: dict[str, Any] = {"title": sc.title, "unit": "deliveries/s", "status": "ok"}
    runs: list[RunResult] = []
    base_runs: list[RunResult] = []
    try:
        for i in range(ctx.options.n_repeat):
            run = _run_bus(ctx, sc)
            runs.append(run)
            ctx.say(f"  {sc.name} #{i + 1}: {run.rate:,.0f}/s ({run.delivered}/{run.expected})")
            if sc.baseline is not None:
                base = _run_baseline(ctx, sc.baseline)
                base_runs.append(base)
                ctx.say(f"  {sc.name} #{i + 1} limit: {base.rate:,.0f}/s")
    except _Unavailable as exc:
        return {**entry, "status": "unavailable", "reason": _first_line(exc)}
    except Failure as exc:
        return {**entry, "status": "failed", "reason": _first_line(exc), "detail": str(exc)}
    med = report.median([r.rate for r in runs])
    entry.update(
        median=med,
        runs=[r.as_dict() for r in runs],
        sent=runs[-1].sent,
        expected=runs[-1].expected,
        delivered=min(r.delivered for r in runs),
        lost=max(r.expected - r.delivered for r in runs),
    )
    if base_runs:
        base_med = report.median([r.rate for r in base_runs])
        entry.update(
            baseline_median=base_med,
            baseline_runs=[r.as_dict() for r in base_runs],
            ratio_baseline=report.ratio(med, base_med),
        )
    if sc.name in report.REFERENCE:
        entry["reference"] = report.REFERENCE[sc.name]
        entry["ratio_reference"] = report.ratio(med, report.REFERENCE[sc.name])
    if sc.name in report.TARGET_VS_REFERENCE:
        want = report.TARGET_VS_REFERENCE[sc.name]
        entry["target"] = f">= {want:g}x ref"
        entry["met"] = (entry["ratio_reference"] or 0.0) >= want
    _compare(ctx, sc.name, entry)
    return entry


def _compare(ctx: _Context, name: str, entry: dict[str, Any]) -> None:
    """Targets that compare two of our own scenarios."""
    done = ctx.results.get("scenarios", {})
    one_one = done.get("1to1", {}).get("median")
    if name == "1to2_idle":
        plain = done.get("1to2", {}).get("median")
        entry["ratio_no_idle"] = report.ratio(entry["median"], plain)
        if entry["ratio_no_idle"] is not None:
            entry["note"] = f"{entry['ratio_no_idle']:.2f}x the same load without idle patterns"
    elif name == "1to1_stalled" and one_one:
        overhead = 1.0 - entry["median"] / one_one
        entry.update(
            overhead=overhead,
            target="overhead < 20 %",
            met=overhead < report.TARGET_STALLED_OVERHEAD,
            note=f"overhead vs plain 1 -> 1: {overhead * 100:.1f} %; ref: stalls (0/s)",
        )
    elif name == "relay" and one_one:
        entry["ratio_single_bus"] = report.ratio(entry["median"], one_one)
        entry.update(
            target=">= 0.5x bus 1 -> 1",
            met=(entry["ratio_single_bus"] or 0.0) >= report.TARGET_RELAY_VS_BUS,
            note=f"{entry['ratio_single_bus']:.2f}x a single bus (1 -> 1)",
        )


def _latency(ctx: _Context) -> dict[str, Any]:
    seconds = QUICK_LATENCY_SECONDS if ctx.options.quick else LATENCY_SECONDS
    load = Load(int(LATENCY_RATE * seconds), rate=LATENCY_RATE)
    entry: dict[str, Any] = {
        "title": f"latency at {LATENCY_RATE:,.0f} msg/s",
        "status": "ok",
        "rate": LATENCY_RATE,
        "messages": load.messages,
    }
    runs: list[RunResult] = []
    base_runs: list[RunResult] = []
    try:
        for i in range(ctx.options.n_repeat):
            runs.append(_run_bus(ctx, Scenario("latency", "", load, None)))
            base_runs.append(_run_baseline(ctx, load))
            ctx.say(
                f"  latency #{i + 1}: p50 {runs[-1].lat_p50_us:.0f} us, "
                f"p99 {runs[-1].lat_p99_us:.0f} us"
            )
    except Failure as exc:
        return {**entry, "status": "failed", "reason": _first_line(exc), "detail": str(exc)}
    entry.update(
        p50_us=report.median([r.lat_p50_us for r in runs]),
        p99_us=report.median([r.lat_p99_us for r in runs]),
        baseline_p50_us=report.median([r.lat_p50_us for r in base_runs]),
        baseline_p99_us=report.median([r.lat_p99_us for r in base_runs]),
        sent=runs[-1].sent,
        expected=runs[-1].expected,
        delivered=min(r.delivered for r in runs),
        runs=[r.as_dict() for r in runs],
        baseline_runs=[r.as_dict() for r in base_runs],
    )
    return entry


def _memory(ctx: _Context) -> dict[str, Any]:
    entry: dict[str, Any] = {"title": "memory", "status": "ok"}
    bus = new_address(ctx.workdir, "mem")
    try:
        with running_server(ctx.procs, "sbusd", bus_argv(ctx.tools, bus), bus) as server:
            mem = measure_memory(
                ctx.procs, ctx.tools, server, bus, MEMORY_CLIENTS, MEMORY_PATTERNS_PER_CLIENT
            )
    except Failure as exc:
        return {**entry, "status": "failed", "reason": _first_line(exc), "detail": str(exc)}
    entry.update(mem.as_dict())
    entry["met_client"] = mem.per_client_bytes < report.TARGET_BYTES_PER_CLIENT
    entry["met_pattern"] = mem.per_pattern_bytes < report.TARGET_BYTES_PER_PATTERN
    ctx.say(
        f"  memory: {mem.per_client_bytes:,.0f} B/client, {mem.per_pattern_bytes:,.0f} B/pattern"
    )
    return entry


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into KeyboardInterrupt so every ``finally`` cleans up.

    SIGINT too: a shell starts background jobs with SIGINT ignored.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    sigs = (signal.SIGTERM, signal.SIGINT)
    try:
        old = {sig: signal.signal(sig, handler) for sig in sigs}
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def run_bench(options: BenchOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, run every scenario, write the JSON if asked; return the results."""
    programs = build_programs(options.cache_dir)
    tools = find_tools(programs, options.sbusd)
    workdir = Path(tempfile.mkdtemp(prefix="sbus-bench-", dir="/tmp"))
    (workdir / "logs").mkdir()
    results: dict[str, Any] = {
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "quick": options.quick,
            "messages": options.n_messages,
            "payload_bytes": 64,
            "repeat": options.n_repeat,
            "sbusd": list(tools.sbusd),
            "sbus_relay": list(tools.sbus_relay),
            "reference": report.REFERENCE,
            "reference_note": "C sbusd measured on this machine, quoted from the issue "
            "(midpoints of the quoted ranges)",
        },
        "scenarios": {},
    }
    ok = False
    try:
        with _signals_as_interrupt(), ProcessSet(workdir / "logs", child_env()) as procs:
            ctx = _Context(tools, procs, workdir, options, say, results)
            for sc in scenarios(options.n_messages):
                if options.only and sc.name not in options.only:
                    continue
                say(f"{sc.name}: {sc.title}")
                results["scenarios"][sc.name] = _throughput(ctx, sc)
            if not options.only or "latency" in options.only:
                say("latency")
                results["scenarios"]["latency"] = _latency(ctx)
            if not options.only or "memory" in options.only:
                say("memory")
                results["scenarios"]["memory"] = _memory(ctx)
            if options.profile_path is not None:
                from .profile import profile_one_to_one

                say(f"profile: py-spy on sbusd during 1 -> 1 -> {options.profile_path}")
                results["profile"] = profile_one_to_one(
                    procs,
                    tools,
                    workdir,
                    max(options.n_messages, 300_000),
                    options.profile_path,
                    ctx.idle_s,
                )
        ok = all(s["status"] == "ok" for s in results["scenarios"].values())
    finally:
        keep = options.keep or not ok
        if keep:
            results["meta"]["logs"] = str(workdir / "logs")
        if options.json_path is not None:
            options.json_path.write_text(json.dumps(results, indent=2) + "\n")
        if keep:
            say(f"server and load generator logs kept in {workdir / 'logs'}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return results
