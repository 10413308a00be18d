"""Becoming a daemon, and pid files (docs/protocol.md, Addresses: ``sbusd`` without ``-f``).

The classic double fork: fork, ``setsid`` (new session, no controlling
terminal), fork again (a non-leader can never reacquire one), ``chdir("/")``.
The original process waits on a pipe until the daemon says it is ready -- the
socket is already listening (it is bound before the fork, so bind errors reach
the terminal), the pid file is written and the server has started -- and only
then exits, so that ``sbusd && sbus-relay pub ...`` works.  Call this before
anything starts a gevent hub or threads: only the forking thread survives.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Callable

from sbus_relay.protocol.errors import SbusError
from sbus_relay.protocol.limits import DAEMON_READY_TIMEOUT

#: A pid file path that means "no pid file" (docs/protocol.md, Addresses).
NO_PIDFILE = os.devnull
_READY = b"\0"
_FAILED = b"\1"
#: Bytes of an error message the daemon passes back to the waiting parent.
_MAX_REPORT = 4096


class DaemonError(SbusError):
    """The daemon could not finish starting; the waiting parent has the reason."""


def daemonize(
    pidfile: str, *, ready_timeout: float = DAEMON_READY_TIMEOUT, keep_stderr: bool = True
) -> Callable[[], None]:
    """Detach; returns only in the daemon, with a function to call once ready.

    ``keep_stderr`` False points stderr at /dev/null too (the log goes
    elsewhere); otherwise a stderr that is a file or pipe is kept.

    The original process exits 0 when that function is called, or 1 (after
    printing the daemon's reason, if it gave one) when the daemon exits first
    or is not ready within ``ready_timeout`` seconds.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    first = os.fork()
    if first > 0:
        os.close(write_fd)
        status = _wait_ready(read_fd, ready_timeout)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(first, 0)  # reap the intermediate child
        os._exit(status)  # not sys.exit: the daemon owns the socket and its cleanup
    os.close(read_fd)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    try:
        write_pidfile(pidfile, os.getpid())
    except OSError as exc:
        reason = f"cannot write pid file {pidfile}: {exc.strerror or exc}"
        _report(write_fd, reason)
        # Raised, not _exit: the caller still removes the socket file it made.
        raise DaemonError(reason) from exc
    _detach_stdio(keep_stderr)

    def ready() -> None:
        with contextlib.suppress(OSError):
            os.write(write_fd, _READY)
            os.close(write_fd)

    return ready


def _report(fd: int, message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, _FAILED + message.encode("utf-8", "replace")[:_MAX_REPORT])
        os.close(fd)


def _wait_ready(fd: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            sys.stderr.write("sbusd: the daemon did not become ready in time\n")
            return 1
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, _MAX_REPORT + 1)
        if not chunk:
            break
        data += chunk
        if data[:1] == _READY:
            return 0
    if data[:1] == _FAILED:
        sys.stderr.write(f"sbusd: {data[1:].decode('utf-8', 'replace')}\n")
    else:
        sys.stderr.write("sbusd: the daemon exited before it was ready\n")
    return 1


def _detach_stdio(keep_stderr: bool) -> None:
    """Point stdin and stdout at /dev/null; stderr too when it is a terminal.

    A stderr that is a file or pipe is kept (unless not ``keep_stderr``), so
    ``sbusd 2>>log`` still logs.  The terminal is never kept: it is not ours.
    """
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if os.isatty(2) or not keep_stderr:
        os.dup2(null, 2)
    if null > 2:
        os.close(null)


def close_stdin_stdout() -> None:
    """``-f``: stdin and stdout are closed (docs/protocol.md, Addresses).

    They are pointed at /dev/null rather than closed, so that descriptors 0 and
    1 cannot be reused by a client socket that a stray print would then corrupt.
    """
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if null > 2:
        os.close(null)


def write_pidfile(path: str, pid: int) -> None:
    """Write ``pid`` to ``path`` atomically (``/dev/null`` means no pid file)."""
    if path == NO_PIDFILE:
        return
    temporary = f"{path}.{pid}.tmp"
    with open(temporary, "w", encoding="ascii") as stream:
        stream.write(f"{pid}\n")
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def remove_pidfile(path: str, pid: int) -> None:
    """Remove ``path`` if it still names ``pid`` (never another instance's file)."""
    if path == NO_PIDFILE:
        return
    try:
        with open(path, encoding="ascii") as stream:
            content = stream.read().strip()
    except OSError:
        return
    if content == str(pid):
        with contextlib.suppress(OSError):
            os.unlink(path)
