"""Fleet chaos: three hosts in network namespaces of their own under steady
traffic, and a seeded series of faults, partitions among them.

The fleet (``fleet.py``, on ``fabric.py``'s private network): per host a NATS
member, a master joined to NATS and two relays below it.  On every bus one
publisher sends ``f/<bus>`` with the payload ``<bus> <seq>`` at a steady rate
and one subscriber takes every bus's flow (the master's with ``f/``, the first
relay's with ``f/*``, the second's with ``f/h1-*``, ``f/h2-*``, ``f/h3-*``): 81
flows, between hosts in every direction and within each host; the checker
reads each message's origin and sequence from its payload.  Meanwhile, one at
a time with quiet gaps between them, faults drawn from ``random.Random(seed)``:

* ``host_cut``: a host's bridge ports down for up to 9 s (its master and its
  member still see each other), then up: a real partition;
* ``member_cut``: the NATS member a host's master uses, unreachable to
  everyone for up to 6 s;
* ``member_pause``: that member SIGSTOPped for up to 6 s, then SIGCONT;
* ``member_kill``: that member SIGKILLed, restarted up to 3 s later;
* ``kill``: SIGKILL of a master or a relay and a restart (``-r``);
* ``upgrade``: ``sbus-relay upgrade -a`` of a master or a relay;
* ``reload`` / ``bad_reload``: a good ``-C`` file or one with an error, and SIGHUP;
* ``flood``: a client sends 1 KiB messages as fast as it can to a client of
  any bus (often on another host) that does not read;
* ``slow_reader``: a client of ``f/`` reading one packet per 5 ms;
* ``compound``: a partition, a member's pause or a flood, and in the middle of
  it an upgrade, a reload, a kill or a member's kill.

Each fault's window runs from ``BEFORE`` before it until its effects have
settled (``SETTLE_LOCAL`` after a fault of one bus, ``SETTLE_NET`` after one of
NATS or of a master, ``HEAL_BOUND`` after a partition); a killed master is
back once its link has joined NATS again (the run reports how long that took
at most, and fails if it took over ``JOIN_WAIT``).  What is checked:

* every message published outside every window arrives at every subscriber,
  exactly once;
* per origin, nothing arrives twice or out of order, in a window or not;
* every message lost in a window is lost with a killed bus on its path, or
  counted on some host: the window's losses, as the fewest counter steps that
  explain them (a message missing at all three subscribers of a host is one
  step, at every other host's too one step, ...), are at most what the
  counters of ``fleet.COUNTED``, summed over every bus of every host and every
  incarnation, grew by in the window, less what the fault's own clients lost;
  losses in a window with a master's upgrade are also reported apart;
* after a host is healed, every flow that crosses it delivers a message
  published after the heal within ``HEAL_BOUND`` of the heal;
* no bus or member dies by itself, every upgrade happens, every bad reload is
  refused, no traceback or internal error in any bus's log.
"""

from __future__ import annotations

import array
import bisect
import collections
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .common import Closed, cleanup_dir, connect_retry, short_dir
from .faultrun import (
    FaultRun,
    Publisher,
    Subscriber,
    Window,
    arrivals,
    drops_of,
    flood,
    flows,
    for_a_while,
    log_failures,
    slow_reader,
    unseen,
    warm_up,
)
from .fleet import COUNTED, HOSTS, ROLES, Fleet, FleetBus, host_of, master_of

#: Seconds after a fault of one bus before its window closes (reconnects).
SETTLE_LOCAL = 2.0
#: Seconds after a fault of NATS or of a master before its window closes:
#: failover (two missed pings of 1 s), interest announced again.
SETTLE_NET = 6.0
#: Longest time from a host's heal to a delivery on every flow that crosses it,
#: and so how long a partition's window stays open after the heal.  Measured: up
#: to 8.3 s after cuts of 7 to 9 s, mostly 1 s after shorter ones.  The NATS
#: routes are TCP connections that the cut did not close (nats-server pings
#: its routes every 2 minutes): one that carried data during the cut is in
#: TCP's retransmission back-off, and its next try comes up to about 6.5 s
#: after a heal (doubling from 0.2-0.4 s), then the hosts hear each other's
#: interest again (heartbeats every 2 s).
HEAL_BOUND = 10.0
#: Longest wait for a restarted master's link to join NATS again (a member it
#: tries may be cut off or paused: nats.c gives each server 2 s to answer).
JOIN_WAIT = 30.0
#: Quiet gaps between faults, seconds.
GAP = (1.0, 3.0)
#: No fault starts later than this before the end of the run (its window closes first).
TAIL = 24.0
KINDS = (
    "host_cut", "member_cut", "member_pause", "member_kill", "kill", "upgrade",
    "reload", "bad_reload", "flood", "slow_reader", "compound",
)  # fmt: skip
#: What a compound's background and foreground faults are drawn from.
BACKGROUNDS = ("host_cut", "member_cut", "member_pause", "flood")
FOREGROUNDS = ("upgrade", "reload", "bad_reload", "kill", "member_kill")
NET_KINDS = {"host_cut", "member_cut", "member_pause", "member_kill"}
#: Said of a window's uncounted losses when a master was upgraded in it.
MASTER_UPGRADE = " (with a master's live upgrade)"
PAYLOAD_SIZE = 64
#: Each bus's subscriber's patterns (all of them take every flow).
PATTERNS = {
    "m": [b"f/"],
    "r1": [b"f/*"],
    "r2": [b"f/h%d-*" % i for i in HOSTS],
}


def payload(origin: bytes, seq: int) -> bytes:
    head = b"%s %d " % (origin, seq)
    return head + b"x" * max(0, PAYLOAD_SIZE - len(head))


def chain(bus: str) -> list[str]:
    """A bus and the buses above it, up to its master."""
    return [bus] if bus.endswith("-m") else [bus, master_of(bus)]


def path_between(src: str, dst: str) -> set[str]:
    """The buses a message from ``src``'s client to ``dst``'s passes through."""
    a, b = chain(src), chain(dst)
    if host_of(src) != host_of(dst):
        return set(a) | set(b)
    common = next(x for x in a if x in b)
    return set(a[: a.index(common) + 1]) | set(b[: b.index(common) + 1])


class FleetPublisher(Publisher):
    """Publishes ``f/<bus>`` at ``rate``, the payload ``<bus> <seq>``."""

    def __init__(self, bus: FleetBus, rate: float) -> None:
        name = bus.name.encode()
        key = b"f/" + name
        super().__init__(bus, rate, lambda seq: (key, payload(name, seq)))


class FleetSubscriber(Subscriber):
    """Takes every flow on one bus (``PATTERNS`` of its role); the origin and
    sequence number are in the payload, and the origin must be the key's."""

    def __init__(self, bus: FleetBus) -> None:
        super().__init__(bus, PATTERNS[bus.role], b"f/")
        self.foreign = 0

    def take(self, packet: bytes) -> None:
        nul = packet.find(b"\0")
        key, body = packet[6:nul], packet[nul + 1 :]
        origin, _, rest = body.partition(b" ")
        if origin == b"warm":
            self.warm.add(rest.decode())
            return
        seq = rest.partition(b" ")[0]
        if origin != key or not seq.isdigit():
            self.foreign += 1
            return
        self.record(origin.decode(), int(seq))


@dataclass
class Fault(Window):
    settle: float = SETTLE_LOCAL
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    killed: dict[str, float] = field(default_factory=dict)  # bus -> when
    upgraded: set[str] = field(default_factory=set)
    heals: list[tuple[str, int, float]] = field(default_factory=list)  # what, host, when

    def counted(self) -> int:
        grown = sum(max(0.0, v - self.before.get(s, 0.0)) for s, v in self.after.items())
        return 0 if self.own_unknown else max(0, int(grown) - self.own_drops)

    def counted_by_family(self) -> dict[str, int]:
        out: collections.Counter[str] = collections.Counter()
        for series, value in self.after.items():
            grown = value - self.before.get(series, 0.0)
            if grown > 0:
                name, _, labels = series.partition("{")
                out[f"{name.removeprefix('sbus_')}{{{labels}" if labels else name] += int(grown)
        return dict(out)


class FleetChaos(FaultRun):
    KINDS = KINDS
    GAP = GAP
    TAIL = TAIL

    def __init__(self, seed: int, rate: float, workdir: str,
                 progress: Callable[[str], None] | None = None) -> None:  # fmt: skip
        super().__init__(seed)
        self.rate = rate
        self.progress = progress or (lambda line: None)
        self.fleet = Fleet(workdir)
        self.buses: dict[str, FleetBus] = self.fleet.buses
        self.subs: dict[str, FleetSubscriber] = {
            n: FleetSubscriber(b) for n, b in self.buses.items()
        }
        self.pubs = {n: FleetPublisher(b, rate) for n, b in self.buses.items()}
        self.faults: list[Fault] = []
        #: buses and members that died without being killed: (name, when)
        self.died: list[tuple[str, float]] = []
        self.expect_down: set[str] = set()  # killed on purpose, being restarted

    def warm_up(self) -> None:
        """Until every subscriber has a message of every bus: interest is whole."""
        warm_up(
            self.subs.values(), dict(self.buses),
            lambda name: (b"f/" + name.encode(), b"warm " + name.encode()),
            timeout=90.0, pause=0.2,
        )  # fmt: skip

    # --- the faults ----------------------------------------------------------------

    def do(self, kind: str) -> Fault:
        """One fault, its window's counters read before and after."""
        rng = self.rng
        if kind == "compound":
            back, front = rng.choice(BACKGROUNDS), rng.choice(FOREGROUNDS)
            back_plan, front_plan = self._plan(back), self._plan(front)
            lead = rng.uniform(0.3, 1.5)
            fault = Fault(f"{back}+{front}", f"{back_plan['target']}+{front_plan['target']}", 0.0)
        else:
            plan = self._plan(kind)
            fault = Fault(kind, plan["target"], 0.0)
        self.fleet.scrape_all()
        fault.before = self.fleet.counted()
        fault.start = time.monotonic()
        if kind == "compound":
            errors: list[BaseException] = []

            def background() -> None:
                try:
                    self._act(back, back_plan, fault)
                except BaseException as exc:  # raised below, in the run's thread
                    errors.append(exc)

            behind = threading.Thread(target=background)
            behind.start()
            time.sleep(lead)
            self._act(front, front_plan, fault)
            behind.join(180)
            if errors:
                raise errors[0]
        else:
            self._act(kind, plan, fault)
        fault.end = time.monotonic()
        time.sleep(fault.settle)
        self._check_alive()
        self.fleet.scrape_all()
        fault.after = self.fleet.counted()
        self.faults.append(fault)
        self.progress(
            f"[{fault.start - self.t0:7.1f}s] {fault.kind} {fault.target} "
            f"({fault.end - fault.start:.1f}s) counted {fault.counted()}"
        )
        return fault

    def _plan(self, kind: str) -> dict[str, Any]:
        """A fault's target and parameters, drawn here so that the seed decides them."""
        rng = self.rng
        bus = rng.choice(sorted(self.buses))
        host = rng.choice(HOSTS)
        if kind == "host_cut":
            return {"target": f"h{host}", "host": host, "seconds": rng.uniform(1.0, 9.0)}
        if kind in ("member_cut", "member_pause"):  # the member host's master uses
            return {"target": f"n(h{host})", "of": host, "seconds": rng.uniform(0.5, 6.0)}
        if kind == "member_kill":
            return {"target": f"n(h{host})", "of": host, "seconds": rng.uniform(0.2, 3.0)}
        if kind == "flood":
            victim = rng.choice(sorted(self.buses))
            return {"target": f"{bus}>{victim}", "at": bus, "victim": victim,
                    "seconds": rng.uniform(0.5, 2.5)}  # fmt: skip
        if kind == "slow_reader":
            return {"target": bus, "at": bus, "seconds": rng.uniform(1.0, 4.0)}
        if kind in ("reload", "bad_reload"):
            return {"target": bus, "bus": bus, "variant": self.next_variant()}
        return {"target": bus, "bus": bus}  # kill, upgrade

    def _settles(self, kind: str, plan: dict[str, Any], fault: Fault) -> None:
        net = kind in NET_KINDS or (kind in ("kill", "upgrade") and str(plan["bus"]).endswith("-m"))
        settle = HEAL_BOUND if kind == "host_cut" else SETTLE_NET if net else SETTLE_LOCAL
        fault.settle = max(fault.settle, settle)

    def _act(self, kind: str, plan: dict[str, Any], fault: Fault) -> None:
        self._settles(kind, plan, fault)
        fabric = self.fleet.fabric
        if kind.startswith("member_"):
            plan["host"] = self.fleet.member_used_by(plan["of"])
            fault.target = fault.target.replace(plan["target"], f"n{plan['host']}")
        if kind in ("host_cut", "member_cut", "member_pause"):
            host, member = plan["host"], self.fleet.members[plan["host"]]
            begin, end = {
                "host_cut": (fabric.cut_host, fabric.heal_host),
                "member_cut": (fabric.cut_member, fabric.heal_member),
                "member_pause": (lambda _: member.pause(), lambda _: member.resume()),
            }[kind]
            healed = for_a_while(lambda: begin(host), lambda: end(host), plan["seconds"])
            fault.heals.append(("host" if kind == "host_cut" else "member", host, healed))
        elif kind == "member_kill":
            member = self.fleet.members[plan["host"]]
            self.expect_down.add(member.name)
            member.kill()
            time.sleep(plan["seconds"])
            member.start()
            self.expect_down.discard(member.name)
            fault.heals.append(("member", plan["host"], time.monotonic()))
            with contextlib.suppress(RuntimeError):
                member.wait_ready()
        elif kind == "kill":
            bus = self.buses[plan["bus"]]
            self.expect_down.add(bus.name)
            fault.killed[bus.name] = bus.kill()
            bus.start()
            self.expect_down.discard(bus.name)
            if bus.role == "m":  # back once its link is in NATS again
                fault.detail["link_joined_seconds"] = bus.link_joined(JOIN_WAIT)
        elif kind == "upgrade":
            bus = self.buses[plan["bus"]]
            fault.upgraded.add(bus.name)
            fault.detail.setdefault("upgraded", True)
            fault.detail["upgraded"] &= bus.upgrade()
        elif kind in ("reload", "bad_reload"):
            self.buses[plan["bus"]].reload(good=kind == "reload", variant=plan["variant"])
        elif kind == "flood":
            self._flood(self.buses[plan["at"]], self.buses[plan["victim"]], plan["seconds"], fault)
        elif kind == "slow_reader":
            fault.detail.update(slow_reader(self.buses[plan["at"]].address, b"f/", plan["seconds"]))
            fault.own(fault.detail["reader_drops"])

    def _flood(self, at: FleetBus, victim_at: FleetBus, seconds: float, fault: Fault) -> None:
        """Flood a client that does not read, then let it read everything; what the
        flood lost (at the victim's bus or on the way) is the fault's own."""
        sent = 0
        drops: int | None = None
        received = 0
        victim = connect_retry(victim_at.address, timeout=30.0)
        try:
            victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            victim.sub(b"x/")
            victim.sync()
            time.sleep(0.5 if host_of(at.name) == host_of(victim_at.name) else 2.5)  # interest
            sent = flood(at.address, b"x/flood", seconds)
            victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            while True:  # read until nothing more comes for a while
                try:
                    packet = victim.recv(1.5)
                except TimeoutError:
                    break
                received += packet.startswith(b"MSG x/")
            drops, late = drops_of(victim, timeout=60.0, count=b"x/")
            received += late
        except (Closed, OSError, TimeoutError):
            pass
        finally:
            victim.close()
        fault.detail.update({"flood_sent": sent, "flood_received": received,
                             "victim_drops": drops})  # fmt: skip
        if drops is None:
            fault.own(None)
        elif any(b in path_between(at.name, victim_at.name) for b in fault.killed):
            fault.own(drops)  # what a kill cost the flood was counted by nobody
        else:
            fault.own(sent - received)

    def _check_alive(self) -> None:
        """A bus or member that died without being killed is noted and started again."""
        now = time.monotonic()
        for bus in self.buses.values():
            if bus.name not in self.expect_down and not bus.alive():
                self.died.append((bus.name, round(now - self.t0, 1)))
                with contextlib.suppress(RuntimeError):
                    bus.start()
        for member in self.fleet.members.values():
            if member.name not in self.expect_down and not member.alive():
                self.died.append((member.name, round(now - self.t0, 1)))
                member.start()

    # --- the run -------------------------------------------------------------------

    def finished(self) -> None:
        self._check_alive()
        self.fleet.scrape_all()
        self.gone = [n for n, b in self.buses.items() if not b.alive()]

    def stop(self) -> None:
        self.stop_clients()
        self.fleet.close()


# --- the check ------------------------------------------------------------------------


def steps(origin: str, missed: set[str], buses: list[str], excused: set[str] | None = None) -> int:
    """The fewest counter steps that explain where one message is missing: one per
    subscriber, but one for all three of a host (its master took it from NATS
    short), one for every other host at once (it did not leave its host), one for
    everyone but its own bus's subscriber (it did not leave its relay).  The
    ``excused`` subscribers (a killed bus on the way to them) may have missed it
    the same way: a host whose other subscribers all missed it missed it whole."""
    excused = excused or set()
    home = host_of(origin)
    local = {d for d in missed if host_of(d) == home}
    per_host = {h: {d for d in missed if host_of(d) == h} for h in HOSTS if h != home}

    def whole(h: int, got: set[str]) -> bool:
        return bool(got) and len(got | {d for d in excused if host_of(d) == h}) == len(ROLES)

    if all(whole(h, got) for h, got in per_host.items()):
        remote = 1
    else:
        remote = sum(1 if whole(h, got) else len(got) for h, got in per_host.items())
    best = len(local) + remote
    if not origin.endswith("-m") and missed | excused >= set(buses) - {origin}:
        best = min(best, 1 + (origin in missed))
    return best


def _missed_where(chaos: FleetChaos, lost: dict[tuple[str, int], set[str]]) -> str:
    """A window's losses by origin and the subscribers that missed them, the
    commonest first, with when the first and last of them were published."""
    where: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for (src, seq), dests in lost.items():
        sent = chaos.pubs[src].sent
        where[(src, ",".join(sorted(dests)))].append(sent[seq] if seq < len(sent) else 0.0)
    common = sorted(where.items(), key=lambda item: -len(item[1]))[:8]
    return "; ".join(
        f"{src}->{dests} x{len(ts)} ({min(ts) - chaos.t0:.1f}-{max(ts) - chaos.t0:.1f}s)"
        for (src, dests), ts in common
    )


def _heal_delays(chaos: FleetChaos, what: str, host: int, healed: float) -> dict[str, Any]:
    """Per flow that crosses ``host`` (every flow between hosts, for a member): the
    time from the heal to the first delivery of a message published after it."""
    worst, slowest, never = 0.0, "", []
    for origin, pub in chaos.pubs.items():
        first = bisect.bisect_left(pub.sent, healed)
        for dest, sub in chaos.subs.items():
            if host_of(origin) == host_of(dest):
                continue
            if what == "host" and host not in (host_of(origin), host_of(dest)):
                continue
            got, at = sub.got.get(origin, array.array("q")), sub.at.get(origin, array.array("d"))
            k = bisect.bisect_left(at, healed)
            while k < len(got) and got[k] < first:
                k += 1
            if k == len(got):
                never.append(f"{origin}->{dest}")
                continue
            if at[k] - healed > worst:
                worst, slowest = at[k] - healed, f"{origin}->{dest}"
    return {"what": what, "host": host, "seconds": round(worst, 2), "slowest_flow": slowest,
            "never": never}  # fmt: skip


def check(chaos: FleetChaos) -> dict[str, Any]:
    """Compare what arrived with what was sent, flow by flow, window by window."""
    faults = chaos.faults
    buses = sorted(chaos.buses)
    failures: list[str] = []
    sent_total = arrived = duplicates = reordered = 0
    quiet_sent = quiet_lost = 0
    lost_with_kill: collections.Counter[str] = collections.Counter()
    #: per window: (origin, seq) -> the subscribers that missed it
    missing: dict[int, dict[tuple[str, int], set[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(set)
    )
    #: per window: (origin, seq) -> the subscribers that missed it with a killed bus on the way
    excused: dict[int, dict[tuple[str, int], set[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(set)
    )
    examples: dict[str, list[str]] = collections.defaultdict(list)
    #: (the window of the message's publication (0: none), "twice" or "out_of_order")
    disorder: collections.Counter[tuple[int, str]] = collections.Counter()
    for flow in flows(chaos):
        src, dst = flow.src, flow.dst
        sent_total += len(flow.times)
        arrived += len(flow.got)
        quiet_sent += flow.placed.count(None)
        seen, disordered = arrivals(flow.got)  # one that came late or twice is not seen
        for k, seq, top, what in disordered:
            if what == "twice":
                duplicates += 1
            else:
                reordered += 1
            fault = flow.placed[seq] if seq < len(flow.placed) else None
            disorder[(id(fault) if fault else 0, what)] += 1
            if len(examples[what]) < 6:
                examples[what].append(f"{src}->{dst} #{seq} after #{top} "
                                     f"at {flow.at[k] - chaos.t0:.2f}s")  # fmt: skip
        route = path_between(src, dst)
        for seq, t, fault in unseen(flow, seen):
            if fault is None:
                quiet_lost += 1
                if len(examples["lost"]) < 10:
                    examples["lost"].append(f"{src}->{dst} #{seq} at {t - chaos.t0:.2f}s")
                continue
            killed = [b for b in fault.killed if b in route]
            if killed:
                excused[id(fault)][(src, seq)].add(dst)
                where = "end" if any(b in (src, dst) for b in killed) else "between"
                when = "before" if t < min(fault.killed[b] for b in killed) else "after"
                lost_with_kill[f"{where}_{when}_kill"] += 1
            else:
                missing[id(fault)][(src, seq)].add(dst)
    uncounted = 0
    uncounted_by_kind: collections.Counter[str] = collections.Counter()
    upgrade_lost = upgrade_steps = upgrade_counted = 0
    windows = []
    heals = []
    for fault in faults:
        lost = missing.get(id(fault), {})
        spared = excused.get(id(fault), {})
        need = sum(
            steps(src, dests, buses, spared.get((src, seq))) for (src, seq), dests in lost.items()
        )
        deliveries = sum(len(d) for d in lost.values())
        counted = fault.counted()
        masters_upgraded = any(b.endswith("-m") for b in fault.upgraded)
        if masters_upgraded:
            upgrade_lost += deliveries
            upgrade_steps += need
            upgrade_counted += min(need, counted)
        if need > counted:
            uncounted += need - counted
            uncounted_by_kind[fault.kind] += need - counted
            failures.append(
                f"{deliveries} deliveries ({need} counter steps) lost in the window of "
                f"{fault.kind} of {fault.target} at {fault.start - chaos.t0:.1f}s"
                f"{MASTER_UPGRADE if masters_upgraded else ''}, "
                f"only {counted} counted ({fault.counted_by_family()}); "
                f"the most missed: {_missed_where(chaos, lost)}"
            )
        for what, host, healed in fault.heals:
            delays = _heal_delays(chaos, what, host, healed)
            heals.append({"kind": fault.kind, "at": round(healed - chaos.t0, 1), **delays})
        windows.append({
            "kind": fault.kind, "target": fault.target, "at": round(fault.start - chaos.t0, 2),
            "seconds": round(fault.end - fault.start, 2), "lost_deliveries": deliveries,
            "lost_steps": need, "counted": counted, "counted_by": fault.counted_by_family(),
            "twice": disorder[(id(fault), "twice")],
            "out_of_order": disorder[(id(fault), "out_of_order")],
            **({"own_drops": fault.own_drops} if fault.own_drops else {}),
            **({"killed": sorted(fault.killed)} if fault.killed else {}),
            **({"upgraded_buses": sorted(fault.upgraded)} if fault.upgraded else {}),
            **fault.detail,
        })  # fmt: skip
    joins = [f.detail["link_joined_seconds"] for f in faults if "link_joined_seconds" in f.detail]
    if None in joins:
        failures.append(f"{joins.count(None)} restarted masters' links did not join NATS "
                        f"within {JOIN_WAIT:.0f} s")  # fmt: skip
    host_heals = [h for h in heals if h["what"] == "host"]
    for heal in heals:
        if heal["never"]:
            failures.append(
                f"after the heal of {heal['what']} {heal['host']} at {heal['at']}s, "
                f"{len(heal['never'])} flows never delivered again: {heal['never'][:6]}"
            )
    for heal in host_heals:
        if heal["seconds"] > HEAL_BOUND:
            failures.append(
                f"host {heal['host']} healed at {heal['at']}s: flow {heal['slowest_flow']} "
                f"delivered again only after {heal['seconds']}s (bound {HEAL_BOUND}s)"
            )
    if quiet_lost:
        failures.append(
            f"{quiet_lost} deliveries of messages published outside every fault window "
            "were lost: " + "; ".join(examples["lost"])
        )
    names = {id(f): f"{f.kind} of {f.target}" for f in faults}
    for what, total in (("twice", duplicates), ("out_of_order", reordered)):
        if total:
            places: collections.Counter[str] = collections.Counter()
            for (key, kind), n in disorder.items():
                if kind == what:
                    places[names.get(key, "no window")] += n
            failures.append(
                f"{total} messages arrived {what.replace('_', ' ')} (by the window they were "
                f"published in: {dict(places)}): " + "; ".join(examples[what])
            )
    foreign = sum(s.foreign for s in chaos.subs.values())
    if foreign:
        failures.append(f"{foreign} messages arrived under another key than their origin's")
    if chaos.died:
        failures.append(f"died without being killed: {chaos.died}")
    if chaos.gone:
        failures.append(f"buses not serving at the end: {chaos.gone}")
    logs = {n: b.log() for n, b in chaos.buses.items()}
    failures += log_failures(logs, faults)
    for member in chaos.fleet.members.values():
        if "panic:" in member.log():
            failures.append(f"nats-server {member.name} panicked")
    kinds = collections.Counter(f.kind for f in faults)
    totals = chaos.fleet.counted()
    by_family: collections.Counter[str] = collections.Counter()
    for series, value in totals.items():
        if value:
            by_family[series.removeprefix("sbus_")] += int(value)
    window_lost = sum(sum(len(d) for d in w.values()) for w in missing.values())
    window_steps = sum(w["lost_steps"] for w in windows)
    return {
        "faults": dict(kinds),
        "messages_sent": sum(len(p.sent) for p in chaos.pubs.values()),
        "deliveries_due": sent_total,
        "deliveries": arrived,
        "due_outside_fault_windows": quiet_sent,
        "lost_outside_fault_windows": quiet_lost,
        "duplicates": duplicates,
        "out_of_order": reordered,
        "lost_in_fault_windows": window_lost,
        "lost_in_fault_windows_steps": window_steps,
        "lost_uncounted_steps": uncounted,
        "lost_uncounted_steps_by_fault": dict(uncounted_by_kind.most_common()),
        "lost_with_a_killed_bus": sum(lost_with_kill.values()),
        "lost_with_a_killed_bus_by_place": dict(lost_with_kill),
        "lost_in_master_upgrades": upgrade_lost,
        "lost_in_master_upgrades_steps": upgrade_steps,
        "lost_in_master_upgrades_counted": upgrade_counted,
        "link_joined_seconds_max": max((j for j in joins if j is not None), default=None),
        "heal_seconds_max": max((h["seconds"] for h in host_heals), default=None),
        "heal_seconds": sorted(h["seconds"] for h in host_heals),
        "member_recovery_seconds_max": max(
            (h["seconds"] for h in heals if h["what"] == "member"), default=None
        ),
        "counted_by": dict(by_family),
        "loss_counters_present": sorted(
            {s.partition("{")[0] for s in totals} & {COUNTED[2], COUNTED[3]}
        ),
        "publisher_reconnects": sum(p.reconnects for p in chaos.pubs.values()),
        "subscriber_reconnects": sum(s.reconnects for s in chaos.subs.values()),
        "host_name_shared_warnings": sum(
            log.count('"nats.host_name_shared"') for log in logs.values()
        ),
        "heals": heals,
        "windows": windows,
        "failures": failures,
    }


def run_fleetchaos(
    *,
    duration: float = 120.0,
    seed: int = 7,
    rate: float = 50.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The fleet chaos run for ``duration`` seconds at ``rate`` messages a second
    per publisher (nine of them); figures and ``failures``."""
    workdir = short_dir()
    started = time.monotonic()
    try:
        chaos = FleetChaos(seed, rate, workdir, progress)
    except BaseException:
        cleanup_dir(workdir)
        raise
    try:
        chaos.run(duration)
    except BaseException as exc:
        exc.add_note(f"the run's logs are kept in {workdir}")
        raise
    finally:
        chaos.stop()
    result: dict[str, Any] = {
        "seconds": round(time.monotonic() - started, 1),
        "seed": seed,
        "rate_per_publisher": rate,
        "publishers": len(chaos.pubs),
        "network": str(chaos.fleet.fabric.net),
    }
    result.update(check(chaos))
    left = chaos.fleet.fabric.leftovers()
    if left:
        result["failures"].append(f"left behind: {left}")
    if result["failures"]:
        result["logs"] = workdir  # kept for the post-mortem
    else:
        cleanup_dir(workdir)
    return result


# --- the table of docs/reliability.md -----------------------------------------------


def _n(value: float | int | None) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    return "-" if value is None else f"{value:,}"


def table(results: list[dict[str, Any]]) -> str:
    """The fleet chaos table of docs/reliability.md, a column per run (the JSON
    ``--json`` writes, or what ``run_fleetchaos`` returns)."""
    rows: list[tuple[str, list[str]]] = []

    def row(name: str, cell: Callable[[dict[str, Any]], str]) -> None:
        rows.append((name, [cell(r) for r in results]))

    def kinds(r: dict[str, Any]) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        for kind, n in r["faults"].items():
            for part in kind.split("+"):
                out[part] += n
        return out

    def upgrades(r: dict[str, Any]) -> str:
        buses = [b for w in r["windows"] for b in w.get("upgraded_buses", ())]
        return f"{len(buses)} ({sum(b.endswith('-m') for b in buses)})"

    row("seed", lambda r: str(r["seed"]))
    row("faults (of which compound)", lambda r: f"{sum(r['faults'].values())} "
        f"({sum(n for k, n in r['faults'].items() if '+' in k)})")  # fmt: skip
    row(
        "host cuts / member cuts / pauses / kills",
        lambda r: " / ".join(
            str(kinds(r)[k]) for k in ("host_cut", "member_cut", "member_pause", "member_kill")
        ),
    )
    row(
        "bus kills / upgrades (of a master) / reloads good+bad",
        lambda r: (
            f"{kinds(r)['kill']} / {upgrades(r)} / {kinds(r)['reload']}+{kinds(r)['bad_reload']}"
        ),
    )
    row("floods / slow readers", lambda r: f"{kinds(r)['flood']} / {kinds(r)['slow_reader']}")
    row(
        "messages published / deliveries due",
        lambda r: f"{_n(r['messages_sent'])} / {_n(r['deliveries_due'])}",
    )
    row("deliveries made", lambda r: _n(r["deliveries"]))
    row(
        "due outside every fault window / lost of them",
        lambda r: (
            f"{_n(r['due_outside_fault_windows'])} / **{_n(r['lost_outside_fault_windows'])}**"
        ),
    )
    row("duplicated / out of order", lambda r: f"{_n(r['duplicates'])} / {_n(r['out_of_order'])}")
    row(
        "lost in fault windows: deliveries / counter steps",
        lambda r: f"{_n(r['lost_in_fault_windows'])} / {_n(r['lost_in_fault_windows_steps'])}",
    )
    row(
        "... counted / uncounted (steps)",
        lambda r: (
            f"{_n(r['lost_in_fault_windows_steps'] - r['lost_uncounted_steps'])} / "
            f"**{_n(r['lost_uncounted_steps'])}**"
        ),
    )
    row(
        "... of which in a master's upgrade: steps / uncounted",
        lambda r: (
            f"{_n(r['lost_in_master_upgrades_steps'])} / "
            f"{_n(r['lost_in_master_upgrades_steps'] - r['lost_in_master_upgrades_counted'])}"
        ),
    )
    row(
        "... uncounted steps by fault",
        lambda r: (
            ", ".join(f"{k} {_n(v)}" for k, v in r["lost_uncounted_steps_by_fault"].items()) or "-"
        ),
    )
    row("lost with a killed bus on the path", lambda r: _n(r["lost_with_a_killed_bus"]))
    row(
        "counted (all hosts): unconfirmed / NATS queue / lost+refused",
        lambda r: " / ".join(
            (
                _n(r["counted_by"].get('nats_dropped_messages_total{reason="unconfirmed"}', 0)),
                _n(r["counted_by"].get('nats_dropped_messages_total{reason="queue_overflow"}', 0)),
                _n(
                    sum(
                        v
                        for k, v in r["counted_by"].items()
                        if k.startswith(("nats_lost_", "nats_refused_"))
                    )
                ),
            )
        ),
    )
    row(
        "heal: host heals, seconds to every flow (max / median)",
        lambda r: (
            f"{len(r['heal_seconds'])}, {_n(r['heal_seconds_max'])} / "
            f"{_n(r['heal_seconds'][len(r['heal_seconds']) // 2] if r['heal_seconds'] else None)}"
        ),
    )
    row("masters killed: seconds until the link joined NATS again (max)",
        lambda r: _n(r.get("link_joined_seconds_max")))  # fmt: skip
    row("promises held", lambda r: "yes" if not r["failures"] else f"no ({len(r['failures'])})")
    out = ["| run | " + " | ".join(f"{r.get('seconds', 0) / 60:.0f} min" for r in results) + " |",
           "|---|" + "---|" * len(results)]  # fmt: skip
    out += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.hardening.harness.fleetchaos --table FILE...``: the table
    of docs/reliability.md from the JSON files of ``fleetchaos --json FILE``."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m tests.hardening.harness.fleetchaos")
    parser.add_argument("--table", nargs="+", metavar="FILE", required=True)
    args = parser.parse_args(argv)
    results = []
    for path in args.table:
        with open(path) as src:
            doc = json.load(src)
        results.append(doc.get("fleetchaos", doc))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["KINDS", "run_fleetchaos", "table"]
