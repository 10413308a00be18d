"""Shared fixtures: real server processes from tests/support.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import BusProcess, short_dir, start_bus

# analyze builds a JVM class archive in the background after a run that found
# none: a Spark run competing for the cores with timing-sensitive tests.  Off
# here; tests/pipeline/test_classarchive.py switches it on where it is tested.
os.environ["SBUS_CLASS_ARCHIVE"] = "0"


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
    """A directory under /tmp short enough for socket paths (108-byte limit)."""
    import shutil

    path = short_dir()
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)
