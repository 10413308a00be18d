"""A foreground bus's place on its terminal, kept across live upgrades.

What it owns: what the process a terminal started a bus with does once it has
handed the bus on.  What it may touch: its signal mask and dispositions, its
children and the child-subreaper flag; no socket, no argv, no exit.

Theory of operation.  A shell (or ``make``) waits for the process it started,
and the terminal's Ctrl-C goes to that process's group.  A live upgrade
starts the new bus as a child of the old one, in the same process group; if
the old one then ended, the shell would take the terminal back and the new
bus would run on out of its reach.  So the old process, when it holds the
terminal's foreground, stays:

* before it starts its successor it becomes a child subreaper
  (``PR_SET_CHILD_SUBREAPER``), so that the successor's own successors,
  orphaned by later upgrades, become its children rather than init's;
* once it has handed the bus over, it runs ``keep`` (in a fresh interpreter,
  ``cli.foreground``, so as to hold none of the bus's memory), which waits
  for its children and returns the exit status of the last one, the bus that
  ran last: the shell gets the terminal back when that bus stops;
* a Ctrl-C reaches the whole foreground group, the running bus included,
  which stops; so the terminal's SIGINT is not forwarded (it would arrive
  twice).  Any other SIGINT, and SIGTERM, SIGHUP (a reload, or the terminal
  hanging up) and SIGUSR2 (an upgrade) sent to this process are forwarded to
  its children.

Only a bus typed at a terminal (``serve -f`` with stdin on it) that holds
its foreground does this; any other (a daemon, a systemd service, a bus
under ``sbus-relay up`` or started by a program, a background job) hands
over and ends as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Sequence

from .children import children_of

#: prctl(2) option: orphaned descendants are reparented to this process.
_PR_SET_CHILD_SUBREAPER = 36
#: Signals passed on to the running bus (and SIGINT, unless the terminal sent it).
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)
#: What the waiting process takes with ``sigwaitinfo``: the bus's process
#: blocks them before it becomes that process, so that none is lost between.
WAITED = frozenset({*FORWARDED, signal.SIGINT, signal.SIGCHLD})


def holds_terminal() -> bool:
    """Whether this process's group is its controlling terminal's foreground group."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux 3.4+); False where the kernel cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def keep(owed: Sequence[int] = ()) -> int:
    """Wait for every child, passing signals on to them (first those ``owed``:
    sent to the bus's process once it had handed over); the exit status of the
    last to end (128 + N if signal N ended it).

    Signals are taken with ``sigwaitinfo`` (one thread: the fresh interpreter
    of ``cli.foreground``), which says who sent each: a SIGINT the terminal
    sent (the kernel, no pid) has reached the bus too and is not passed on;
    any other SIGINT, and every SIGTERM, SIGHUP and SIGUSR2, is.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # nobody else reaps our children
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    for signum in owed:
        _pass_on(signum)
    status = 0
    while True:
        ended = _reap()
        if ended is None:
            return status
        status = ended if ended >= 0 else status
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo == signal.SIGCHLD:
            continue
        if info.si_signo == signal.SIGINT and info.si_pid == 0:
            continue  # the terminal's Ctrl-C: the bus has it already
        _pass_on(info.si_signo)


def _pass_on(signum: int) -> None:
    for pid in children_of(os.getpid()):
        with contextlib.suppress(ProcessLookupError):  # ended: reaped next round
            os.kill(pid, signum)


def _reap() -> int | None:
    """Reap the children that ended: the last one's exit status, -1 if none
    ended, None once no child is left."""
    status = -1
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return status
        status = os.waitstatus_to_exitcode(raw)
        if status < 0:
            status = 128 - status
