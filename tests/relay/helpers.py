"""Helpers for hierarchy tests: real bus processes, raw clients, metrics scrapes.

Every bus here is a real ``sbus-relay serve -f`` process (``tests/support.py``)
with its Prometheus endpoint on a free port, so a test can *observe* a server
(what it received, what it forwarded, what its upstream told it) instead of
inferring it from timing.  Clients are bare ``SOCK_SEQPACKET`` sockets, so what
they see is exactly what the relay put on the wire.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from tests.support import BusProcess, free_port, start_bus

#: Seconds a test waits for something that must happen.
WAIT = 8.0
#: Seconds a client keeps listening after the expected copies, to catch extra ones.
DRAIN = 0.3
#: One byte more than the largest legal packet (docs/protocol.md), so truncation shows.
RECV_BUFFER = 409_601
WHOAMI = b"!/cred/whoami"

T = TypeVar("T")


def wait_until(check: Callable[[], T], what: str, timeout: float = WAIT) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Bus:
    """A running ``sbus-relay serve`` with metrics: ``address``, ``pid``, ``metric()``."""

    def __init__(
        self, tmp_path: Path, address: str, *args: str, upstream: str | None = None
    ) -> None:
        self.port = free_port()
        argv = ["-a", address, "--metrics", f"127.0.0.1:{self.port}", "--log-format", "json"]
        if upstream is not None:
            argv += ["--upstream", upstream]
        self.process: BusProcess = start_bus(tmp_path, *argv, *args, command="serve")
        self.address = address
        # serve binds the bus socket first and starts /metrics a moment later
        wait_until(self._metrics_up, f"/metrics of {address}")

    def _metrics_up(self) -> bool:
        if self.process.proc.poll() is not None:
            raise AssertionError(f"{self.address} exited:\n{self.log()}")
        try:
            self.metrics()
        except OSError:
            return False
        return True

    @property
    def pid(self) -> int:
        return self.process.proc.pid

    def metrics(self) -> dict[str, float]:
        """One scrape of /metrics as ``{'name{labels}': value}`` (labels as printed)."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                # drop the instance label, which every sample carries
                samples[_without_instance(name)] = float(value)
        return samples

    def metric(self, name: str) -> float:
        """One sample, e.g. ``sbus_packets_received_total{type="msg"}`` (0 if absent)."""
        return self.metrics().get(name, 0.0)

    def log(self) -> str:
        return self.process.stderr_text()

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines whose event is exactly ``name``."""
        lines = (json.loads(line) for line in self.log().splitlines() if line.startswith("{"))
        return [e for e in lines if e.get("event") == name]

    def wait_log(self, needle: str, timeout: float = WAIT) -> None:
        """Wait until the server has logged ``needle`` (an event name)."""
        wait_until(
            lambda: needle in self.log(), f"{needle!r} in the log of {self.address}", timeout
        )

    def wait_metric(self, name: str, value: float, timeout: float = WAIT) -> None:
        """Wait until a sample equals ``value``; the failure shows the last value."""
        last: list[float] = []

        def check() -> bool:
            last[:] = [self.metric(name)]
            return last[0] == value

        try:
            wait_until(check, f"{name} == {value}", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last value {last}\n{self.log()[-3000:]}") from None

    def kill(self) -> None:
        """SIGKILL: no clean-up, the socket file stays behind (a crash)."""
        self.process.proc.kill()
        self.process.proc.wait()

    def stop(self) -> None:
        if self.process.proc.poll() is None:
            self.process.stop()


def _without_instance(name: str) -> str:
    if "{" not in name:
        return name
    head, _, labels = name.partition("{")
    kept = [part for part in labels.rstrip("}").split(",") if not part.startswith("instance=")]
    return f"{head}{{{','.join(kept)}}}" if kept else head


class Peer:
    """One raw client connection; packets read while waiting for a reply are kept."""

    def __init__(self, address: str, timeout: float = WAIT) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout)
        self.sock.connect(address)
        self._held: deque[bytes] = deque()

    def send(self, packet: bytes) -> None:
        self.sock.send(packet)

    def sub(self, pattern: bytes) -> None:
        """Subscribe and wait until the server has processed it (see ``sync``)."""
        self.send(b"SUB " + pattern)
        self.sync()

    def unsub(self, pattern: bytes) -> None:
        self.send(b"UNSUB " + pattern)
        self.sync()

    def pub(self, key: bytes, payload: bytes = b"") -> bytes:
        """Publish; returns the packet, which is what every subscriber must receive."""
        packet = b"MSG " + key + b"\0" + payload
        self.send(packet)
        return packet

    def whoami(self, timeout: float = WAIT) -> bytes:
        """Our identity as this bus states it (docs/protocol.md)."""
        self.send(b"CMSG " + WHOAMI)
        reply = b"CMSG " + WHOAMI + b"\0"
        deadline = time.monotonic() + timeout
        held: list[bytes] = []
        try:
            while True:
                packet = self._recv(max(0.001, deadline - time.monotonic()))
                if packet.startswith(reply):
                    return packet[len(reply) :]
                held.append(packet)
        finally:
            self._held.extend(held)

    def sync(self) -> None:
        """A whoami round trip: the server handles a client's packets in order,
        so its answer proves that everything sent before took effect."""
        self.whoami()

    def recv(self, timeout: float = WAIT) -> bytes:
        """The next packet (``TimeoutError`` if none)."""
        if self._held:
            return self._held.popleft()
        return self._recv(timeout)

    def _recv(self, timeout: float) -> bytes:
        self.sock.settimeout(timeout)
        data = self.sock.recv(RECV_BUFFER)
        if not data:
            raise ConnectionResetError("the bus closed the connection")
        return data

    def messages(self, expected: int, drain: float = DRAIN, timeout: float = WAIT) -> list[bytes]:
        """MSG packets: wait for ``expected``, then keep listening ``drain`` seconds
        so that any extra copy is caught too (control packets are skipped)."""
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < expected:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                packet = self.recv(left)
            except TimeoutError:
                break
            if packet.startswith(b"MSG "):
                got.append(packet)
        end = time.monotonic() + drain
        while (left := end - time.monotonic()) > 0:
            try:
                packet = self.recv(left)
            except TimeoutError:
                break
            if packet.startswith(b"MSG "):
                got.append(packet)
        return got

    def is_closed(self, timeout: float = WAIT) -> bool:
        """True if the server closes us within ``timeout`` (packets are discarded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self._recv(max(0.001, deadline - time.monotonic()))
            except (ConnectionResetError, BrokenPipeError):
                return True
            except TimeoutError:
                return False
        return False

    def close(self) -> None:
        self.sock.close()


def copies(packets: Iterable[bytes]) -> Counter[bytes]:
    """How many times each packet arrived."""
    return Counter(packets)


def identity(*pids: int) -> bytes:
    """The whoami chain for a client whose path down is ``pids`` (relays first)."""
    gid, uid = os.getgid(), os.getuid()
    return b"/".join(b"!/cred/%d/%d/%d" % (gid, uid, pid) for pid in pids)
