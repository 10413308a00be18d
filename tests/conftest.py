"""Shared fixtures: real server processes from tests/support.py.

Every temporary file of a run -- the tests', and their processes' -- goes to
one short directory of the run's own (``$TMPDIR`` for the tests and every
process they start; pytest's ``tmp_path`` stays where pytest keeps it).  What
is left in it when the run ends was left by a test: the run fails, naming it,
and the directory is removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import BusProcess, short_dir, start_bus

# Hypothesis fails an example that takes over 200 ms by default: on a loaded
# machine a descheduled example does, and the run fails as "Flaky".  Speed is
# the benchmark's to measure; the property tests check behaviour only.
settings.register_profile("sbus", deadline=None)
settings.load_profile("sbus")

# analyze builds a JVM class archive in the background after a run that found
# none: a Spark run competing for the cores with timing-sensitive tests.  Off
# here; tests/pipeline/test_classarchive.py switches it on where it is tested.
os.environ["SBUS_CLASS_ARCHIVE"] = "0"

#: Longest path of the run's temporary directory: socket paths under it must
#: stay well under the 108 bytes of ``sun_path``.
TMPDIR_LONGEST = 40
#: The environment variable that tells pytest where to keep ``tmp_path``.
PYTEST_TEMPROOT = "PYTEST_DEBUG_TEMPROOT"
#: The run's temporary directory, and the test during which each entry appeared.
_RUN_DIR = pytest.StashKey[str]()
_MADE_BY = pytest.StashKey[dict[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    """Point ``$TMPDIR`` at a fresh directory of this run's own."""
    if hasattr(config, "workerinput") or "SBUS_TEST_TMPDIR" in os.environ:
        return  # set up once per run (a worker inherits its parent's)
    outer = tempfile.gettempdir()
    if len(outer) > TMPDIR_LONGEST:
        outer = "/tmp"
    os.environ.setdefault(PYTEST_TEMPROOT, outer)  # tmp_path: where pytest keeps it
    run_dir = tempfile.mkdtemp(prefix="sbus-tests-", dir=outer)
    os.chmod(run_dir, 0o755)  # as /tmp: another user's client reaches a test's socket
    os.environ["SBUS_TEST_TMPDIR"] = os.environ["TMPDIR"] = run_dir
    tempfile.tempdir = None  # gettempdir() reads $TMPDIR again
    # A JVM ignores $TMPDIR: every one that Spark's launcher starts (a test's
    # own SparkSession, a documented example run as a user would) writes its
    # temporary files here too, so that what one leaves is seen as well.  The
    # pipeline gives the JVMs it starts directories of their own in it.
    jvm = f"-Djava.io.tmpdir={run_dir} -XX:-UsePerfData"
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {jvm}".strip()
    config.stash[_RUN_DIR] = run_dir
    config.stash[_MADE_BY] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Note which test made each entry of the run's temporary directory."""
    run_dir = item.config.stash.get(_RUN_DIR, None)
    result = yield
    if run_dir is not None:
        made_by = item.config.stash[_MADE_BY]
        for entry in os.listdir(run_dir):
            made_by.setdefault(entry, item.nodeid)
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test left something in the temporary directory; remove it."""
    run_dir = session.config.stash.get(_RUN_DIR, None)
    if run_dir is None:
        return
    left = sorted(os.listdir(run_dir))
    shutil.rmtree(run_dir, ignore_errors=True)
    if not left:
        return
    made_by = session.config.stash[_MADE_BY]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"FAILED: tests left {_entries(len(left))} in the temporary directory {run_dir}:",
            red=True,
        )
        for entry in left:
            reporter.write_line(f"  {entry} (from {made_by.get(entry, 'the session')})")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def sbusd(tmp_path: Path) -> Iterator[BusProcess]:
    """A fresh ``sbusd -f`` on a path socket, stopped (and checked) after the test."""
    with start_bus(tmp_path) as bus:
        yield bus


@pytest.fixture
def serve_bus(tmp_path: Path) -> Iterator[BusProcess]:
    """A fresh ``sbus-relay serve -f`` on a path socket."""
    with start_bus(tmp_path, command="serve") as bus:
        yield bus


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory short enough for socket paths (108-byte limit), removed after the test."""
    path = short_dir()
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _entries(count: int) -> str:
    return "1 entry" if count == 1 else f"{count} entries"
