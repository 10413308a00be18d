"""A foreground bus's place on its terminal, kept across live upgrades.

Owns: what the process a terminal started a bus with (``make run``,
``sbus-relay serve -f``) does once it has handed the bus to a newer process
(docs/deploy.md, "Upgrade").  Touches: this process's signal dispositions,
its children (waits for them, forwards signals to them), and the kernel's
child-subreaper flag; no socket, no argv, no exit.

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
  which stops; so SIGINT is not forwarded (it would arrive twice).
  SIGTERM, SIGHUP (a reload, or the terminal hanging up) and SIGUSR2 (an
  upgrade) sent to this process are forwarded to its children.

A bus that does not hold its terminal's foreground (a daemon, a systemd
service, a bus under ``sbus-relay up``, a background job) hands over and
ends as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from types import FrameType

from .children import children_of

#: prctl(2) option: orphaned descendants are reparented to this process.
_PR_SET_CHILD_SUBREAPER = 36
#: Signals passed on to the running bus (SIGINT reaches it from the terminal).
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)


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


def keep() -> int:
    """Wait for every child, forwarding ``FORWARDED`` signals to them; the exit
    status of the last to end (128 + N if signal N ended it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's reaches the bus itself
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # nobody else reaps our children

    def forward(signum: int, _frame: FrameType | None) -> None:
        for pid in children_of(os.getpid()):
            with contextlib.suppress(ProcessLookupError):  # ended: the wait sees it
                os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [*FORWARDED, signal.SIGCHLD])
    status = 0
    while True:
        try:
            _pid, raw = os.waitpid(-1, 0)  # a forwarded signal runs, then it waits on
        except ChildProcessError:
            return status
        status = os.waitstatus_to_exitcode(raw)
        if status < 0:
            status = 128 - status
