"""A bus run in the foreground of a terminal stays there across live upgrades.

``make run`` (``sbus-relay serve -f``) in a real terminal (tmux): after
``sbus-relay upgrade``, twice, the shell still waits, the bus that serves now
is in the terminal's foreground group, and Ctrl-C stops it -- the socket is
removed, no process is left, and the shell goes on with status 0.  A SIGTERM
or SIGINT sent to the pid the shell started reaches the bus that serves now.
"""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import pytest

from sbus_relay.ops.children import process_status
from tests.metrics.test_top import Tmux, tmux_available  # noqa: F401 - the fixture
from tests.relay.helpers import wait_until
from tests.relay.test_upgrade import serving_pid
from tests.support import VENV_BIN, run_cli, running

pytestmark = pytest.mark.timeout(120)


def _tpgid(pid: int) -> int:
    """The foreground process group of ``pid``'s terminal (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stream:
        return int(stream.read().rpartition(")")[2].split()[5])


def _terminal_with_a_bus(tmp_path: Path, address: str) -> tuple[Tmux, int]:
    """A terminal whose shell runs a foreground bus, as ``make run`` does; the bus's pid."""
    serve = f"{VENV_BIN}/sbus-relay serve -f -a {address}; echo EXIT=$?; sleep 60"
    # bash: what a terminal runs (and a shell that waits on through a Ctrl-C its
    # child handled, as make does)
    term = Tmux(tmp_path, f"exec bash --norc --noprofile -c {shlex.quote(serve)}")
    term.wait_for("the bus listening", r"\blistening\b")
    return term, serving_pid(address)


def _upgrade(address: str, old: int) -> int:
    done = run_cli("upgrade", "-a", address, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    new = serving_pid(address)
    assert done.stdout.decode().strip() == f"{address}: pid {old} -> pid {new}"
    return new


def test_ctrl_c_stops_a_foreground_bus_after_upgrades(
    tmp_path: Path,
    short_tmp: Path,
    tmux_available: None,  # noqa: F811
) -> None:
    address = str(short_tmp / "bus")
    term, first = _terminal_with_a_bus(tmp_path, address)
    try:
        second = _upgrade(address, first)
        third = _upgrade(address, second)
        # the second process handed over and ended; its successor is the first's now
        wait_until(lambda: not running(second), "the second process to end")
        wait_until(lambda: (process_status(third) or ("", 0))[1] == first, "the third adopted")
        screen = term.screen()
        assert "EXIT=" not in screen, screen  # the shell still waits
        assert running(first)
        assert os.getpgid(third) == os.getpgid(first) == _tpgid(third)  # in the foreground
        term.keys("C-c")
        term.wait_for("the shell to go on", r"^EXIT=0$")
        assert not os.path.exists(address)
        assert not running(third) and not running(first)
    finally:
        term.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=str)
def test_a_signal_to_the_started_process_stops_the_bus_that_serves_now(
    sig: int,
    tmp_path: Path,
    short_tmp: Path,
    tmux_available: None,  # noqa: F811
) -> None:
    address = str(short_tmp / "bus")
    term, first = _terminal_with_a_bus(tmp_path, address)
    try:
        second = _upgrade(address, first)
        os.kill(first, sig)  # as `kill PID` with the pid make printed: passed on
        term.wait_for("the shell to go on", r"^EXIT=0$")
        assert not os.path.exists(address)
        assert not running(second)
    finally:
        term.close()
