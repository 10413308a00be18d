"""Chaos: a tree of buses under steady traffic and a seeded series of faults.

A master ``m`` with relays ``a`` and ``b``, and ``c`` a relay of ``a``; each
bus a real ``sbus-relay serve`` with metrics and its own ``-C`` file.  On every
bus one publisher sends ``s/<bus>/<seq>`` at a steady rate and one subscriber
takes ``s/``, so every bus's traffic crosses every link of the tree (16 flows,
four of them local).  Meanwhile, one at a time, with quiet gaps between them,
the faults a running tree meets, drawn from ``random.Random(seed)``:

* ``upgrade``: SIGUSR2 to a bus; it hands itself to a new process;
* ``reload`` / ``bad_reload``: a good ``-C`` file (new limits), or one with an
  error, and SIGHUP; the bad one is refused and the good one put back;
* ``kill``: SIGKILL and a restart (``-r``), clients and relays reconnect;
* ``pause``: SIGSTOP for up to 2.5 s, then SIGCONT;
* ``flood``: a client publishes 1 KiB messages as fast as it can for a few
  seconds to a client of another bus that never reads;
* ``slow_reader``: a client of ``s/`` that reads one packet per 5 ms;
* ``compound``: a pause or a flood, and in the middle of it an upgrade, a
  reload or a kill (of the same bus or another).

Each fault's *window* runs from a little before it (``BEFORE``: packets in
flight) until everything it disturbed has settled (``SETTLE`` after it ends).
What is checked, per flow:

* every message published outside every fault window arrives, exactly once;
* nothing arrives twice or out of order, in a window or not;
* a message lost in a window is either lost *with a killed bus on its path*
  (inside the dead process or its socket buffers: the protocol has no
  acknowledgements, so nobody can count it), or it is counted by a bus: the
  window's losses of that kind are at most the drops the buses counted in it
  (``sbus_messages_dropped_total``, all buses, all incarnations), less the
  drops of the flood's and slow reader's own clients (they ask ``drops/count``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from sbus_relay.ops.addresses import parse_address
from sbus_relay.ops.supervisor import listener_pid

from .common import Closed, cleanup_dir, connect_retry, is_listening, short_dir
from .faultrun import (
    START_WAIT,
    FaultRun,
    Publisher,
    RunBus,
    Subscriber,
    Window,
    arrivals,
    drops_of,
    flood,
    flows,
    for_a_while,
    identity_cuts,
    log_failures,
    slow_reader,
    unseen,
    warm_up,
)

#: The tree: each bus and its upstream.
TREE = {"m": None, "a": "m", "b": "m", "c": "a"}
#: Seconds after a fault ends before its window closes (reconnects, resubscribes).
SETTLE = 2.0
#: Quiet gaps between faults, seconds (at least one message per flow each).
GAP = (1.0, 4.0)
KINDS = ("upgrade", "reload", "bad_reload", "kill", "pause", "flood", "slow_reader", "compound")
PAYLOAD = b"x" * 64


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def path_between(src: str, dst: str) -> set[str]:
    """The buses a message from ``src``'s client to ``dst``'s passes through."""

    def up(bus: str) -> list[str]:
        chain = [bus]
        while TREE[chain[-1]] is not None:
            chain.append(TREE[chain[-1]])  # type: ignore[arg-type]
        return chain

    a, b = up(src), up(dst)
    common = next(x for x in a if x in b)
    return set(a[: a.index(common) + 1]) | set(b[: b.index(common) + 1])


class TreeBus(RunBus):
    """One bus of the tree; its drop counters summed over the incarnations a kill ended."""

    def __init__(self, name: str, workdir: str, upstream: TreeBus | None) -> None:
        super().__init__(
            name,
            os.path.join(workdir, f"{name}.sock"),
            os.path.join(workdir, f"{name}.yaml"),
            os.path.join(workdir, f"{name}.log"),
            _free_port(),
        )
        self.upstream = upstream
        #: drops counted by incarnations that were killed, and by the live one
        self.drops_done: collections.Counter[str] = collections.Counter()
        self.drops_now: collections.Counter[str] = collections.Counter()
        self.start()

    def argv(self) -> list[str]:
        argv = self.serve_argv()
        if self.upstream is not None:
            argv += ["--upstream", self.upstream.address]
        return argv

    def scrape(self) -> bool:
        """Read this incarnation's drop counters from /metrics; False if it did not answer."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=3) as response:
                text = response.read().decode()
        except OSError:
            return False
        drops: collections.Counter[str] = collections.Counter()
        for line in text.splitlines():
            if line.startswith("sbus_messages_dropped_total{"):
                labels, _, value = line.rpartition(" ")
                reason = labels.split('reason="', 1)[1].split('"', 1)[0]
                drops[reason] += int(float(value))
        self.drops_now = drops
        return True

    def drops(self) -> collections.Counter[str]:
        return self.drops_done + self.drops_now

    def upgrade(self) -> bool:
        """SIGUSR2; True once a new process serves (within ``START_WAIT``)."""
        old = self.pid
        os.kill(old, signal.SIGUSR2)
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline:
            pid = listener_pid(parse_address(self.address))
            if pid and pid != old:
                self.pid = pid
                self.pids.add(pid)
                return True
            time.sleep(0.05)
        return False

    def kill_and_restart(self) -> float:
        """SIGKILL, then start again (``-r``); when it was killed."""
        killed = self.kill()
        self.drops_done += self.drops_now
        self.drops_now = collections.Counter()
        self.start()
        return killed

    def stop(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


class TreePublisher(Publisher):
    """Publishes ``s/<bus>/<seq>`` at ``rate``."""

    def __init__(self, bus: TreeBus, rate: float) -> None:
        name = bus.name.encode()
        super().__init__(bus, rate, lambda seq: (b"s/%s/%d" % (name, seq), PAYLOAD))


class TreeSubscriber(Subscriber):
    """Takes ``s/`` on one bus; the origin and sequence number are in the key."""

    def __init__(self, bus: TreeBus) -> None:
        super().__init__(bus, [b"s/"], b"s/")

    def take(self, packet: bytes) -> None:
        key = packet[6 : packet.index(b"\0")]
        src, _, seq = key.partition(b"/")
        if src == b"warm":
            self.warm.add(seq.decode())
        else:
            self.record(src.decode(), int(seq))


@dataclass
class Fault(Window):
    settle: float = SETTLE
    drops_before: int = 0
    drops_after: int = 0
    #: messages lost with a killed bus, per flow and before or after the kill
    lost_by_place: collections.Counter[str] = field(default_factory=collections.Counter)


class Chaos(FaultRun):
    KINDS = KINDS
    GAP = GAP
    TAIL = 8.0

    def __init__(self, seed: int, rate: float) -> None:
        super().__init__(seed)
        self.workdir = short_dir()
        self.buses: dict[str, TreeBus] = {}
        try:
            for name, up in TREE.items():
                self.buses[name] = TreeBus(name, self.workdir, self.buses[up] if up else None)
        except BaseException:
            for bus in self.buses.values():
                bus.stop()
            raise
        self.subs: dict[str, TreeSubscriber] = {n: TreeSubscriber(b) for n, b in self.buses.items()}
        self.pubs = {n: TreePublisher(b, rate) for n, b in self.buses.items()}
        self.faults: list[Fault] = []

    def total_drops(self) -> int:
        for bus in self.buses.values():
            bus.scrape()
        return sum(sum(b.drops().values()) for b in self.buses.values())

    def warm_up(self) -> None:
        warm_up(
            self.subs.values(), dict(self.buses), lambda name: (b"s/warm/" + name.encode(), b""),
            timeout=30.0, pause=0.1,
        )  # fmt: skip

    # --- the faults --------------------------------------------------------------

    def do(self, kind: str) -> Fault:
        """One fault (a ``compound`` is a pause or a flood with an upgrade, a
        reload or a kill in the middle of it); its window's figures recorded."""
        rng = self.rng
        name = rng.choice(sorted(TREE))
        fault = Fault(kind, name, time.monotonic(), drops_before=self.total_drops())
        fault.start = time.monotonic()
        if kind == "compound":
            back = rng.choice(("pause", "flood"))
            front, front_bus = (
                rng.choice(("upgrade", "reload", "bad_reload", "kill")),
                rng.choice(sorted(TREE)),
            )
            fault.kind = f"{back}+{front}"
            fault.target = f"{name}+{front_bus}"
            plan = self._plan(back)
            behind = threading.Thread(target=self._act, args=(back, name, plan, fault))
            behind.start()
            time.sleep(rng.uniform(0.1, 0.8))
            self._act(front, front_bus, self._plan(front), fault)
            behind.join(120)
        else:
            self._act(kind, name, self._plan(kind), fault)
        fault.end = time.monotonic()
        time.sleep(SETTLE)
        fault.drops_after = self.total_drops()
        self.faults.append(fault)
        return fault

    def _plan(self, kind: str) -> dict[str, Any]:
        """A fault's random parameters, drawn here so that the seed decides them."""
        rng = self.rng
        if kind == "pause":
            return {"seconds": rng.uniform(0.2, 2.5)}
        if kind == "flood":
            return {"seconds": rng.uniform(0.5, 2.5), "victim": rng.choice(sorted(TREE))}
        if kind == "slow_reader":
            return {"seconds": rng.uniform(1.0, 4.0)}
        if kind in ("reload", "bad_reload"):
            return {"variant": self.next_variant()}
        return {}

    def _act(self, kind: str, name: str, plan: dict[str, Any], fault: Fault) -> None:
        bus = self.buses[name]
        if kind == "upgrade":
            fault.detail.setdefault("upgraded", True)
            fault.detail["upgraded"] &= bus.upgrade()
        elif kind in ("reload", "bad_reload"):
            bus.reload(good=kind == "reload", variant=plan["variant"])
        elif kind == "kill":
            fault.detail["killed"] = name
            fault.detail["killed_at"] = bus.kill_and_restart()
        elif kind == "pause":
            pid = bus.pid

            def resume() -> None:
                with contextlib.suppress(ProcessLookupError):  # killed meanwhile
                    os.kill(pid, signal.SIGCONT)

            for_a_while(lambda: os.kill(pid, signal.SIGSTOP), resume, plan["seconds"])
        elif kind == "flood":
            fault.detail["victim"] = plan["victim"]
            fault.detail.update(self._flood(bus, self.buses[plan["victim"]], plan["seconds"]))
            fault.own(fault.detail["victim_drops"])
        elif kind == "slow_reader":
            fault.detail.update(slow_reader(bus.address, b"s/", plan["seconds"]))
            fault.own(fault.detail["reader_drops"])

    def _flood(self, at: TreeBus, victim_at: TreeBus, seconds: float) -> dict[str, Any]:
        """Flood a client that never reads; its drops (None: its bus was killed
        meanwhile, so they are unknown)."""
        sent = 0
        drops: int | None = None
        victim = connect_retry(victim_at.address, timeout=30.0)
        try:
            victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            victim.sub(b"f/")
            victim.sync()
            time.sleep(0.2)  # its pattern reaches the other buses
            sent = flood(at.address, b"f/x", seconds)  # (until its bus is killed, in a compound)
            time.sleep(0.5)
            victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            drops, _ = drops_of(victim, timeout=60.0)
        except (Closed, OSError):
            pass
        finally:
            victim.close()
        return {"flood_sent": sent, "victim_drops": drops}

    # --- the run -------------------------------------------------------------------

    def finished(self) -> None:
        self.gone = [n for n, b in self.buses.items() if not b.serving()]

    def stop(self) -> None:
        self.stop_clients()
        for bus in self.buses.values():
            bus.stop()


def check(chaos: Chaos) -> dict[str, Any]:
    """Compare what arrived with what was sent, flow by flow, window by window."""
    faults = chaos.faults
    failures: list[str] = []
    sent_total = arrived = duplicates = reordered = 0
    quiet_sent = quiet_lost = 0
    #: lost with a killed bus: (killed bus is an end of the flow or between them,
    #: published before the kill or after it)
    lost_with_kill: collections.Counter[str] = collections.Counter()
    lost_in_window: collections.Counter[int] = collections.Counter()
    examples: list[str] = []
    for flow in flows(chaos):
        src, dst = flow.src, flow.dst
        sent_total += len(flow.times)
        arrived += len(flow.got)
        quiet_sent += flow.placed.count(None)
        _, disorder = arrivals(flow.got)
        duplicates += sum(what == "twice" for *_, what in disorder)
        reordered += sum(what == "out_of_order" for *_, what in disorder)
        seen = set(flow.got)  # one that came out of order came all the same
        route = path_between(src, dst)
        for seq, t, fault in unseen(flow, seen):
            if fault is None:
                quiet_lost += 1
                if len(examples) < 10:
                    examples.append(f"{src}->{dst} #{seq} at {t - flow.times[0]:.3f}s")
            elif fault.detail.get("killed") in route:
                where = "end" if fault.detail["killed"] in (src, dst) else "between"
                when = "before" if t < fault.detail["killed_at"] else "after"
                lost_with_kill[f"{where}_{when}_kill"] += 1
                fault.lost_by_place[f"{src}->{dst} {when}"] += 1
            else:
                lost_in_window[id(fault)] += 1
    uncounted = 0
    windows = []
    for fault in faults:
        fault.detail.pop("killed_at", None)
        counted = max(0, fault.drops_after - fault.drops_before - fault.own_drops)
        if fault.own_unknown:
            counted = 0
        lost = lost_in_window.get(id(fault), 0)
        if lost > counted:
            uncounted += lost - counted
            failures.append(
                f"{lost} messages lost in the window of {fault.kind} of {fault.target} "
                f"({fault.detail}), only {counted} counted by the buses"
            )
        windows.append(
            {"kind": fault.kind, "bus": fault.target, "at": round(fault.start - faults[0].start, 2),
             "seconds": round(fault.end - fault.start, 2), "lost": lost,
             "counted": counted, **fault.detail,
             **({"lost_with_kill": dict(fault.lost_by_place)} if fault.lost_by_place else {})}
        )  # fmt: skip
    if quiet_lost:
        failures.append(
            f"{quiet_lost} messages published outside every fault window were lost: "
            + "; ".join(examples)
        )
    if duplicates:
        failures.append(f"{duplicates} messages arrived twice")
    if reordered:
        failures.append(f"{reordered} messages arrived out of order")
    if chaos.gone:
        failures.append(f"buses not serving at the end: {chaos.gone}")
    logs = {n: b.log() for n, b in chaos.buses.items()}
    failures += log_failures(logs, faults)
    cut = identity_cuts(logs)
    drops: collections.Counter[str] = collections.Counter()
    for bus in chaos.buses.values():
        drops += bus.drops()
    kinds = collections.Counter(f.kind for f in faults)
    return {
        "faults": dict(kinds),
        "messages_sent": sum(len(p.sent) for p in chaos.pubs.values()),
        "deliveries_expected": sent_total,
        "deliveries": arrived,
        "sent_outside_fault_windows": quiet_sent,
        "lost_outside_fault_windows": quiet_lost,
        "lost_with_a_killed_bus": sum(lost_with_kill.values()),
        "lost_with_a_killed_bus_by_place": dict(lost_with_kill),
        "lost_in_other_fault_windows": sum(lost_in_window.values()),
        "lost_uncounted": uncounted,
        "duplicates": duplicates,
        "out_of_order": reordered,
        "drops_counted_by_reason": dict(drops),
        "drop_episodes_logged": sum(log.count('"flood.drop"') for log in logs.values()),
        "identity_changes": sum(log.count('"relay.identity_changed"') for log in logs.values()),
        "relays_cut_for_identity": cut,
        "publisher_reconnects": sum(p.reconnects for p in chaos.pubs.values()),
        "subscriber_reconnects": sum(s.reconnects for s in chaos.subs.values()),
        "windows": windows,
        "failures": failures,
    }


def run_chaos(*, duration: float = 120.0, seed: int = 7, rate: float = 100.0) -> dict[str, Any]:
    """The chaos run for ``duration`` seconds; figures and ``failures``."""
    chaos = Chaos(seed, rate)
    started = time.monotonic()
    try:
        chaos.run(duration)
    finally:
        chaos.stop()
    result: dict[str, Any] = {
        "seconds": round(time.monotonic() - started, 1),
        "seed": seed,
        "rate": rate,
    }
    result.update(check(chaos))
    result["workdir"] = chaos.workdir
    if result["failures"]:
        result["logs"] = chaos.workdir  # kept for the post-mortem
    else:
        cleanup_dir(chaos.workdir)
    return result


__all__ = ["is_listening", "run_chaos"]
