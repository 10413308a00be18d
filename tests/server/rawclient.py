"""A raw sbus client and a real-server fixture for the tests in tests/server.

The client speaks the wire protocol over a bare ``AF_UNIX``/``SOCK_SEQPACKET``
socket and never imports ``sbus_relay.client``: passing tests against it prove
that any reference-protocol client works with our server (the drop-in promise).

Server processes come from ``tests/support.py`` (``start_bus``).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.rawsocket import WHOAMI as WHOAMI
from tests.rawsocket import Closed as Closed
from tests.rawsocket import RawConnection
from tests.support import start_bus

#: Seconds a test waits for a packet that must come.
DEFAULT_TIMEOUT = 5.0
#: Seconds a test listens for a packet that must not come.
QUIET_WINDOW = 0.3


class RawClient(RawConnection):
    """One connection to the bus, speaking raw packets.

    The socket work (receiving with truncation detection, whoami with packets
    held pending) is ``tests.rawsocket.RawConnection``, shared with the
    hardening runs; this adds what tests need.
    """

    def __init__(
        self,
        address: str | bytes | None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        sock: socket.socket | None = None,
    ) -> None:
        """Connect to ``address`` (a path, or a whole abstract sun_path), or wrap ``sock``."""
        super().__init__(address, timeout, sock=sock)

    # --- sending -----------------------------------------------------------
    def send(self, packet: bytes) -> None:
        """Send one packet (SOCK_SEQPACKET sends it whole or not at all)."""
        self.sock.settimeout(self.timeout)
        sent = self.sock.send(packet)
        assert sent == len(packet)

    def try_send(self, packet: bytes) -> bool:
        """Send unless the server has already closed us (then return False)."""
        try:
            self.send(packet)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def grow_sndbuf(self, size: int = 1 << 20) -> None:
        """Room to send packets near the 409,600-byte limit (default is ~208 KiB)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)

    def sub(self, pattern: bytes, *, sync: bool = True) -> None:
        """Subscribe; with ``sync`` wait until the server has processed it."""
        self.send(b"SUB " + pattern)
        if sync:
            self.sync()

    def unsub(self, pattern: bytes, *, sync: bool = True) -> None:
        self.send(b"UNSUB " + pattern)
        if sync:
            self.sync()

    # --- receiving ---------------------------------------------------------
    def recv_packet(self, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        """The next packet; raises ``TimeoutError`` or ``Closed``."""
        return self._next_packet(timeout)

    def expect_nothing(self, window: float = QUIET_WINDOW) -> None:
        """Assert that no packet arrives within ``window`` seconds."""
        try:
            packet = self.recv_packet(window)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {packet[:80]!r}")

    def expect_closed(self, timeout: float = DEFAULT_TIMEOUT) -> list[bytes]:
        """Read until the server closes us; return what came before. Fails on timeout."""
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"still connected after {timeout}s (got {len(got)} packets)")
            try:
                got.append(self.recv_packet(left))
            except Closed:
                return got
            except TimeoutError as exc:
                raise AssertionError(
                    f"still connected after {timeout}s (got {len(got)} packets)"
                ) from exc

    def whoami(self, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        """Ask for credentials; returns the reply's payload (other packets stay pending)."""
        return self._whoami(timeout)

    def sync(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Round-trip a whoami so everything sent before it has been processed.

        The server handles one client's packets in order, so its answer proves that
        earlier SUB/UNSUB/CMSG packets took effect.  Packets that arrive meanwhile are
        kept and returned by later ``recv_packet`` calls.
        """
        self.whoami(timeout)

    def inq(self) -> int:
        """Bytes waiting in this socket's kernel receive queue (FIONREAD)."""
        buf = array.array("i", [0])
        fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, buf)
        return buf[0]

    def shrink_rcvbuf(self) -> None:
        """Ask for the smallest receive buffer the kernel allows."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)


def own_creds() -> tuple[int, int, int]:
    """(gid, uid, pid) as the server sees this process through SO_PEERCRED."""
    return os.getgid(), os.getuid(), os.getpid()


def secret_key(rest: bytes, creds: tuple[int, int, int] | None = None) -> bytes:
    gid, uid, pid = creds or own_creds()
    return b"!/cred/%d/%d/%d/" % (gid, uid, pid) + rest


# --- server processes --------------------------------------------------------


def wait_accepting(
    address: str | bytes, proc: subprocess.Popen[Any] | None, timeout: float = 10.0
) -> None:
    """Poll until ``address`` accepts a connection (or the process died)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited early with {proc.returncode}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(address)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
        finally:
            probe.close()


def connect_address(address: str) -> str | bytes:
    """What ``socket.connect`` takes for a printed address (abstract: the raw sun_path)."""
    prefix = "/dev/unix/abstract/"
    if address.startswith(prefix):
        return bytes.fromhex(address[len(prefix) :])
    return address


@contextlib.contextmanager
def running_bus(tmp_path: Path, *args: str, command: str = "sbusd") -> Iterator[Any]:
    """``tests.support.start_bus`` as a context manager (stopped with SIGTERM)."""
    bus = start_bus(tmp_path, *args, command=command)
    try:
        yield bus
    finally:
        bus.stop(signal.SIGTERM)


# --- fixture bodies shared by the test modules ---------------------------------

#: An exact key every fenced subscriber holds; see ``fenced``.
FENCE = b"zz-fence"
FENCE_PACKET = b"MSG " + FENCE + b"\0end"


def module_bus(tmp_path_factory: Any, *args: str, command: str = "sbusd") -> Iterator[Any]:
    """Body of a module-scoped ``bus`` fixture: one server for the whole module."""
    with running_bus(tmp_path_factory.mktemp("bus"), *args, command=command) as bus:
        yield bus


def client_factory(bus: Any) -> Iterator[Any]:
    """Body of a ``connect`` fixture: makes clients, closes them, checks the server lived."""
    made: list[RawClient] = []

    def make() -> RawClient:
        client = RawClient(connect_address(bus.address))
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
    assert bus.proc.poll() is None, "the server died during the test"


def fenced(client: RawClient, *patterns: bytes) -> RawClient:
    """Subscribe to ``patterns`` and the fence; return once the server took them.

    A publisher publishes the message under test and then the fence; one
    publisher's messages reach a subscriber in order, so a fence that arrives
    first proves the message was not delivered -- no sleeping needed.
    """
    for pattern in patterns:
        client.sub(pattern, sync=False)
    client.sub(FENCE)
    return client


def publish_then_fence(publisher: RawClient, key: bytes, payload: bytes = b"p") -> bytes:
    packet = publisher.pub(key, payload)
    publisher.pub(FENCE, b"end")
    return packet
