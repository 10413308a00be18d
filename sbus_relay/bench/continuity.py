"""Traffic across a live upgrade and across a master restart, measured.

What it owns: the upgrade and restart scenarios: their tree of buses, their
load and figures.  What it may touch: the processes it starts (procs), our
buses' signals.

Both runs use the same tree: a master and two relays below it, the C load
generator's clients (plain ``send``/``recv``, as a drop-in client of the
reference library is) publishing on relay A and on the master at a fixed
rate, and subscribing on the master and on relay B, so that every message
crosses at least one relay.  Each message carries its publisher's sequence
number: a lost, duplicated or reordered one is counted.

``upgrade``: SIGUSR2 to the master, then to relay A, in the middle of the
traffic.  The figures are the messages lost, duplicated or reordered (the
promise is none) and the longest hand-over, from the old process's freeze to
the new one's confirmation (its ``upgrade.handed_over`` log line).

``restart``: the master is stopped and a new one started on the same
address.  The figures are the messages lost (those published while no master
ran, plus those in flight) and how long after the new master listens the
relays are ready again (their ``upstream.ready`` log lines).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sbus_relay.ops.supervisor import listener_pid

from .procs import BenchProcessError, Child, ProcessSet
from .scenarios import (
    KEY_PREFIX,
    PATTERN,
    Tools,
    new_address,
    relay_argv,
    relay_warmup,
    running_server,
    server_argv,
)

#: Messages per second of each of the two publishers.
RATE = 5_000
#: Seconds of traffic per run (the signals come a third and two thirds in).
SECONDS = 8.0
QUICK_SECONDS = 4.0
#: Seconds a subscriber waits for more before it reports: longer than a restart's gap.
SUB_IDLE = 5.0
#: Seconds an upgrade or a restart may take before the run is a failure.
SWITCH_TIMEOUT = 30.0
#: Seconds a load generator may take to say it is ready.
READY_TIMEOUT = 20.0


def upgrade(
    tools: Tools, procs: ProcessSet, workdir: Path, quick: bool, say: Callable[[str], None]
) -> dict[str, Any]:
    """The ``upgrade`` scenario's entry."""
    entry: dict[str, Any] = {"title": "live upgrade of the master and a relay under load"}

    def switch(tree: _Tree) -> None:
        entry["handover_ms"] = []
        for name in ("master", "relay_a"):
            address, child = tree.address[name], tree.child[name]
            os.kill(child.pid, signal.SIGUSR2)
            tree.successors.append(address)
            _wait(partial(_events, child, "upgrade.handed_over"), f"hand-over of the {name}")
            handed = _events(child, "upgrade.handed_over")[-1]
            entry["handover_ms"].append(round(handed["seconds"] * 1000, 1))

    where = (("relay_a", "master"), ("master", "relay_b"))
    return _run(entry, tools, procs, workdir, quick, switch, where, say)


def restart(
    tools: Tools, procs: ProcessSet, workdir: Path, quick: bool, say: Callable[[str], None]
) -> dict[str, Any]:
    """The ``restart`` scenario's entry."""
    entry: dict[str, Any] = {"title": "master restart under load, relays recovering"}

    def switch(tree: _Tree) -> None:
        master = tree.child["master"]
        master.stop()
        again = procs.start("master2", server_argv(tools, "ours", tree.address["master"]))
        tree.extra.append(again)
        _wait(lambda: _events(again, "listening"), "the new master's listening line")
        since = _when(_events(again, "listening")[-1])
        ready = []
        for name in ("relay_a", "relay_b"):
            child = tree.child[name]
            _wait(partial(_ready_since, child, since), f"{name} ready again")
            ready.append(round(((_ready_since(child, since) or since) - since) * 1000, 1))
        entry["relays_ready_ms"] = ready

    # a restart disconnects the master's own clients: only the relays' are measured
    where = (("relay_a",), ("relay_b",))
    return _run(entry, tools, procs, workdir, quick, switch, where, say)


class _Tree:
    """The servers of one run, by role."""

    def __init__(self) -> None:
        self.address: dict[str, str] = {}
        self.child: dict[str, Child] = {}
        self.extra: list[Child] = []  # started during the run (a restarted master)
        self.successors: list[str] = []  # addresses now served by an upgraded process


def _run(
    entry: dict[str, Any],
    tools: Tools,
    procs: ProcessSet,
    workdir: Path,
    quick: bool,
    switch: Callable[[_Tree], None],
    where: tuple[tuple[str, ...], tuple[str, ...]],
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Publishers at ``where[0]``, subscribers at ``where[1]``; ``switch`` a third in."""
    pub_at, sub_at = where
    seconds = QUICK_SECONDS if quick else SECONDS
    per_pub = int(RATE * seconds)
    tree = _Tree()
    for name in ("master", "relay_a", "relay_b"):
        tree.address[name] = new_address(workdir, name.replace("_", ""))
    master = tree.address["master"]
    published = per_pub * len(pub_at)
    entry.update(status="ok", rate=RATE * len(pub_at), seconds=seconds, published=published)
    try:
        with (
            running_server(procs, "master", server_argv(tools, "ours", master), master) as m,
            running_server(
                procs, "relay_a", relay_argv(tools, tree.address["relay_a"], master),
                tree.address["relay_a"],
            ) as a,
            running_server(
                procs, "relay_b", relay_argv(tools, tree.address["relay_b"], master),
                tree.address["relay_b"],
            ) as b,
        ):  # fmt: skip
            tree.child.update(master=m, relay_a=a, relay_b=b)
            for relay in ("relay_a", "relay_b"):
                relay_warmup(tree.address[relay], master)
            subs = [
                procs.start(f"sub_{at}", _sub_argv(tools, tree.address[at], published))
                for at in sub_at
            ]
            for sub in subs:
                sub.expect("ready", READY_TIMEOUT)
            time.sleep(0.5)  # the subscriptions reach every bus of the tree
            pubs = [
                procs.start(f"pub_{at}", _pub_argv(tools, tree.address[at], per_pub, i), stdin=True)
                for i, at in enumerate(pub_at)
            ]
            for pub in pubs:
                pub.expect("ready", READY_TIMEOUT)
            for pub in pubs:
                pub.tell("go")
            time.sleep(seconds / 3)
            switch(tree)
            for pub in pubs:
                pub.result(seconds * 3 + SWITCH_TIMEOUT)
            got = [sub.result(seconds * 3 + SWITCH_TIMEOUT + SUB_IDLE) for sub in subs]
    except (BenchProcessError, TimeoutError, OSError, ValueError) as exc:
        return {**entry, "status": "failed", "reason": (str(exc) or type(exc).__name__)}
    finally:
        for child in tree.extra:
            child.stop()
        for address in tree.successors:  # not our children: stopped by their pid
            pid = listener_pid(address)
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
    expected = published * len(got)
    entry["delivered"] = sum(r["count"] for r in got)
    entry["expected"] = expected
    entry["lost"] = expected - entry["delivered"]
    entry["gaps"] = sum(r["gaps"] for r in got)
    entry["reordered"] = sum(r["reordered"] for r in got)
    say(
        f"  {entry['delivered']:,} of {expected:,} delivered, {entry['gaps']} "
        f"{'gap' if entry['gaps'] == 1 else 'gaps'}, "
        f"{entry['reordered']} duplicated or reordered"
        + (f", hand-over {entry['handover_ms']} ms" if "handover_ms" in entry else "")
        + (f", relays ready {entry['relays_ready_ms']} ms" if "relays_ready_ms" in entry else "")
    )
    # the spread of a longest wait is that of the waits it is the longest of
    if "handover_ms" in entry:
        entry["handover_max_ms"] = max(entry["handover_ms"])
        entry["lost_or_reordered"] = entry["lost"] + entry["reordered"]
        entry["per_run"] = {"handover_max_ms": entry["handover_ms"]}
    if "relays_ready_ms" in entry:
        entry["relays_ready_max_ms"] = max(entry["relays_ready_ms"])
        entry["per_run"] = {"relays_ready_max_ms": entry["relays_ready_ms"]}
    return entry


def _sub_argv(tools: Tools, address: str, messages: int) -> list[str]:
    options = ("-n", str(messages), "-c", "1", "-t", str(SUB_IDLE), "-p", PATTERN)
    return [str(tools.loadgen), "sub", "-a", address, *options]


def _pub_argv(tools: Tools, address: str, messages: int, publisher: int) -> list[str]:
    load = ("-n", str(messages), "-c", "1", "-s", "64", "-r", str(RATE))
    keys = ("-k", KEY_PREFIX, "-x", "distinct", "-i", str(publisher), "-w")
    return [str(tools.loadgen), "pub", "-a", address, *load, *keys]


def _wait(done: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + SWITCH_TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {SWITCH_TIMEOUT:g} s")
        time.sleep(0.005)


def _events(child: Child, name: str) -> list[dict[str, Any]]:
    """The JSON log lines named ``name`` in a server's stderr (its successor's too)."""
    if child.stderr_path is None or not child.stderr_path.exists():
        return []
    found = []
    for line in child.stderr_path.read_text(errors="replace").splitlines():
        if f'"{name}"' in line:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == name:
                found.append(event)
    return found


def _when(event: dict[str, Any]) -> float:
    stamp = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
    return stamp.timestamp()


def _ready_since(child: Child, since: float) -> float | None:
    """When the relay's link was last ready, if that was after ``since`` (less a margin
    for the log's clock: both lines come from one machine's clock)."""
    times = [_when(e) for e in _events(child, "upstream.ready")]
    later = [t for t in times if t >= since - 0.5]
    return later[-1] if later else None
