"""ops.children: a child dies with its parent, unless it is a background job
started to outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import running

pytestmark = pytest.mark.timeout(30)

#: A parent that starts a sleeping child, prints its pid and exits at once.
PARENT = """
import sys
from sbus_relay.ops import children
child = children.spawn(
    [sys.executable, "-c", "import time; time.sleep(60)"],
    new_session=True, outlive_parent=sys.argv[1] == "outlive",
)
print(child.pid, flush=True)
"""
#: Seconds a child may take to be gone after its parent.
GONE_WITHIN = 10.0


def child_of_a_parent_that_exits(mode: str, tmp_path: Path) -> int:
    # stderr to a file: a pipe would stay open as long as the child keeps it
    with open(tmp_path / "stderr", "w+") as err:
        done = subprocess.run(
            [sys.executable, "-c", PARENT, mode],
            stdout=subprocess.PIPE, stderr=err, text=True, timeout=20,
        )  # fmt: skip
        err.seek(0)
        assert done.returncode == 0, err.read()
    return int(done.stdout.split()[0])


def test_a_child_dies_with_its_parent(tmp_path: Path) -> None:
    pid = child_of_a_parent_that_exits("tied", tmp_path)
    deadline = time.monotonic() + GONE_WITHIN
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid)


def test_a_background_job_outlives_its_parent(tmp_path: Path) -> None:
    pid = child_of_a_parent_that_exits("outlive", tmp_path)
    try:
        time.sleep(0.5)
        assert running(pid)
    finally:
        os.kill(pid, signal.SIGKILL)


def test_how_a_child_ended_is_said_in_words() -> None:
    from sbus_relay.ops.children import how_it_ended

    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    assert how_it_ended(killed.wait()) == "killed by SIGKILL"
    exited = subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=False)
    assert how_it_ended(exited.returncode) == "exited with status 3"
    assert how_it_ended(-signal.SIGTERM) == "killed by SIGTERM"
    realtime = int(signal.SIGRTMIN) + 1  # no name of its own
    assert how_it_ended(-realtime) == f"killed by signal {realtime}"
