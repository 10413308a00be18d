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
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from sbus_relay.ops.addresses import parse_address
from sbus_relay.ops.supervisor import listener_pid

from .common import VENV_BIN, Closed, Conn, cleanup_dir, connect_retry, is_listening, short_dir

#: The tree: each bus and its upstream.
TREE = {"m": None, "a": "m", "b": "m", "c": "a"}
#: Seconds before a fault in which a message may still be inside what it hits.
BEFORE = 1.0
#: Seconds after a fault ends before its window closes (reconnects, resubscribes).
SETTLE = 2.0
#: Quiet gaps between faults, seconds (at least one message per flow each).
GAP = (1.0, 4.0)
#: How long a bus may take to hand itself over or start, seconds.
START_WAIT = 30.0
KINDS = ("upgrade", "reload", "bad_reload", "kill", "pause", "flood", "slow_reader", "compound")
PAYLOAD = b"x" * 64
FLOOD_PAYLOAD = b"f" * 1024


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


class TreeBus:
    """One bus of the tree, restarted after a kill, followed through upgrades."""

    def __init__(self, name: str, workdir: str, upstream: TreeBus | None) -> None:
        self.name = name
        self.address = os.path.join(workdir, f"{name}.sock")
        self.config = os.path.join(workdir, f"{name}.yaml")
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.port = _free_port()
        self.upstream = upstream
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: set[int] = set()
        self.pid = 0
        #: drops counted by incarnations that were killed, and by the live one
        self.drops_done: collections.Counter[str] = collections.Counter()
        self.drops_now: collections.Counter[str] = collections.Counter()
        self.write_config(good=True, variant=0)
        self.start()

    def write_config(self, *, good: bool, variant: int) -> None:
        limit = 65_536 - 1000 * (variant % 3)
        text = f"hard_limit_messages: {limit if good else -5}\nlog_level: info\n"
        with open(self.config + ".new", "w") as out:
            out.write(text)
        os.replace(self.config + ".new", self.config)

    def start(self) -> None:
        argv = [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-f", "-r", "-a", self.address,
                "-C", self.config, "--metrics", f"127.0.0.1:{self.port}",
                "--instance", self.name, "--log-format", "json"]  # fmt: skip
        if self.upstream is not None:
            argv += ["--upstream", self.upstream.address]
        with open(self.log_path, "ab") as err:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.pids.add(proc.pid)
        deadline = time.monotonic() + START_WAIT
        while listener_pid(parse_address(self.address)) != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bus {self.name} did not start:\n{self.log()[-3000:]}")
            time.sleep(0.02)
        self.pid = proc.pid

    def reap(self) -> None:
        for proc in self.procs:
            proc.poll()

    def log(self, offset: int = 0) -> str:
        """Its log (from byte ``offset``)."""
        try:
            with open(self.log_path, errors="replace") as src:
                src.seek(offset)
                return src.read()
        except FileNotFoundError:
            return ""

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except FileNotFoundError:
            return 0

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
        self.scrape()
        os.kill(self.pid, signal.SIGKILL)
        killed = time.monotonic()
        self.drops_done += self.drops_now
        self.drops_now = collections.Counter()
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{self.pid}") and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)
        self.start()
        return killed

    def stop(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


class Publisher(threading.Thread):
    """Publishes ``s/<bus>/<seq>`` at ``rate``; reconnects after its bus dies."""

    def __init__(self, bus: TreeBus, rate: float) -> None:
        super().__init__(daemon=True)
        self.bus = bus
        self.rate = rate
        self.sent: list[float] = []  # publish time of each seq
        self.stopping = threading.Event()
        self.reconnects = 0

    def run(self) -> None:
        conn: Conn | None = None
        start = time.monotonic()
        while not self.stopping.is_set():
            if conn is None:
                try:
                    conn = connect_retry(self.bus.address, timeout=60.0)
                    conn.sock.settimeout(30.0)
                except OSError:
                    continue
            due = int((time.monotonic() - start) * self.rate)
            try:
                while len(self.sent) < due and not self.stopping.is_set():
                    conn.pub(b"s/%s/%d" % (self.bus.name.encode(), len(self.sent)), PAYLOAD)
                    self.sent.append(time.monotonic())
            except (Closed, OSError):  # its bus was killed: that seq was not sent
                conn.close()
                conn = None
                self.reconnects += 1
                continue
            time.sleep(0.005)
        if conn is not None:
            conn.close()


class Subscriber(threading.Thread):
    """Takes ``s/`` on one bus, records each flow's sequence numbers as they arrive."""

    def __init__(self, bus: TreeBus) -> None:
        super().__init__(daemon=True)
        self.bus = bus
        self.got: dict[str, list[int]] = collections.defaultdict(list)
        self.warm: set[str] = set()
        self.stopping = threading.Event()
        self.subscribed = threading.Event()
        self.reconnects = -1

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                conn = connect_retry(self.bus.address, timeout=60.0)
            except OSError:
                continue
            self.reconnects += 1
            try:
                conn.sub(b"s/")
                conn.sync()
                self.subscribed.set()
                while not self.stopping.is_set():
                    try:
                        packet = conn.recv(0.5)
                    except TimeoutError:
                        continue
                    if not packet.startswith(b"MSG s/"):
                        continue
                    key = packet[6 : packet.index(b"\0")]
                    src, _, seq = key.partition(b"/")
                    if src == b"warm":
                        self.warm.add(seq.decode())
                    else:
                        self.got[src.decode()].append(int(seq))
            except (Closed, OSError, TimeoutError):
                pass
            finally:
                conn.close()


def _drops_of(conn: Conn, timeout: float = 20.0) -> int:
    """Ask the bus how many messages it dropped for ``conn``, reading what is queued."""
    conn.cmsg(b"drops/count")
    deadline = time.monotonic() + timeout
    while True:
        packet = conn.recv(max(0.01, deadline - time.monotonic()))
        if packet.startswith(b"CMSG drops/count\0"):
            return int(packet.split(b"\0", 1)[1])


@dataclass
class Fault:
    kind: str
    bus: str
    start: float
    end: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    drops_before: int = 0
    drops_after: int = 0
    own_drops: int = 0  # drops of the fault's own clients (flood, slow reader)
    #: a client of the fault's own was cut off before it could say its drops:
    #: then none of the window's drops count for the flows
    own_unknown: bool = False
    #: messages lost with a killed bus, per flow and before or after the kill
    lost_by_place: collections.Counter[str] = field(default_factory=collections.Counter)

    def own(self, drops: int | None) -> None:
        if drops is None:
            self.own_unknown = True
        else:
            self.own_drops += drops

    def window(self) -> tuple[float, float]:
        return self.start - BEFORE, self.end + SETTLE


class Chaos:
    def __init__(self, seed: int, rate: float) -> None:
        self.rng = random.Random(seed)
        self.workdir = short_dir()
        self.buses: dict[str, TreeBus] = {}
        try:
            for name, up in TREE.items():
                self.buses[name] = TreeBus(name, self.workdir, self.buses[up] if up else None)
        except BaseException:
            for bus in self.buses.values():
                bus.stop()
            raise
        self.subs = {n: Subscriber(b) for n, b in self.buses.items()}
        self.pubs = {n: Publisher(b, rate) for n, b in self.buses.items()}
        self.faults: list[Fault] = []
        self.variant = 0
        self.gone: list[str] = []

    def total_drops(self) -> int:
        for bus in self.buses.values():
            bus.scrape()
        return sum(sum(b.drops().values()) for b in self.buses.values())

    def warm_up(self) -> None:
        for sub in self.subs.values():
            sub.start()
        for sub in self.subs.values():
            if not sub.subscribed.wait(30):
                raise RuntimeError(f"subscriber on {sub.bus.name} never subscribed")
        conns = {n: Conn(b.address) for n, b in self.buses.items()}
        deadline = time.monotonic() + 30
        while any(len(s.warm) < len(TREE) for s in self.subs.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("the tree never carried every bus's traffic everywhere")
            for name, conn in conns.items():
                conn.pub(b"s/warm/" + name.encode())
            time.sleep(0.1)
        for conn in conns.values():
            conn.close()

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
            fault.bus = f"{name}+{front_bus}"
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
            self.variant += 1
            return {"variant": self.variant}
        return {}

    def _act(self, kind: str, name: str, plan: dict[str, Any], fault: Fault) -> None:
        bus = self.buses[name]
        if kind == "upgrade":
            fault.detail.setdefault("upgraded", True)
            fault.detail["upgraded"] &= bus.upgrade()
        elif kind in ("reload", "bad_reload"):
            bus.write_config(good=kind == "reload", variant=plan["variant"])
            offset = bus.log_size()
            os.kill(bus.pid, signal.SIGHUP)
            deadline = time.monotonic() + START_WAIT  # a paused bus reloads once continued
            while time.monotonic() < deadline and not any(
                e in bus.log(offset) for e in ('"config.reloaded"', '"config.refused"')
            ):
                time.sleep(0.05)
            bus.write_config(good=True, variant=plan["variant"])
        elif kind == "kill":
            fault.detail["killed"] = name
            fault.detail["killed_at"] = bus.kill_and_restart()
        elif kind == "pause":
            pid = bus.pid
            os.kill(pid, signal.SIGSTOP)
            time.sleep(plan["seconds"])
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile
                os.kill(pid, signal.SIGCONT)
        elif kind == "flood":
            fault.detail["victim"] = plan["victim"]
            fault.detail.update(self._flood(bus, self.buses[plan["victim"]], plan["seconds"]))
            fault.own(fault.detail["victim_drops"])
        elif kind == "slow_reader":
            fault.detail.update(self._slow_reader(bus, plan["seconds"]))
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
            end = time.monotonic() + seconds
            with contextlib.suppress(Closed, OSError), connect_retry(at.address, 30.0) as flooder:
                while time.monotonic() < end:  # (until its bus is killed, in a compound)
                    for _ in range(100):
                        flooder.pub(b"f/x", FLOOD_PAYLOAD)
                    sent += 100
            time.sleep(0.5)
            victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            drops = _drops_of(victim, timeout=60.0)
        except (Closed, OSError):
            pass
        finally:
            victim.close()
        return {"flood_sent": sent, "victim_drops": drops}

    def _slow_reader(self, at: TreeBus, seconds: float) -> dict[str, Any]:
        read = 0
        drops: int | None = None
        with contextlib.suppress(Closed, OSError), connect_retry(at.address, 30.0) as reader:
            reader.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            reader.sub(b"s/")
            reader.sync()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                with contextlib.suppress(TimeoutError):
                    reader.recv(0.1)
                    read += 1
                time.sleep(0.005)
            reader.unsub(b"s/")
            reader.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            drops = _drops_of(reader, timeout=60.0)
        return {"read": read, "reader_drops": drops}

    # --- the run -------------------------------------------------------------------

    def run(self, duration: float) -> None:
        self.warm_up()
        for pub in self.pubs.values():
            pub.start()
        t0 = time.monotonic()
        order = list(KINDS)
        self.rng.shuffle(order)  # every kind at least once, early
        while time.monotonic() - t0 < duration - 8:
            time.sleep(self.rng.uniform(*GAP))
            kind = order.pop(0) if order else self.rng.choice(KINDS)
            self.do(kind)
        while time.monotonic() - t0 < duration:
            time.sleep(0.1)
        for pub in self.pubs.values():
            pub.stopping.set()
        for pub in self.pubs.values():
            pub.join(30)
        self._drain()
        for sub in self.subs.values():
            sub.stopping.set()
            sub.join(10)
        #: buses that no longer answer at their address (none may die by itself)
        self.gone = [
            n for n, b in self.buses.items() if listener_pid(parse_address(b.address)) != b.pid
        ]

    def _drain(self, timeout: float = 60.0) -> None:
        """Wait until every subscriber has stopped receiving."""
        deadline = time.monotonic() + timeout
        last = -1
        while time.monotonic() < deadline:
            now = sum(len(v) for s in self.subs.values() for v in s.got.values())
            if now == last:
                return
            last = now
            time.sleep(2.0)

    def stop(self) -> None:
        for pub in self.pubs.values():
            pub.stopping.set()
        for sub in self.subs.values():
            sub.stopping.set()
        for bus in self.buses.values():
            bus.stop()


def _faults_at(faults: list[Fault], times: list[float]) -> list[Fault | None]:
    """The fault whose window holds each time (None: none), for times in order.

    Windows follow one another (a fault starts at least ``GAP[0]`` after the
    window before it has closed), so one pass over both lists places them all.
    """
    out: list[Fault | None] = []
    i = 0
    for t in times:
        while i < len(faults) and faults[i].window()[1] < t:
            i += 1
        if i < len(faults) and faults[i].window()[0] <= t:
            out.append(faults[i])
        else:
            out.append(None)
    return out


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
    for src, pub in chaos.pubs.items():
        times = pub.sent
        placed = _faults_at(faults, times)
        for dst, sub in chaos.subs.items():
            got = sub.got.get(src, [])
            sent_total += len(times)
            arrived += len(got)
            seen: set[int] = set()
            top = -1
            for seq in got:
                if seq in seen:
                    duplicates += 1
                elif seq < top:
                    reordered += 1
                seen.add(seq)
                top = max(top, seq)
            route = path_between(src, dst)
            for seq, t in enumerate(times):
                fault = placed[seq]
                if fault is None:
                    quiet_sent += 1
                if seq in seen:
                    continue
                if fault is None:
                    quiet_lost += 1
                    if len(examples) < 10:
                        examples.append(f"{src}->{dst} #{seq} at {t - times[0]:.3f}s")
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
                f"{lost} messages lost in the window of {fault.kind} of {fault.bus} "
                f"({fault.detail}), only {counted} counted by the buses"
            )
        windows.append(
            {"kind": fault.kind, "bus": fault.bus, "at": round(fault.start - faults[0].start, 2),
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
    for fault in faults:
        if fault.detail.get("upgraded") is False:
            failures.append(f"the upgrade of {fault.bus} did not happen within {START_WAIT}s")
    if chaos.gone:
        failures.append(f"buses not serving at the end: {chaos.gone}")
    logs = {n: b.log() for n, b in chaos.buses.items()}
    refused = sum(log.count('"config.refused"') for log in logs.values())
    bad = sum(f.kind.endswith("bad_reload") for f in faults)
    if refused != bad:
        failures.append(f"{bad} bad reloads, {refused} refused")
    for name, log in logs.items():
        if "Traceback" in log or "internal_error" in log:
            failures.append(f"a traceback or internal error in the log of {name}")
    cut = sum(log.count("upstream_identity_changed") for log in logs.values())
    if cut:
        failures.append(f"{cut} relays were cut off because their identity changed")
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
