"""Real server processes for tests (docs/design.md "Tests").

``start_bus`` runs ``sbusd`` or ``sbus-relay serve`` from this venv in the
foreground and returns once its socket is listening.  Readiness is read from
``/proc/net/unix`` (a listening SEQPACKET socket with our name) rather than by
connecting, so that waiting is not itself a client: with ``-c`` a probe
connection leaving would make the server exit.

Socket paths must fit in 108 bytes, so sockets live in a short directory under
/tmp, not in pytest's long ``tmp_path``.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from sbus_relay.ops.children import process_status
from tests.rawsocket import seqpacket_listening

#: The venv's bin directory (the server commands live beside the interpreter).
VENV_BIN = os.path.dirname(sys.executable)
#: Seconds a server gets to start listening before the test fails.
START_TIMEOUT = 15.0
#: Seconds a server gets to exit after a signal.
STOP_TIMEOUT = 10.0
#: Seconds to read the abstract address a server prints on stdout.
PRINT_TIMEOUT = 15.0
#: Most bytes read back from a child's stdout or stderr in a helper.
_READ_LIMIT = 1 << 20


#: Where test servers' TCP ports are drawn from: below the kernel's ephemeral
#: range (``ip_local_port_range``, 32768 up by default), so the local port of an
#: outgoing connection (a link's, a client's) never takes one between its choice
#: and its server's bind, as a port the kernel hands out for bind(0) can.
PORTS_FROM = 20_000
#: Ports tried for one free one before giving up.
PORT_TRIES = 500
_ports_given: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody is bound to now, never handed out
    before in this process, below the ephemeral range (``PORTS_FROM``)."""
    import random

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32_768
    low, high = (PORTS_FROM, ephemeral) if ephemeral - PORTS_FROM >= 1000 else (1024, ephemeral)
    for _ in range(PORT_TRIES):
        port = random.randrange(low, high)
        if port in _ports_given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {low}-{high} after {PORT_TRIES} tries")


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: neither gone (even while /proc is read: a
    process reaped then says ESRCH) nor a zombie waiting to be reaped."""
    status = process_status(pid)
    return status is not None and status[0] != "Z"


def rss(pid: int) -> int:
    """Resident set size of a process, in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def short_dir() -> str:
    """A fresh directory whose socket paths stay well under 108 bytes."""
    return tempfile.mkdtemp(prefix="sbus-")


def command_argv(command: str) -> list[str]:
    """``"sbusd"`` or ``"serve"`` -> the argv prefix from this venv."""
    if command == "sbusd":
        return [os.path.join(VENV_BIN, "sbusd")]
    if command == "serve":
        return [os.path.join(VENV_BIN, "sbus-relay"), "serve"]
    raise ValueError(f"unknown server command {command!r}")


def _given_address(args: Sequence[str]) -> str | None:
    """The value of -a/--address in ``args``, if any."""
    for i, arg in enumerate(args):
        if arg in ("-a", "--address") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--address="):
            return arg.split("=", 1)[1]
        if arg.startswith("-") and not arg.startswith("--"):
            # getopt-style clusters such as -gca/tmp/bus or -fa /tmp/bus
            for j, letter in enumerate(arg[1:], start=2):
                if letter == "a":
                    value = arg[j:]
                    if value:
                        return value
                    return args[i + 1] if i + 1 < len(args) else None
                if letter in "pu":  # these take the rest as their value
                    break
    return None


def _proc_net_unix_name(address: str) -> str | None:
    """How /proc/net/unix shows ``address`` (abstract names: @ for NULs)."""
    prefix = "/dev/unix/abstract/"
    if address.startswith(prefix):
        raw = bytes.fromhex(address[len(prefix) :])
        return raw.decode("latin-1").replace("\0", "@")
    if address.startswith("/dev/fd/"):
        return None
    return os.path.abspath(address)


def is_listening(address: str) -> bool:
    """True when a SEQPACKET socket listens on ``address`` (per /proc/net/unix)."""
    name = _proc_net_unix_name(address)
    if name is None:
        return True  # an inherited listener was listening before we started
    return seqpacket_listening(name)


def read_line(stream: int, timeout: float) -> bytes:
    """One line from descriptor ``stream`` within ``timeout`` seconds (b"" at EOF)."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data and len(data) < _READ_LIMIT:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no full line within {timeout}s; got {data!r}")
        readable, _, _ = select.select([stream], [], [], remaining)
        if readable:
            chunk = os.read(stream, 1)  # byte by byte: leave the rest for later readers
            if not chunk:
                return data
            data += chunk
    return data


def wait_for_text(path: str, needle: str, timeout: float, proc: subprocess.Popen[bytes]) -> str:
    """Wait until the file at ``path`` (a child's stderr) contains ``needle``."""
    deadline = time.monotonic() + timeout
    while True:
        text = Path(path).read_text(errors="replace")
        if needle in text:
            return text
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} never appeared (exit {proc.poll()}):\n{text}")
        time.sleep(0.02)


class BusProcess:
    """A running server process: ``address``, ``proc``, ``stop()``, ``stderr_text()``."""

    def __init__(
        self,
        tmp_path: Path,
        args: Sequence[str],
        *,
        command: str = "sbusd",
        env: Mapping[str, str] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.dir = short_dir()
        self.stderr_path = os.path.join(tmp_path, f"{command}-{os.path.basename(self.dir)}.err")
        given = _given_address(args)
        extra = [] if given is not None else ["-a", os.path.join(self.dir, "bus")]
        self.argv = [*command_argv(command), "-f", *extra, *args]
        full_env = dict(os.environ if env is None else env)
        with open(self.stderr_path, "wb") as err:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=full_env,
                pass_fds=tuple(pass_fds),
            )
        try:
            self.address = self._resolve_address(given if given is not None else extra[1])
            self._wait_listening()
        except BaseException:
            self._kill()
            raise

    def _resolve_address(self, given: str) -> str:
        assert self.proc.stdout is not None
        if given == "/dev/unix/abstract":
            # protocol.md: the server prints the name it chose, then closes stdout.
            try:
                line = read_line(self.proc.stdout.fileno(), PRINT_TIMEOUT)
            except TimeoutError as exc:
                raise AssertionError(f"no address printed: {exc}\n{self.stderr_text()}") from exc
            if not line.endswith(b"\n"):
                raise AssertionError(f"no address printed ({line!r}):\n{self.stderr_text()}")
            return line.decode().rstrip("\n")
        if given.startswith("/dev/fd/"):
            # The inherited socket has the same number here: ask it its name.
            probe = socket.socket(fileno=os.dup(int(given[len("/dev/fd/") :])))
            try:
                name = probe.getsockname()
            finally:
                probe.close()
            if isinstance(name, bytes) and name[:1] == b"\0":
                return "/dev/unix/abstract/" + name.ljust(108, b"\0").hex()
            return os.fsdecode(name)
        return given

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not is_listening(self.address):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{' '.join(self.argv)} exited with {self.proc.returncode} before "
                    f"listening:\n{self.stderr_text()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{' '.join(self.argv)} not listening on {self.address} after "
                    f"{START_TIMEOUT}s:\n{self.stderr_text()}"
                )
            time.sleep(0.02)

    def stderr_text(self) -> str:
        """Everything the server wrote to stderr so far (its logs)."""
        try:
            return Path(self.stderr_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGINT, timeout: float = STOP_TIMEOUT) -> int:
        """Send ``sig`` and wait; the exit status.  A server that hangs is killed
        and reported, since a clean stop is part of the contract (docs/protocol.md)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
                raise AssertionError(
                    f"server ignored signal {sig} for {timeout}s:\n{self.stderr_text()}"
                ) from None
        self._cleanup()
        return self.proc.returncode

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BusProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._kill()
        else:
            self.stop()


def start_bus(
    tmp_path: Path,
    *args: str,
    command: str = "sbusd",
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> BusProcess:
    """Start ``sbusd -f`` (or ``sbus-relay serve -f``) with ``args``; wait until it listens.

    Adds ``-a <short tmp path>`` unless ``args`` name an address.
    """
    return BusProcess(tmp_path, args, command=command, env=env, pass_fds=pass_fds)


def run_cli(
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``sbus-relay ARGS`` to completion and capture its output."""
    return subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), *args],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        env=dict(os.environ if env is None else env),
        timeout=timeout,
        check=False,
    )
