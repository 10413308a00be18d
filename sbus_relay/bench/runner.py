"""Run every scenario of ``sbus-relay bench`` and collect the results.

What it owns: the order of the scenarios, their sides and repeats, and the
results with their meta.  What it may touch: the processes it starts, the JSON
it writes.

A scenario runs on two or more *sides*: ``ours`` (our sbusd, or our relay
path), and what it is compared with -- ``reference`` (the C sbusd, same
load), ``direct`` (the same load on our sbusd without the relay hop),
``clean`` (the same load without the stalled subscriber) or ``calm`` (the
same load without the clients that subscribe and unsubscribe all along).  The sides run
interleaved, A B A B ..., each run on a fresh server process, so drift in the
machine's speed hits every side alike; each side reports its medians.  A
scenario that fails is reported with its reason and the others still run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from sbus_relay import accel

from . import clientbench, continuity, fleet, report, rss
from .build import build_programs
from .procs import BenchProcessError, ProcessSet, rss_bytes
from .reference import Reference, resolve_reference
from .scenarios import (
    RSS_SETTLE,
    WILD_PATTERNS,
    Load,
    RunResult,
    Tools,
    child_env,
    drive,
    find_tools,
    measure_memory,
    new_address,
    relay_argv,
    relay_warmup,
    running_server,
    server_argv,
)

#: Defaults of the full run (a few minutes on 2 cores) and of ``--quick`` (~1 minute).
DEFAULT_MESSAGES = 100_000
DEFAULT_REPEAT = 3
QUICK_MESSAGES = 20_000
QUICK_REPEAT = 1
#: Keys of the round-robin key-cardinality scenario.
CYCLE_KEYS = 1_000
#: Subscribers of the wide fan-out, and how many times fewer messages it sends
#: (each message is delivered to every one of them).
WIDE_FANOUT = 100
WIDE_FANOUT_DIVISOR = 20
#: The churn scenario: subscription changes/s (a SUB or an UNSUB each, of
#: exact, prefix and wildcard patterns that match none of its keys) made by
#: this many other clients while one publisher cycles over CYCLE_KEYS keys.
CHURN_RATE = 1_000.0
CHURN_CLIENTS = 100
#: Idle clients x non-matching patterns each, in the idle-patterns scenario.
IDLE_CLIENTS = 100
IDLE_PATTERNS = 100
#: The crowd: connected clients, of which publishers + subscribers are active
#: (one publisher to one subscriber each), at a fixed total rate, for seconds.
#: Its figure is a tail latency, which one pause of the machine moves: over
#: CROWD_SECONDS a run takes 200,000 samples, so pauses that delay fewer than
#: 1 % of them (up to 200 ms in all) leave its p99 where it was; --quick runs
#: QUICK_CROWD_SECONDS (a smoke run: its p99 is mostly its start).
CROWD_CLIENTS = 1_000
CROWD_PAIRS = 50
CROWD_RATE = 10_000.0
CROWD_SECONDS = 20.0
QUICK_CROWD_SECONDS = 5.0
#: Interleaved runs per side, at least, of a scenario judged by a tail
#: latency (but with --quick): the median of 5 pairs stands two outliers.
TAIL_REPEAT = 5
#: Memory: idle clients (per-client cost), then clients x patterns (per-pattern cost).
MEMORY_CLIENTS = 1_000
MEMORY_PATTERN_CLIENTS = 100
MEMORY_PATTERNS_PER_CLIENT = 1_000
#: Messages of the profiled 1 -> 1 run, at least: enough samples for the top functions.
PROFILE_MESSAGES = 300_000
#: Seconds a subscriber waits for more after the last packet before giving up.
SUB_IDLE_SECONDS = 2.0
QUICK_SUB_IDLE_SECONDS = 1.0

Failure = (BenchProcessError, TimeoutError, OSError, ValueError)

SCENARIO_NAMES = (
    "one_key",
    "keys_1000",
    "1to1",
    "wildcards",
    "2to4",
    "1to100",
    "idle_patterns",
    "stalled",
    "churn",
    "clients_1000",
    "relay_up",
    "relay_down",
    "memory",
    "footprint",
    "upgrade",
    "restart",
    "client",
    "fleet",
)


@dataclass(frozen=True)
class BenchOptions:
    """What ``sbus-relay bench`` was asked to do."""

    quick: bool = False
    messages: int | None = None
    repeat: int | None = None
    json_path: Path | None = None
    profile_path: Path | None = None
    sbusd: tuple[str, ...] | None = None
    reference: Path | None = None
    reference_src: Path | None = None
    no_reference: bool = False
    cache_dir: Path | None = None
    keep: bool = False
    only: tuple[str, ...] = ()
    check: bool = False
    pure: bool = False  # our servers on the pure-Python path

    @property
    def n_messages(self) -> int:
        return self.messages or (QUICK_MESSAGES if self.quick else DEFAULT_MESSAGES)

    @property
    def n_repeat(self) -> int:
        return self.repeat or (QUICK_REPEAT if self.quick else DEFAULT_REPEAT)


@dataclass(frozen=True)
class Scenario:
    """A throughput scenario: the load, and which sides run it."""

    name: str
    title: str
    load: Load
    compare: str = "reference"  # the side ours is divided by: reference, direct, clean, calm
    relay: str = ""  # "up": publisher on the relay; "down": subscriber on the relay
    #: judged by a tail latency: at least TAIL_REPEAT runs per side
    tail: bool = False

    @property
    def sides(self) -> tuple[str, ...]:
        """Every side that runs it, interleaved in this order."""
        if self.compare == "reference":
            return ("ours", "reference")
        if self.compare == "clean":  # the reference runs it too: it stalls
            return ("ours", "clean", "reference")
        return ("ours", self.compare)


@dataclass
class _Context:
    tools: Tools
    procs: ProcessSet
    workdir: Path
    options: BenchOptions
    say: Callable[[str], None]

    @property
    def idle_s(self) -> float:
        return QUICK_SUB_IDLE_SECONDS if self.options.quick else SUB_IDLE_SECONDS


def scenarios(messages: int, quick: bool = False) -> list[Scenario]:
    """The throughput scenarios, in the order they are run."""
    crowd_seconds = QUICK_CROWD_SECONDS if quick else CROWD_SECONDS
    crowd = Load(
        int(CROWD_RATE * crowd_seconds),
        pub_conns=CROWD_PAIRS,
        sub_conns=CROWD_PAIRS,
        each=True,
        rate=CROWD_RATE,
        idle_clients=CROWD_CLIENTS - 2 * CROWD_PAIRS,
        idle_patterns=1,
    )
    return [
        Scenario("one_key", "1 -> 1, one key", Load(messages, keymode="fixed")),
        Scenario(
            "keys_1000",
            f"1 -> 1, {CYCLE_KEYS:,} keys round-robin",
            Load(messages, keymode="cycle", keys=CYCLE_KEYS),
        ),
        Scenario("1to1", "1 -> 1, a distinct key per message", Load(messages)),
        Scenario(
            "wildcards",
            "1 -> 1, wildcard, prefix and secret patterns",
            Load(messages, keymode="wild", patterns=WILD_PATTERNS),
        ),
        Scenario("2to4", "2 -> 4 fan-out", Load(messages, publishers=2, subscribers=4)),
        Scenario(
            "1to100",
            f"1 -> {WIDE_FANOUT} fan-out",
            Load(max(1, messages // WIDE_FANOUT_DIVISOR), sub_conns=WIDE_FANOUT),
        ),
        Scenario(
            "idle_patterns",
            f"1 -> 2, {IDLE_CLIENTS} idle clients x {IDLE_PATTERNS} patterns",
            Load(messages, subscribers=2, idle_clients=IDLE_CLIENTS, idle_patterns=IDLE_PATTERNS),
        ),
        Scenario(
            "stalled",
            "1 -> 1 + 1 subscriber that never reads",
            Load(messages, stalled=1),
            "clean",
        ),
        Scenario(
            "churn",
            f"1 -> 1, {CYCLE_KEYS:,} keys, {CHURN_RATE:,.0f} changes/s beside",
            Load(
                messages,
                keymode="cycle",
                keys=CYCLE_KEYS,
                churn=CHURN_RATE,
                churn_clients=CHURN_CLIENTS,
            ),
            "calm",
        ),
        Scenario(
            "clients_1000",
            f"{CROWD_CLIENTS:,} clients, {2 * CROWD_PAIRS} active, {CROWD_RATE:,.0f} msg/s",
            crowd,
            tail=True,
        ),
        Scenario(
            "relay_up", "relay -> master (pub on relay)", Load(messages), "direct", relay="up"
        ),
        Scenario(
            "relay_down", "master -> relay (sub on relay)", Load(messages), "direct", relay="down"
        ),
    ]


class _Unavailable(Exception):
    """The scenario cannot run here (e.g. the relay does not start)."""


def _run_side(ctx: _Context, sc: Scenario, side: str) -> RunResult:
    """One run of ``sc`` on ``side``, on fresh servers."""
    load = sc.load
    if side == "clean":
        load = dataclasses.replace(load, stalled=0)
    elif side == "calm":
        load = dataclasses.replace(load, churn=0.0, churn_clients=0)
    kind = "reference" if side == "reference" else "ours"
    bus = new_address(ctx.workdir, "ref" if kind == "reference" else "bus")
    with running_server(ctx.procs, kind, server_argv(ctx.tools, kind, bus), bus) as server:
        if side != "ours" or not sc.relay:
            return drive(
                ctx.procs,
                ctx.tools,
                load,
                bus,
                bus,
                [server],
                ctx.idle_s,
                literal_secrets=kind == "reference",
            )
        relay = new_address(ctx.workdir, "relay")
        pub_at, sub_at = (relay, bus) if sc.relay == "up" else (bus, relay)
        try:
            relay_server = running_server(
                ctx.procs, "relay", relay_argv(ctx.tools, relay, bus), relay
            )
            with relay_server as relay_child:
                return drive(
                    ctx.procs,
                    ctx.tools,
                    load,
                    pub_at,
                    sub_at,
                    [server, relay_child],
                    ctx.idle_s,
                    before_publish=lambda: relay_warmup(pub_at, sub_at),
                )
        except Failure as exc:
            raise _Unavailable(str(exc)) from exc


def _side_summary(runs: list[RunResult]) -> dict[str, Any]:
    med = report.median
    return {
        "median": med([r.rate for r in runs]),
        "p50_us": med([r.lat_p50_us for r in runs]),
        "p99_us": med([r.lat_p99_us for r in runs]),
        "cpu_us_per_delivery": med([r.cpu_us_per_delivery for r in runs]),
        "load_cpu_us_per_delivery": med([r.load_cpu_us_per_delivery for r in runs]),
        "rss_bytes": med([r.rss_bytes for r in runs]),
        "delivered": min(r.delivered for r in runs),
        "expected": runs[-1].expected,
        "lost": max(r.expected - r.delivered for r in runs),
        "stalled": any(r.stalled for r in runs),
        "churn_per_s": med([r.churn_per_s for r in runs]),
        "runs": [r.as_dict() for r in runs],
    }


def _throughput(ctx: _Context, sc: Scenario, reference: Reference) -> dict[str, Any]:
    entry: dict[str, Any] = {"title": sc.title, "unit": "deliveries/s", "status": "ok"}
    # At a fixed rate every side delivers the same: the latency is the figure.
    entry["fixed_rate"] = sc.load.rate > 0
    sides = [s for s in sc.sides if s != "reference" or reference.path is not None]
    if "reference" in sc.sides and reference.path is None:
        entry["reference_left_out"] = reference.reason
    runs: dict[str, list[RunResult]] = {side: [] for side in sides}
    repeat = ctx.options.n_repeat
    if sc.tail and not ctx.options.quick:
        repeat = max(repeat, TAIL_REPEAT)
        entry["repeat"] = repeat
        entry["latency_samples"] = sc.load.messages  # per run and side
    try:
        for i in range(repeat):
            for side in sides:
                run = _run_side(ctx, sc, side)
                runs[side].append(run)
                state = " (stalled)" if run.stalled else ""
                ctx.say(
                    f"  {sc.name} #{i + 1} {side}: {run.rate:,.0f}/s "
                    f"({run.delivered}/{run.expected}){state}"
                )
    except _Unavailable as exc:
        return {**entry, "status": "unavailable", "reason": _first_line(exc)}
    except Failure as exc:
        return {**entry, "status": "failed", "reason": _first_line(exc), "detail": str(exc)}
    entry["sides"] = {side: _side_summary(r) for side, r in runs.items()}
    entry["compare"] = sc.compare
    report.evaluate(sc.name, entry)
    return entry


def _memory_side(ctx: _Context, kind: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for phase, clients, per_client in (
        ("clients", MEMORY_CLIENTS, 0),
        ("patterns", MEMORY_PATTERN_CLIENTS, MEMORY_PATTERNS_PER_CLIENT),
    ):
        bus = new_address(ctx.workdir, "mem")
        argv = server_argv(ctx.tools, kind, bus)
        with running_server(ctx.procs, kind, argv, bus) as server:
            mem = measure_memory(ctx.procs, ctx.tools, server, bus, clients, per_client)
        result[phase] = mem.as_dict()
        if phase == "clients":
            result["per_client_bytes"] = mem.per_client_bytes
        else:
            result["per_pattern_bytes"] = mem.per_pattern_bytes
    return result


def _memory_median(sides: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median cost per client, with the median cost per pattern;
    every run's figures are kept beside them."""
    by_client = sorted(sides, key=lambda side: float(side["per_client_bytes"]))
    by_pattern = sorted(sides, key=lambda side: float(side["per_pattern_bytes"]))
    middle = len(sides) // 2
    return {
        "clients": by_client[middle]["clients"],
        "per_client_bytes": by_client[middle]["per_client_bytes"],
        "patterns": by_pattern[middle]["patterns"],
        "per_pattern_bytes": by_pattern[middle]["per_pattern_bytes"],
        "runs": sides,
    }


def _memory(ctx: _Context, reference: Reference) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "title": "memory",
        "status": "ok",
        "clients": MEMORY_CLIENTS,
        "patterns": MEMORY_PATTERN_CLIENTS * MEMORY_PATTERNS_PER_CLIENT,
    }
    kinds = ["ours"] + (["reference"] if reference.path is not None else [])
    if reference.path is None:
        entry["reference_left_out"] = reference.reason
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    try:
        for _ in range(ctx.options.n_repeat):  # interleaved, like the throughput runs
            for kind in kinds:
                runs[kind].append(_memory_side(ctx, kind))
    except Failure as exc:
        return {**entry, "status": "failed", "reason": _first_line(exc), "detail": str(exc)}
    entry["sides"] = {kind: _memory_median(sides) for kind, sides in runs.items()}
    for kind, side in entry["sides"].items():
        ctx.say(
            f"  memory {kind}: {side['per_client_bytes']:,.0f} B/client, "
            f"{side['per_pattern_bytes']:,.0f} B/pattern"
        )
    report.evaluate("memory", entry)
    return entry


def _footprint(ctx: _Context) -> dict[str, Any]:
    """An idle relay's RSS (connected to its master, medians of the runs) beside
    its floor: what the libraries it imports cost in a fresh interpreter."""
    entry: dict[str, Any] = {"title": "footprint", "status": "ok"}
    env = dict(ctx.procs.env or os.environ)
    relays: list[float] = []
    floors: list[dict[str, dict[str, int]]] = []
    try:
        for _ in range(ctx.options.n_repeat):  # interleaved, like the throughput runs
            master = new_address(ctx.workdir, "fmaster")
            relay = new_address(ctx.workdir, "frelay")
            with (
                running_server(ctx.procs, "ours", server_argv(ctx.tools, "ours", master), master),
                running_server(
                    ctx.procs, "relay", relay_argv(ctx.tools, relay, master), relay
                ) as relay_child,
            ):
                relay_warmup(relay, master)
                time.sleep(RSS_SETTLE)
                relays.append(rss_bytes(relay_child.pid))
            floors.append(rss.import_floor(env))
    except (*Failure, subprocess.SubprocessError) as exc:
        return {**entry, "status": "failed", "reason": _first_line(exc)}
    med = report.median
    entry["idle_relay_rss"] = int(med(relays))
    entry["floor"] = {k: int(med([f["floor"][k] for f in floors])) for k in floors[0]["floor"]}
    entry["on_demand"] = {
        k: int(med([f["on_demand"][k] for f in floors])) for k in floors[0]["on_demand"]
    }
    entry["runs"] = {"idle_relay_rss": relays, "imports": floors}
    ctx.say(f"  idle relay: {entry['idle_relay_rss'] / 2**20:.1f} MiB")
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


def _meta(options: BenchOptions, tools: Tools, reference: Reference) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "quick": options.quick,
        "check": options.check,
        "only": list(options.only) or None,
        "messages": options.n_messages,
        "payload_bytes": 64,
        "repeat": options.n_repeat,
        # what ran, never where: a run's file is read on other machines
        "sbusd": [portable(arg) for arg in tools.sbusd],
        "sbus_relay": [portable(arg) for arg in tools.sbus_relay],
        "reference": portable(str(reference.path), 2) if reference.path else None,
        "reference_source": portable(reference.source) if reference.source else None,
        "reference_left_out": reference.reason or None,
        "load_before": round(os.getloadavg()[0], 2),
        "hot_path": _hot_path(options),
    }


def portable(arg: str, keep: int = 1) -> str:
    """A command-line word as a run's file keeps it: an absolute path by its
    last ``keep`` parts (a program's name; the reference build's cache key
    and name), anything else as it is."""
    if not os.path.isabs(arg):
        return arg
    return "/".join(Path(arg).parts[-keep:])


def _hot_path(options: BenchOptions) -> str:
    """Which path our servers run (they inherit this process's environment)."""
    if options.sbusd:
        return "unknown (--sbusd)"
    if options.pure:
        return "pure Python (--pure)"
    return accel.mode()


def run_bench(options: BenchOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, run every scenario, write the JSON if asked; return the results."""
    programs = build_programs(options.cache_dir)
    reference = resolve_reference(
        options.reference, options.no_reference, options.cache_dir, options.reference_src
    )
    if reference.path is None:
        say(f"reference sbusd: {reference.reason}; its column is left out")
    else:
        say(f"reference sbusd: {reference.path}")
    tools = find_tools(programs, options.sbusd, reference.path)
    workdir = Path(tempfile.mkdtemp(prefix="sbus-bench-", dir="/tmp"))
    (workdir / "logs").mkdir()
    results: dict[str, Any] = {"meta": _meta(options, tools, reference), "scenarios": {}}
    ok = False
    try:
        env = child_env()
        if options.pure:
            env[accel.PURE_PYTHON_ENV] = "1"
        say(f"our servers: the {results['meta']['hot_path']} hot path")
        with _signals_as_interrupt(), ProcessSet(workdir / "logs", env) as procs:
            ctx = _Context(tools, procs, workdir, options, say)
            for sc in scenarios(options.n_messages, options.quick):
                if options.only and sc.name not in options.only:
                    continue
                say(f"{sc.name}: {sc.title}")
                results["scenarios"][sc.name] = _throughput(ctx, sc, reference)
            if not options.only or "memory" in options.only:
                say("memory")
                results["scenarios"]["memory"] = _memory(ctx, reference)
            if not options.only or "footprint" in options.only:
                say("footprint")
                results["scenarios"]["footprint"] = _footprint(ctx)
            continuous = (("upgrade", continuity.upgrade), ("restart", continuity.restart))
            for name, run in (*continuous, ("fleet", fleet.run)):
                if not options.only or name in options.only:
                    say(name)
                    entry = run(tools, procs, workdir, options.quick, say)
                    report.evaluate(name, entry)
                    results["scenarios"][name] = entry
            if not options.only or "client" in options.only:
                say("client")
                entry = clientbench.run(tools, procs, workdir, options, say)
                report.evaluate("client", entry)
                results["scenarios"]["client"] = entry
            if options.profile_path is not None:
                from .profile import profile_one_to_one

                say(f"profile: py-spy on our sbusd during 1 -> 1 -> {options.profile_path}")
                messages = max(options.n_messages, PROFILE_MESSAGES)
                try:
                    results["profile"] = profile_one_to_one(
                        procs, tools, workdir, messages, options.profile_path, ctx.idle_s
                    )
                except Failure as exc:
                    results["profile"] = {"status": "failed", "reason": _first_line(exc)}
                if results["profile"]["status"] != "ok":
                    say(f"profile: {results['profile']['reason']}")
        ok = all(s["status"] == "ok" for s in results["scenarios"].values())
        results["meta"]["load_after"] = round(os.getloadavg()[0], 2)
        results["targets"] = report.all_verdicts(results)
        results["summary"] = report.summarize(results["targets"])
    finally:
        ran = results["scenarios"]  # in the order of SCENARIO_NAMES, whatever order they ran in
        results["scenarios"] = {name: ran[name] for name in SCENARIO_NAMES if name in ran}
        keep = options.keep or not ok
        if keep:
            results["meta"]["logs"] = portable(str(workdir / "logs"), 2)
        if options.json_path is not None:
            options.json_path.write_text(json.dumps(results, indent=2) + "\n")
        if keep:
            say(f"server and load generator logs kept in {workdir / 'logs'}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return results
