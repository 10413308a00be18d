"""Becoming a daemon, and pid files (docs/protocol.md, Addresses: ``sbusd`` without ``-f``).

The classic double fork: fork, ``setsid`` (new session, no controlling
terminal), fork again (a non-leader can never reacquire one), ``chdir("/")``.
The original process waits on a pipe until the daemon says it is ready -- the
socket is already listening (it is bound before the fork, so bind errors reach
the terminal), the pid file is written and the server has started -- and only
then exits, so that ``sbusd && sbus-relay pub ...`` works.  Call this before
anything starts a gevent hub or threads: only the forking thread survives.

A daemon keeps none of its caller's pipes or terminal: ``sbusd | tail`` and
``$(sbusd)`` return once it is ready.  Only a stderr redirected to a regular
file (``sbusd 2>>log``) is kept for the log; otherwise the log goes where
``log_file`` says, or to syslog (the journal).  One pid file holds one bus:
a pid file that names a running bus is never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import sys
import time
from collections.abc import Callable

from sbus_relay.protocol.errors import SbusError, UsageError
from sbus_relay.protocol.limits import DAEMON_READY_TIMEOUT

#: A pid file path that means "no pid file" (docs/protocol.md, Addresses).
NO_PIDFILE = os.devnull
_READY = b"\0"
_FAILED = b"\1"
#: Bytes of an error message the daemon passes back to the waiting parent.
_MAX_REPORT = 4096
#: Bytes read of a pid file (a pid and a newline) and of a process's command line.
_MAX_PID_TEXT = 64
_MAX_CMDLINE = 4096


class DaemonError(SbusError):
    """The daemon could not finish starting; the waiting parent has the reason."""


def daemonize(
    pidfile: str,
    *,
    ready_timeout: float = DAEMON_READY_TIMEOUT,
    keep_stderr: bool = True,
    announce: Callable[[int], str] | None = None,
) -> Callable[[], None]:
    """Detach; returns only in the daemon, with a function to call once ready.

    ``keep_stderr`` keeps a stderr that is a regular file (``stderr_is_a_file``);
    anything else -- a pipe, a socket, a terminal -- is pointed at /dev/null.

    The original process exits 0 when that function is called, or 1 (after
    printing the daemon's reason, if it gave one) when the daemon exits first
    or is not ready within ``ready_timeout`` seconds.  ``announce``, given the
    daemon's pid, makes the line that the original process prints on its
    stderr once the daemon is ready (``sbusd``, as the reference, says nothing).
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
    except (OSError, UsageError) as exc:
        reason = str(exc)
        if isinstance(exc, OSError):
            reason = f"cannot write pid file {pidfile}: {exc.strerror or exc}"
        _report(write_fd, reason)
        # Raised, not _exit: the caller still removes the socket file it made.
        raise DaemonError(reason) from exc
    _detach_stdio(keep_stderr)
    line = announce(os.getpid()) if announce is not None else ""

    def ready() -> None:
        with contextlib.suppress(OSError):
            os.write(write_fd, _READY + line.encode("utf-8", "replace")[:_MAX_REPORT])
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
            # the daemon's one write: its line, if any, came with it
            if data[1:]:
                sys.stderr.write(data[1:].decode("utf-8", "replace") + "\n")
            return 0
    if data[:1] == _FAILED:
        sys.stderr.write(f"sbusd: {data[1:].decode('utf-8', 'replace')}\n")
    else:
        sys.stderr.write("sbusd: the daemon exited before it was ready\n")
    return 1


def stderr_is_a_file() -> bool:
    """Whether stderr is a regular file: the one caller's stream a daemon keeps.

    A pipe or socket would hold its reader (``sbusd | tail``, ``$(sbusd)``, a
    test's captured output) open for as long as the daemon lives; a terminal is
    not the daemon's to write on.
    """
    try:
        return stat.S_ISREG(os.fstat(2).st_mode)
    except OSError:
        return False


def has_terminal() -> bool:
    """Whether this process has a controlling terminal now.

    A foreground bus started from a terminal has one until that terminal hangs
    up (it was closed, the ssh session ended): the kernel then takes it away
    before sending SIGHUP.  So a SIGHUP that finds the terminal gone is a
    hang-up, which stops the bus, and any other SIGHUP asks for a reload.
    """
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def _detach_stdio(keep_stderr: bool) -> None:
    """Point stdin, stdout and stderr at /dev/null; stderr stays when it is a
    regular file and ``keep_stderr`` (``sbusd 2>>log`` still logs)."""
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if not (keep_stderr and stderr_is_a_file()):
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


def check_pidfile(path: str, successor_of: int = 0) -> None:
    """Refuse (``UsageError``) a pid file that names another running bus (not
    ``successor_of``: the bus this process takes over in a live upgrade).

    Called before anything is bound, so that a second daemon started without
    ``-p`` says so in one line instead of overwriting the first one's file.
    """
    if path == NO_PIDFILE:
        return
    holder = running_holder(path)
    if holder is not None and holder not in (os.getpid(), successor_of):
        raise UsageError(
            f"pid file {path} belongs to a running bus (pid {holder}); "
            "give this one its own with -p PIDFILE (or -p /dev/null for none)"
        )


def running_holder(path: str) -> int | None:
    """The pid in the pid file ``path`` if that process is a running bus, else None.

    A pid that is gone, or now belongs to a process that is not a bus (the
    number was reused after a crash), leaves the file stale: None.
    """
    try:
        with open(path, encoding="ascii", errors="replace") as stream:
            text = stream.read(_MAX_PID_TEXT).strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) <= 0:
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            command = stream.read(_MAX_CMDLINE)
    except OSError:
        return pid  # alive, and we cannot tell what it is: assume it is the bus
    return pid if b"sbus" in command else None


def write_pidfile(path: str, pid: int, successor_of: int = 0) -> None:
    """Write ``pid`` to ``path`` atomically (``/dev/null`` means no pid file).

    Never over a file that names another running bus (``UsageError``), unless
    it is ``successor_of`` (the bus a live upgrade takes over): the file is
    linked into place only if none is there, or replaces a stale one.
    """
    if path == NO_PIDFILE:
        return
    temporary = f"{path}.{pid}.tmp"
    with open(temporary, "w", encoding="ascii") as stream:
        stream.write(f"{pid}\n")
    os.chmod(temporary, 0o644)
    try:
        try:
            os.link(temporary, path)
        except OSError:  # a file is there (or links are not supported there)
            check_pidfile(path, successor_of)
            os.replace(temporary, path)  # stale, or none: ours now
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


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


def notify(**fields: object) -> bool:
    """Tell systemd (``sd_notify``): e.g. ``READY=1``, or ``MAINPID=`` when a newer
    process takes a bus over.  False when not run by systemd (no $NOTIFY_SOCKET)."""
    target = os.environ.get("NOTIFY_SOCKET", "")
    if not target:
        return False
    if target.startswith("@"):  # an abstract socket
        target = "\0" + target[1:]
    message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message, target)
        except OSError:
            return False
    return True
