"""What every hardening run needs: server processes, raw clients, forked children.

Servers are real processes (``sbusd``, ``sbus-relay serve`` or the reporting
``harness.host``) started from this interpreter's venv and waited on until
``/proc/net/unix`` shows them listening.  Clients are bare SOCK_SEQPACKET
sockets speaking the wire protocol, so nothing here trusts ``sbus_relay.client``.
Children are plain ``os.fork()`` processes that send a JSON result back through
a pipe: every child has its own pid, hence its own sbus identity (docs/protocol.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# WHOAMI and Closed are re-exported: the hardening modules take them from here.
from tests.rawsocket import WHOAMI as WHOAMI
from tests.rawsocket import Closed as Closed
from tests.rawsocket import RawConnection, seqpacket_listening

#: The checkout this harness lives in.
REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
#: The venv's bin directory: ``sbusd`` and ``sbus-relay`` live beside the interpreter.
VENV_BIN = os.path.dirname(sys.executable)
#: Seconds a server gets to start listening.
START_TIMEOUT = 15.0
#: Seconds a server gets to exit after SIGINT before it counts as hung.
STOP_TIMEOUT = 10.0
#: Largest legal packet (docs/protocol.md).
MAX_PACKET = 409_600
#: Seconds a raw client waits for a packet that must come.
DEFAULT_TIMEOUT = 10.0
#: Bytes per page, for /proc/PID/statm.
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def short_dir() -> str:
    """A fresh directory under the temporary one: socket paths must fit in 108 bytes."""
    return tempfile.mkdtemp(prefix="sbh-")


def raise_nofile(want: int) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit towards ``want``; the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, want), hard if hard != resource.RLIM_INFINITY else want)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def is_listening(path: str) -> bool:
    """True when a SEQPACKET socket listens on the file ``path`` (per /proc/net/unix)."""
    return seqpacket_listening(os.path.abspath(path))


class ServerProc:
    """A server process on a path socket.  ``kind``: sbusd, serve or host."""

    def __init__(
        self,
        address: str,
        args: Sequence[str] = (),
        *,
        kind: str = "sbusd",
        log_path: str | None = None,
        nofile: int | None = None,
        remove_stale: bool = False,
    ) -> None:
        self.address = address
        self.kind = kind
        self.log_path = log_path or address + f".{kind}.log"
        self.stats_path = address + ".stats.json"
        if kind == "sbusd":
            argv = [os.path.join(VENV_BIN, "sbusd")]
        elif kind == "serve":
            argv = [os.path.join(VENV_BIN, "sbus-relay"), "serve"]
        elif kind == "host":
            argv = [
                sys.executable,
                "-m",
                "tests.hardening.harness.host",
                "--stats",
                self.stats_path,
            ]
        else:
            raise ValueError(f"unknown server kind {kind!r}")
        self.argv = [*argv, "-f", "-a", address, *(["-r"] if remove_stale else []), *args]
        limit = nofile

        def preexec() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        with open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=preexec if nofile is not None else None,
                cwd=REPO_ROOT,  # ``-m tests.hardening.harness.host`` imports from the checkout
            )
        self.pid = self.proc.pid
        deadline = time.monotonic() + START_TIMEOUT
        while not is_listening(address):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"{' '.join(self.argv)} did not start (exit {self.proc.returncode}):\n"
                    + self.log_text()[-3000:]
                )
            time.sleep(0.01)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def rss_kib(self) -> int:
        """Resident set size in KiB (/proc/PID/statm)."""
        with open(f"/proc/{self.pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_KIB

    def fd_count(self) -> int:
        """Open descriptors (/proc/PID/fd)."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def settled_fd_count(self) -> int:
        """Descriptors once the event loop exists (it is made after the listener)."""
        with Conn(self.address) as probe:
            probe.whoami()
        time.sleep(0.1)
        return self.fd_count()

    def stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The counters of a ``host`` server (asked with SIGUSR1, or left at exit)."""
        if self.kind != "host":
            raise ValueError("only a 'host' server reports its counters")
        before = os.stat(self.stats_path).st_mtime_ns if os.path.exists(self.stats_path) else 0
        if self.alive():
            self.proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + timeout
            while True:
                path = self.stats_path
                if os.path.exists(path) and os.stat(path).st_mtime_ns != before:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the server did not write its counters")
                time.sleep(0.01)
        with open(self.stats_path) as src:
            data: dict[str, Any] = json.load(src)
        return data

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGINT and wait; a server that ignores it is killed and reported."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"server ignored SIGINT for {timeout}s") from None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (a crash, as far as everyone else can tell) and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Conn(RawConnection):
    """A raw sbus connection: packets out, packets in, nothing hidden.

    A send to a server that has closed us raises ``Closed``; ``recv`` and
    ``whoami`` wait ``timeout`` seconds unless told otherwise.
    """

    def __init__(self, address: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(address, timeout)

    def send(self, packet: bytes) -> None:
        try:
            self.sock.send(packet)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise Closed(str(exc)) from exc

    def sub(self, pattern: bytes) -> None:
        self.send(b"SUB " + pattern)

    def unsub(self, pattern: bytes) -> None:
        self.send(b"UNSUB " + pattern)

    def recv(self, timeout: float | None = None) -> bytes:
        """The next packet; ``TimeoutError`` or ``Closed``."""
        return self._next_packet(self.timeout if timeout is None else timeout)

    def whoami(self, timeout: float | None = None) -> bytes:
        """Our identity chain; packets that arrive meanwhile stay pending, in order."""
        return self._whoami(self.timeout if timeout is None else timeout)

    sync = whoami  # the server handles one client's packets in order


def connect_retry(address: str, timeout: float = 10.0) -> Conn:
    """Connect, retrying while the server is (re)starting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return Conn(address)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class Child:
    """A forked process running one function; its JSON result comes back by pipe."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run, report, never return into the caller's stack
            os.close(read_end)
            status = 0
            try:
                out = json.dumps({"ok": fn(*args)}).encode()
            except BaseException:
                out = json.dumps({"error": traceback.format_exc()}).encode()
                status = 1
            try:
                view = memoryview(out)
                while view:
                    view = view[os.write(write_end, view) :]
            finally:
                os._exit(status)
        os.close(write_end)
        self.pid = pid
        self._fd = read_end
        self._data = b""
        self._status: int | None = None

    def result(self, timeout: float) -> Any:
        """Wait for the child's return value; its exception is re-raised here."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise TimeoutError(f"child {self.pid} gave no result in {timeout}s")
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:
                    break
                self._data += chunk
        os.close(self._fd)
        self._fd = -1
        self._reap()
        if not self._data:
            raise RuntimeError(f"child {self.pid} died without a result")
        reply = json.loads(self._data)
        if "error" in reply:
            raise RuntimeError(f"child {self.pid} failed:\n{reply['error']}")
        return reply["ok"]

    def kill(self) -> None:
        """SIGKILL the child (it vanishes mid-whatever) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._reap()

    def _reap(self) -> None:
        if self._status is None:
            _, self._status = os.waitpid(self.pid, 0)


def cleanup_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
