"""The suite's own check: a run fails when a test leaves something in its
temporary directory, and says which test left what (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
#: The suite's hooks, in a conftest of a directory of its own.
CONFTEST = (
    "from tests.conftest import pytest_configure, pytest_runtest_protocol, pytest_sessionfinish\n"
)
TESTS = """
import os, tempfile

def test_clean():
    with tempfile.TemporaryDirectory(prefix="sbus-") as path:
        open(os.path.join(path, "x"), "w").close()

def test_leaky():
    tempfile.mkdtemp(prefix="sbus-left-")
"""


def run(tmp_path: Path, selection: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_leaks.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "SBUS_TEST_TMPDIR"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selection],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )


def test_a_run_whose_tests_leave_nothing_passes(tmp_path: Path) -> None:
    done = run(tmp_path, "clean")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_run_fails_naming_the_test_that_left_something(tmp_path: Path) -> None:
    done = run(tmp_path, "clean or leaky")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout
    assert "tests left 1 entry" in done.stdout, done.stdout
    line = next(x for x in done.stdout.splitlines() if "sbus-left-" in x)
    assert "test_leaks.py::test_leaky" in line, done.stdout
    # and the run's directory is gone all the same
    run_dir = done.stdout.split("temporary directory ", 1)[1].split(":", 1)[0]
    assert run_dir.startswith(os.environ["TMPDIR"]) and not os.path.exists(run_dir)
