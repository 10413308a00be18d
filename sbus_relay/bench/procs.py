"""Processes of one benchmark run: started, watched, and always cleaned up.

What it owns: the processes of one benchmark run, started and always cleaned
up.  What it may touch: those processes (ops.children).

Every child is registered in a ``ProcessSet`` that terminates, then kills, all
of them on exit, whatever the exit (error, Ctrl-C, SIGTERM turned into
``KeyboardInterrupt`` by the runner).  As a second line of defence each child
is started by ``ops.children.spawn``, which ties it to the runner's life: if
the runner itself is killed, its children die too.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from sbus_relay.ops import children
from sbus_relay.ops.addresses import answers

#: Seconds a server gets to exit after SIGTERM before SIGKILL.
STOP_GRACE = 3.0
#: Seconds a server may take from exec to accepting connections.
SERVER_START_TIMEOUT = 20.0
#: Lines of a failed server's stderr quoted in the error.
STDERR_TAIL_LINES = 15


class BenchProcessError(RuntimeError):
    """A benchmark process failed, timed out or printed something unexpected."""


class Child:
    """One child process whose stdout is read line by line by a daemon thread."""

    def __init__(self, name: str, popen: subprocess.Popen[str], stderr_path: Path | None) -> None:
        self.name = name
        self.popen = popen
        self.stderr_path = stderr_path
        self._lines: queue.Queue[str | None] = queue.Queue()
        if popen.stdout is not None:
            threading.Thread(target=self._pump, args=(popen.stdout,), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self, stream: IO[str]) -> None:
        with contextlib.suppress(ValueError, OSError):
            for line in stream:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def stderr_tail(self) -> str:
        """The last lines the child wrote to stderr, for error messages."""
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        lines = self.stderr_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-STDERR_TAIL_LINES:])

    def _fail(self, what: str) -> BenchProcessError:
        tail = self.stderr_tail()
        rc = self.popen.poll()
        status = "running" if rc is None else children.how_it_ended(rc)
        return BenchProcessError(f"{self.name}: {what} ({status})" + (f"\n{tail}" if tail else ""))

    def _await_line(self, wanted: Callable[[str], bool], what: str, timeout: float) -> str:
        """The first line the child prints that is ``wanted``; ``what`` names it in errors."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(f"no {what} within {timeout:.0f} s")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise self._fail(f"exited before printing {what}")
            if wanted(line):
                return line

    def expect(self, word: str, timeout: float) -> None:
        """Wait until the child prints the line ``word``."""
        self._await_line(lambda line: line == word, repr(word), timeout)

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the child to print its JSON line (loadgen's last output)."""
        line = self._await_line(lambda line: line.startswith("{"), "result", timeout)
        value: dict[str, Any] = json.loads(line)
        return value

    def tell(self, line: str) -> None:
        """Write one line to the child's stdin (loadgen's "go")."""
        if self.popen.stdin is None:
            raise BenchProcessError(f"{self.name}: no stdin pipe")
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def end_input(self) -> None:
        """Close the child's stdin: loadgen's signal to stop and report."""
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.popen.stdin.close()

    def stop(self, sig: int = signal.SIGTERM, grace: float = STOP_GRACE) -> None:
        """Close stdin, signal, wait ``grace`` seconds, then kill."""
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.popen.stdin.close()
        children.stop(self.popen, grace, sig=sig)
        if self.popen.stdout is not None:
            with contextlib.suppress(OSError, ValueError):
                self.popen.stdout.close()


class ProcessSet:
    """Owns every child of a scope; ``close`` stops them all, newest first."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = env
        self._children: list[Child] = []
        self._serial = 0

    def start(self, name: str, argv: Sequence[str], *, stdin: bool = False) -> Child:
        """Start ``argv``; stdout is captured, stderr goes to a log file in ``log_dir``."""
        self._serial += 1
        stderr_path = self.log_dir / f"{self._serial:03d}-{name}.stderr"
        popen = children.spawn(
            argv,
            log=stderr_path,
            append=False,
            stdin_pipe=stdin,
            stdout="pipe",
            env=self.env,
            text=True,
        )
        child = Child(name, popen, stderr_path)
        self._children.append(child)
        return child

    def close(self) -> None:
        while self._children:
            self._children.pop().stop()

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def wait_accepting(address: str, child: Child, timeout: float = SERVER_START_TIMEOUT) -> None:
    """Wait until a server listens at ``address`` (a path); fail early if it exits."""
    deadline = time.monotonic() + timeout
    while True:
        if child.popen.poll() is not None:
            raise child._fail("exited while starting")
        with contextlib.suppress(OSError):
            if answers(address):
                return
        if time.monotonic() > deadline:
            raise child._fail(f"not accepting on {address} within {timeout:.0f} s")
        time.sleep(0.02)


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchProcessError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, in seconds.

    /proc/PID/task/TID/schedstat counts on-CPU nanoseconds, finer than the
    clock ticks of /proc/PID/stat (10 ms), which a short run needs.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9
