"""The reference sbusd's own test program, run against our ``sbusd``.

The reference's ``test`` starts ``./sbusd`` from its working directory in every
address mode, with and without ``-c``, ``-r``, ``-g`` and ``-o`` (a plain file
left at the socket path included), and checks ordered delivery and socket
modes.  Here ``./sbusd`` is a script that execs ours.  Its watchdog, an
``alarm(1)`` at each step, is lengthened to ``WATCHDOG`` seconds in the copy
built here: the watchdog catches a step that hangs, and one second is the C
daemon's speed, not a behaviour -- a Python daemon starting on a loaded
machine takes longer (speed is the benchmark's to measure, live).  The C
sources (a clone of the sbus project) are found as the benchmark finds them
(``sbus_relay.bench.reference``: ``$SBUS_REFERENCE_SRC``, else beside the
checkout); without them the test skips and says where to get them, except
under CI, where it must run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from sbus_relay.bench.reference import HOW_TO_GET, find_sources
from tests.support import VENV_BIN

pytestmark = pytest.mark.timeout(180)

#: Seconds the reference's test program gives each step before it gives up (its
#: own ``alarm(1)``): long enough for a start on a loaded machine, far below
#: the run's timeout, so that a step that hangs still fails the run.
WATCHDOG = 10
#: The watchdog as test.c sets it (the patch must find it, or it is stale).
REFERENCE_WATCHDOG = "alarm(1);"


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``; under CI the reference run is required, so fail."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the reference's test program: {reason}")
    pytest.skip(reason)


def test_the_reference_test_program_passes_against_our_sbusd(tmp_path: Path) -> None:
    sources, reason = find_sources()
    if sources is None:
        unavailable(reason)
    if not (sources / "test.c").is_file():
        unavailable(f"{sources} has no test.c, the reference's test program; {HOW_TO_GET}")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        unavailable("no C compiler to build the reference's test program")
    build = tmp_path / "ref"
    shutil.copytree(sources, build)
    program = build / "test.c"
    text = program.read_text()
    assert REFERENCE_WATCHDOG in text, "test.c no longer arms alarm(1): review WATCHDOG"
    program.chmod(0o644)
    program.write_text(text.replace(REFERENCE_WATCHDOG, f"alarm({WATCHDOG});"))
    made = subprocess.run(
        ["make", "-C", str(build), "test"], capture_output=True, timeout=120, check=False
    )
    assert made.returncode == 0, made.stderr.decode(errors="replace")[-2000:]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    wrapper = run_dir / "sbusd"
    wrapper.write_text(f'#!/bin/sh\nexec "{os.path.join(VENV_BIN, "sbusd")}" "$@"\n')
    wrapper.chmod(0o755)
    shutil.copy(build / "test", run_dir / "test")
    done = subprocess.run(
        ["./test"],
        cwd=run_dir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    failures = [
        line
        for line in done.stderr.decode(errors="replace").splitlines()
        if not line.startswith("{")  # our servers' JSON log lines
    ]
    assert done.returncode == 0, "\n".join(failures[-20:])
    assert not any("Traceback" in line for line in failures), failures
