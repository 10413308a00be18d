"""The command-line tests' bus: ``sbus-relay serve`` on one address, which a test
may stop and start again there, as a person restarts a bus under a client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.conftest import Master

#: Seconds any one wait of these tests may take.
WAIT = 20.0


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[Master]:
    running = Master(tmp_path, command="serve")
    try:
        yield running
    finally:
        running.close()
