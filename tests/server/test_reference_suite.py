"""The reference sbusd's own test program, run against our ``sbusd``.

The reference's ``test`` starts ``./sbusd`` from its working directory in every
address mode, with and without ``-c``, ``-r``, ``-g`` and ``-o`` (a plain file
left at the socket path included), and checks ordered delivery and socket
modes, each step within one second.  Here ``./sbusd`` is a script that execs
ours.  The C sources are found through ``$SBUS_REFERENCE_SRC``, else as a
``reference-sbus`` directory (holding ``sbusd.c``) beside this checkout; without
them the test skips, except under CI, where it must run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support import VENV_BIN

pytestmark = pytest.mark.timeout(180)

#: Environment variable naming the reference's source directory.
SOURCE_ENV = "SBUS_REFERENCE_SRC"
#: The checkout's root directory (this file is tests/server/...).
ROOT = Path(__file__).resolve().parents[2]


def reference_sources() -> Path | None:
    """The reference's C sources, or None when they are not on this machine."""
    given = os.environ.get(SOURCE_ENV)
    if given:
        return Path(given) if (Path(given) / "sbusd.c").is_file() else None
    for candidate in sorted(ROOT.parent.glob("*/reference-sbus")):
        if (candidate / "sbusd.c").is_file() and (candidate / "test.c").is_file():
            return candidate
    return None


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``; under CI the reference run is required, so fail."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the reference's test program: {reason}")
    pytest.skip(reason)


def test_the_reference_test_program_passes_against_our_sbusd(tmp_path: Path) -> None:
    sources = reference_sources()
    if sources is None:
        unavailable(
            f"no reference sources: ${SOURCE_ENV} names no directory with sbusd.c, and"
            " there is no reference-sbus directory beside the checkout"
        )
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        unavailable("no C compiler to build the reference's test program")
    build = tmp_path / "ref"
    shutil.copytree(sources, build)
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
