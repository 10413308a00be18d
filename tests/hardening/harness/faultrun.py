"""What the two chaos runs share: ``chaos.py`` (a tree of buses on one host) and
``fleetchaos.py`` (three hosts joined by NATS).

A bus process followed through kills and upgrades (``RunBus``), the steady
numbered flows and the subscribers that record them (``Publisher``,
``Subscriber``), the run's loop of faults with quiet gaps between them
(``FaultRun``), each fault's window (``Window``, ``faults_at``), the faults
both inflict in the same way (a reload, a flood's sending side, a slow
reader), and the promises read in the buses' logs (``log_failures``).

Owns the processes and client threads it starts; touches a bus only through
its socket, its signals, its ``-C`` file and its log.
"""

from __future__ import annotations

import array
import collections
import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sbus_relay.ops.addresses import parse_address
from sbus_relay.ops.supervisor import listener_pid

from .common import VENV_BIN, Closed, Conn, connect_retry

#: Seconds before a fault in which a message may still be inside what it hits.
BEFORE = 1.0
#: Seconds a bus may take to start, to hand itself over, or to answer a reload.
START_WAIT = 30.0
#: Seconds a subscriber gets to subscribe at the start of a run.
SUBSCRIBE_WAIT = 30.0
#: What a flood sends, as fast as its bus takes it.
FLOOD_PAYLOAD = b"f" * 1024
#: The events a bus logs when it has read its ``-C`` file again, or refused it.
RELOAD_EVENTS = ('"config.reloaded"', '"config.refused"')


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (neither gone nor a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


# --- a bus ------------------------------------------------------------------------------


class RunBus:
    """One ``sbus-relay serve`` of a run, with its own ``-C`` file, log and metrics
    port; started again after a kill (``-r``), followed through upgrades.  A run's
    own kind of bus says how it is started (``argv``) and what it reads of its
    metrics (``scrape``)."""

    def __init__(self, name: str, address: str, config: str, log_path: str, port: int) -> None:
        self.name = name
        self.address = address
        self.config = config
        self.log_path = log_path
        self.port = port
        self.procs: list[subprocess.Popen[bytes]] = []
        #: every pid this bus ran as (killed, upgraded away, current)
        self.pids: set[int] = set()
        self.pid = 0
        self.write_config(good=True, variant=0)

    def serve_argv(self) -> list[str]:
        """``sbus-relay serve`` with what every bus of a run has."""
        return [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-f", "-r", "-a", self.address,
                "-C", self.config, "--metrics", f"127.0.0.1:{self.port}",
                "--instance", self.name, "--log-format", "json"]  # fmt: skip

    def argv(self) -> list[str]:
        raise NotImplementedError

    def scrape(self) -> bool:
        """Read its counters from /metrics; False if it did not answer."""
        raise NotImplementedError

    def write_config(self, *, good: bool, variant: int) -> None:
        limit = 65_536 - 1000 * (variant % 3)
        text = f"hard_limit_messages: {limit if good else -5}\nlog_level: info\n"
        with open(self.config + ".new", "w") as out:
            out.write(text)
        os.replace(self.config + ".new", self.config)

    def spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as err:
            proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.pids.add(proc.pid)
        return proc

    def wait_serving(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_WAIT
        while listener_pid(parse_address(self.address)) != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bus {self.name} did not start:\n{self.log()[-3000:]}")
            time.sleep(0.02)
        self.pid = proc.pid

    def start(self) -> None:
        self.wait_serving(self.spawn())

    def serving(self) -> bool:
        """Whether the process it runs as now listens at its address."""
        return bool(listener_pid(parse_address(self.address)) == self.pid)

    def alive(self) -> bool:
        return running(self.pid)

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

    def reload(self, *, good: bool, variant: int) -> None:
        """A good ``-C`` file or one with an error, and SIGHUP; until the bus says
        it reloaded or refused (a paused bus answers once continued, within
        ``START_WAIT``); then the good file back."""
        self.write_config(good=good, variant=variant)
        offset = self.log_size()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGHUP)
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline and not any(e in self.log(offset) for e in RELOAD_EVENTS):
            time.sleep(0.05)
        self.write_config(good=True, variant=variant)

    def kill(self) -> float:
        """SIGKILL (its counters read just before); when it was killed."""
        self.scrape()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        killed = time.monotonic()
        deadline = time.monotonic() + 10
        while running(self.pid) and time.monotonic() < deadline:
            for proc in self.procs:
                proc.poll()
            time.sleep(0.01)
        return killed


# --- the traffic --------------------------------------------------------------------------


class Publisher(threading.Thread):
    """Publishes one bus's flow at ``rate`` messages a second, message ``seq``
    being ``message(seq)`` (a key and a payload); reconnects after its bus dies.
    ``sent``: the publish time of each seq."""

    def __init__(
        self, bus: RunBus, rate: float, message: Callable[[int], tuple[bytes, bytes]]
    ) -> None:
        super().__init__(daemon=True, name=f"pub-{bus.name}")
        self.bus = bus
        self.rate = rate
        self.message = message
        self.sent = array.array("d")
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
                    conn.pub(*self.message(len(self.sent)))
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
    """Takes ``patterns`` on one bus (again after each reconnect) and hands each
    ``MSG`` whose key begins with ``prefix`` to ``take``, which a run's own
    subscriber defines: it calls ``warmed`` or ``record``.  ``got``: each
    origin's sequence numbers in the order they came, ``at``: when."""

    def __init__(self, bus: RunBus, patterns: Sequence[bytes], prefix: bytes) -> None:
        super().__init__(daemon=True, name=f"sub-{bus.name}")
        self.bus = bus
        self.patterns = list(patterns)
        self.msg_prefix = b"MSG " + prefix
        self.got: dict[str, array.array[int]] = collections.defaultdict(lambda: array.array("q"))
        self.at: dict[str, array.array[float]] = collections.defaultdict(lambda: array.array("d"))
        self.warm: set[str] = set()
        self.stopping = threading.Event()
        self.subscribed = threading.Event()
        self.reconnects = -1

    def take(self, packet: bytes) -> None:
        raise NotImplementedError

    def record(self, origin: str, seq: int) -> None:
        self.got[origin].append(seq)
        self.at[origin].append(time.monotonic())

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                conn = connect_retry(self.bus.address, timeout=60.0)
            except OSError:
                continue
            self.reconnects += 1
            try:
                for pattern in self.patterns:
                    conn.sub(pattern)
                conn.sync()
                self.subscribed.set()
                while not self.stopping.is_set():
                    try:
                        packet = conn.recv(0.5)
                    except TimeoutError:
                        continue
                    if packet.startswith(self.msg_prefix):
                        self.take(packet)
            except (Closed, OSError, TimeoutError):
                pass
            finally:
                conn.close()


def warm_up(
    subs: Iterable[Subscriber],
    buses: dict[str, RunBus],
    warm: Callable[[str], tuple[bytes, bytes]],
    *,
    timeout: float,
    pause: float,
) -> None:
    """Start the subscribers; until each has a warm-up message (``warm(bus)``: a
    key and a payload) of every bus: interest is whole."""
    subs = list(subs)
    for sub in subs:
        sub.start()
    for sub in subs:
        if not sub.subscribed.wait(SUBSCRIBE_WAIT):
            raise RuntimeError(f"subscriber on {sub.bus.name} never subscribed")
    conns = {n: Conn(b.address) for n, b in buses.items()}
    deadline = time.monotonic() + timeout
    try:
        while any(len(s.warm) < len(buses) for s in subs):
            if time.monotonic() > deadline:
                missing = {s.bus.name: sorted(set(buses) - s.warm) for s in subs}
                raise RuntimeError(f"the buses never carried every flow everywhere: {missing}")
            for name, conn in conns.items():
                conn.pub(*warm(name))
            time.sleep(pause)
    finally:
        for conn in conns.values():
            conn.close()


def drain(subs: Iterable[Subscriber], timeout: float = 60.0) -> None:
    """Wait until every subscriber has stopped receiving."""
    subs = list(subs)
    deadline = time.monotonic() + timeout
    last = -1
    while time.monotonic() < deadline:
        now = sum(len(v) for s in subs for v in s.got.values())
        if now == last:
            return
        last = now
        time.sleep(2.0)


# --- the faults both runs inflict ---------------------------------------------------------------


def drops_of(conn: Conn, timeout: float = 20.0, count: bytes | None = None) -> tuple[int, int]:
    """Ask the bus how many messages it dropped for ``conn``, reading what is queued
    meanwhile; (drops, packets read whose key begins with ``count``)."""
    conn.cmsg(b"drops/count")
    deadline = time.monotonic() + timeout
    seen = 0
    while True:
        packet = conn.recv(max(0.01, deadline - time.monotonic()))
        if packet.startswith(b"CMSG drops/count\0"):
            return int(packet.split(b"\0", 1)[1]), seen
        if count is not None and packet.startswith(b"MSG " + count):
            seen += 1


def flood(address: str, key: bytes, seconds: float) -> int:
    """Publish 1 KiB messages under ``key`` as fast as the bus at ``address`` takes
    them for ``seconds`` (less if that bus is killed meanwhile); how many."""
    sent = 0
    end = time.monotonic() + seconds
    with contextlib.suppress(Closed, OSError), connect_retry(address, 30.0) as flooder:
        while time.monotonic() < end:
            for _ in range(100):
                flooder.pub(key, FLOOD_PAYLOAD)
            sent += 100
    return sent


def slow_reader(address: str, pattern: bytes, seconds: float) -> dict[str, Any]:
    """A client of ``pattern`` reading one packet per 5 ms for ``seconds``, with
    the smallest receive buffer; what it read and what its bus dropped for it
    (None: the bus went away before it could say)."""
    read = 0
    drops: int | None = None
    with contextlib.suppress(Closed, OSError), connect_retry(address, 30.0) as reader:
        reader.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        reader.sub(pattern)
        reader.sync()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                reader.recv(0.1)
                read += 1
            time.sleep(0.005)
        reader.unsub(pattern)
        reader.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        drops, _ = drops_of(reader, timeout=60.0)
    return {"read": read, "reader_drops": drops}


def for_a_while(begin: Callable[[], None], end: Callable[[], None], seconds: float) -> float:
    """``begin``, ``seconds`` later ``end`` (whatever happened meanwhile); when it ended."""
    try:
        begin()
        time.sleep(seconds)
    finally:
        end()
    return time.monotonic()


# --- the windows -----------------------------------------------------------------------------


@dataclass
class Window:
    """One fault and its window: from ``BEFORE`` before it until ``settle``
    after it ended."""

    kind: str
    target: str
    start: float
    end: float = 0.0
    settle: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    own_drops: int = 0  # what the fault's own clients (flood, slow reader) lost
    #: a client of the fault's own was cut off before it could say what it lost:
    #: then none of the window's counts are taken for the flows
    own_unknown: bool = False

    def own(self, drops: int | None) -> None:
        if drops is None:
            self.own_unknown = True
        else:
            self.own_drops += drops

    def window(self) -> tuple[float, float]:
        return self.start - BEFORE, self.end + self.settle


def faults_at(faults: Sequence[Window], times: Sequence[float]) -> list[Any]:
    """The fault whose window holds each time (None: none), for times in order.

    Windows follow one another (a fault starts a quiet gap after the window
    before it has closed), so one pass over both lists places them all.
    """
    out: list[Window | None] = []
    i = 0
    for t in times:
        while i < len(faults) and faults[i].window()[1] < t:
            i += 1
        if i < len(faults) and faults[i].window()[0] <= t:
            out.append(faults[i])
        else:
            out.append(None)
    return out


@dataclass
class Flow:
    """What one bus's publisher sent and one bus's subscriber got of it."""

    src: str
    dst: str
    #: when each seq was published, and the fault whose window holds it (None: none)
    times: Sequence[float]
    placed: list[Any]
    #: the seqs in the order they arrived, and when
    got: Sequence[int]
    at: Sequence[float]


def flows(run: FaultRun) -> Iterator[Flow]:
    """Every flow of a run: each publisher to each subscriber."""
    for src, pub in run.pubs.items():
        placed = faults_at(run.faults, pub.sent)
        for dst, sub in run.subs.items():
            yield Flow(src, dst, pub.sent, placed, sub.got[src], sub.at[src])


def arrivals(got: Sequence[int]) -> tuple[set[int], list[tuple[int, int, int, str]]]:
    """The seqs that arrived in order the first time; and every other arrival:
    (its index, its seq, the highest seq before it, ``"twice"`` or ``"out_of_order"``)."""
    in_order: set[int] = set()
    disorder = []
    top = -1
    for k, seq in enumerate(got):
        if seq in in_order:
            disorder.append((k, seq, top, "twice"))
        elif seq < top:
            disorder.append((k, seq, top, "out_of_order"))
        else:
            in_order.add(seq)
            top = seq
    return in_order, disorder


def unseen(flow: Flow, seen: set[int]) -> Iterator[tuple[int, float, Any]]:
    """Each seq of a flow not in ``seen``: (seq, when published, its fault or None)."""
    for seq, t in enumerate(flow.times):
        if seq not in seen:
            yield seq, t, flow.placed[seq]


# --- the run ----------------------------------------------------------------------------


class FaultRun:
    """Publishers and subscribers on every bus, and faults one at a time with quiet
    gaps (``GAP``) between them, each kind once early in an order the seed draws,
    then at random; none later than ``TAIL`` before the end.  A run's own class
    makes the buses and the clients, and says what a fault does (``do``)."""

    KINDS: tuple[str, ...] = ()
    GAP: tuple[float, float] = (1.0, 3.0)
    TAIL = 8.0

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.buses: dict[str, Any] = {}
        self.pubs: dict[str, Publisher] = {}
        self.subs: dict[str, Any] = {}
        self.faults: list[Any] = []
        self.variant = 0
        self.t0 = time.monotonic()
        #: buses that no longer serve at the end (none may die by itself)
        self.gone: list[str] = []

    def warm_up(self) -> None:
        raise NotImplementedError

    def do(self, kind: str) -> Window:
        raise NotImplementedError

    def finished(self) -> None:
        """What a run does once its clients have stopped."""

    def next_variant(self) -> int:
        """A reload's variant of the ``-C`` file."""
        self.variant += 1
        return self.variant

    def run(self, duration: float) -> None:
        self.warm_up()
        for pub in self.pubs.values():
            pub.start()
        self.t0 = time.monotonic()
        order = list(self.KINDS)
        self.rng.shuffle(order)  # every kind at least once, early
        while time.monotonic() - self.t0 < duration - self.TAIL:
            time.sleep(self.rng.uniform(*self.GAP))
            kind = order.pop(0) if order else self.rng.choice(self.KINDS)
            self.do(kind)
        while time.monotonic() - self.t0 < duration:
            time.sleep(0.1)
        for pub in self.pubs.values():
            pub.stopping.set()
        for pub in self.pubs.values():
            pub.join(30)
        drain(self.subs.values())
        for sub in self.subs.values():
            sub.stopping.set()
            sub.join(10)
        self.finished()

    def stop_clients(self) -> None:
        for pub in self.pubs.values():
            pub.stopping.set()
        for sub in self.subs.values():
            sub.stopping.set()


# --- what the logs say ------------------------------------------------------------------


def identity_cuts(logs: dict[str, str]) -> int:
    """Relays cut off because their upstream's identity changed."""
    return sum(log.count("upstream_identity_changed") for log in logs.values())


def log_failures(logs: dict[str, str], faults: Sequence[Window]) -> list[str]:
    """The promises the buses' logs and the upgrades keep or break: every upgrade
    happened, every bad reload and nothing else was refused, no traceback or
    internal error, no relay cut off for its upstream's identity."""
    failures = []
    for fault in faults:
        if fault.detail.get("upgraded") is False:
            failures.append(f"the upgrade of {fault.target} did not happen within {START_WAIT}s")
    refused = sum(log.count('"config.refused"') for log in logs.values())
    bad = sum(f.kind.endswith("bad_reload") for f in faults)
    if refused != bad:
        failures.append(f"{bad} bad reloads, {refused} refused")
    for name, log in logs.items():
        if "Traceback" in log or "internal_error" in log:
            failures.append(f"a traceback or internal error in the log of {name}")
    cut = identity_cuts(logs)
    if cut:
        failures.append(f"{cut} relays were cut off because their identity changed")
    return failures
