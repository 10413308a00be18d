"""Child processes: started one way, tied to their parent's life, stopped one way.

Every process the package starts -- a bus under ``sbus-relay up``, the
benchmark's servers and load generators, a standalone Spark master and worker
-- goes through ``spawn`` and ``stop``:

* stdin is /dev/null unless the caller asks for a pipe; stdout is /dev/null, a
  pipe, or the log; stderr goes to the log file (appended, or fresh) or stays
  the parent's;
* the child asks the kernel for SIGTERM when its parent dies
  (``PR_SET_PDEATHSIG``), so a killed parent leaves no orphan (unless it is
  a background job meant to outlive it: ``outlive_parent``);
* ``new_session`` puts it in a session (and process group) of its own: a
  Ctrl-C on the terminal reaches only the parent, which stops its children in
  its own order, and ``stop(group=True)`` reaches the child's own children too;
* ``stop`` sends SIGTERM, waits a grace period, then SIGKILLs.

No argv parsing and no exits here; callers word their own errors from the
``OSError`` that ``spawn`` raises (``filename`` is the log when it could not
be opened).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Any, Literal

#: Bytes read from the end of a child's log to quote its last line on failure.
LOG_TAIL_BYTES = 4096
#: Characters of that last line quoted.
LOG_LINE_QUOTED = 300
#: prctl(2) option: the signal a child gets when its parent dies.
_PR_SET_PDEATHSIG = 1

try:
    # Loaded once, before any fork: the child only makes one call into it.
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not on Linux
    _libc = None

#: Where a child's stdout goes: nowhere, a pipe the caller reads, or the log.
Stdout = Literal["null", "pipe", "log"]


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM this child when its parent dies (Linux; else nothing).

    Only a prctl, on a library loaded before the fork: safe in a parent that
    runs threads.
    """
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    argv: Sequence[str],
    *,
    log: str | os.PathLike[str] | None = None,
    append: bool = True,
    stdin_pipe: bool = False,
    stdout: Stdout = "null",
    new_session: bool = False,
    env: Mapping[str, str] | None = None,
    text: bool = False,
    outlive_parent: bool = False,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[Any]:
    """Start ``argv``; stderr goes to ``log`` (appended, or fresh unless ``append``)
    or, without one, stays the parent's.  ``outlive_parent`` leaves out the
    death signal, for the one kind of child meant to go on alone (a background
    job, in a session of its own).  ``pass_fds`` stay open in the child.
    Raises ``OSError`` (from the log, or from the exec)."""
    if stdout == "log" and log is None:
        raise ValueError("stdout='log' needs a log file")
    err: IO[bytes] | None = None
    if log is not None:
        err = open(log, "ab" if append else "wb")  # noqa: SIM115 - the child keeps its copy
    try:
        out: Any = {"null": subprocess.DEVNULL, "pipe": subprocess.PIPE, "log": err}[stdout]
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=None if env is None else dict(env),
            text=text,
            start_new_session=new_session,
            preexec_fn=None if outlive_parent else die_with_parent,
            pass_fds=tuple(pass_fds),
        )
    finally:
        if err is not None:
            err.close()


def stop(
    proc: subprocess.Popen[Any],
    grace: float,
    *,
    group: bool = False,
    sig: int = signal.SIGTERM,
) -> bool:
    """Signal ``proc`` (its whole process group with ``group``), wait ``grace``
    seconds, then SIGKILL it; returns True when it had to be killed."""
    if proc.poll() is not None:
        return False
    _signal(proc, sig, group)
    try:
        proc.wait(grace)
        return False
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL, group)
        proc.wait()
        return True


def _signal(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def process_status(pid: int) -> tuple[str, int] | None:
    """Any process's (state letter, parent pid) from /proc; None once it is gone.
    A zombie (state ``Z``) has ended and waits for its parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stream:
            fields = stream.read().rpartition(")")[2].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def footprint(pid: int) -> tuple[int, int] | None:
    """A live process's (threads, resident bytes) from /proc; None once it is gone."""
    threads = rss = -1
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as stream:
            for line in stream:
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return (threads, rss) if threads >= 0 and rss >= 0 else None


def children_of(pid: int) -> set[int]:
    """The pids of the processes that process ``pid`` started from its main
    thread and that have not been reaped (empty once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as stream:
            return {int(child) for child in stream.read().split()}
    except (OSError, ValueError):
        return set()


def last_line(path: str) -> str:
    """The last non-empty line of a child's log ("" if none), shortened: what a
    start that failed says about why."""
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - LOG_TAIL_BYTES))
            lines = [line for line in stream.read().splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].decode("utf-8", "replace")[:LOG_LINE_QUOTED] if lines else ""


def how_it_ended(returncode: int) -> str:
    """A child's end as a person reads it, from ``Popen.returncode``:
    "exited with status 2", or "killed by SIGKILL" (a negative code)."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:  # a real-time signal has no name of its own
        name = f"signal {-returncode}"
    return f"killed by {name}"
