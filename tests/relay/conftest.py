"""Fixtures for hierarchy tests: a factory of real buses that cleans up after itself."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.relay.helpers import Bus, Peer
from tests.support import short_dir


class Hierarchy:
    """Starts buses under one short directory; stops every bus and client after."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.dir = short_dir()
        self.buses: list[Bus] = []
        self.peers: list[Peer] = []

    def path(self, name: str) -> str:
        """A socket path in this test's directory."""
        return os.path.join(self.dir, name)

    def bus(self, name: str, *args: str, upstream: Bus | str | None = None) -> Bus:
        """Start a master (no ``upstream``) or a relay of ``upstream``."""
        up = upstream.address if isinstance(upstream, Bus) else upstream
        bus = Bus(self.tmp_path, self.path(name), *args, upstream=up)
        self.buses.append(bus)
        return bus

    def peer(self, bus: Bus | str) -> Peer:
        """A raw client of ``bus``, closed at the end of the test."""
        peer = Peer(bus.address if isinstance(bus, Bus) else bus)
        self.peers.append(peer)
        return peer

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        # children first: a relay stopping never waits for its upstream
        for bus in reversed(self.buses):
            bus.process._kill()  # and its directory, also when it has ended (an upgrade)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Hierarchy]:
    """Build a hierarchy of real buses in the test; all torn down afterwards."""
    hierarchy = Hierarchy(tmp_path)
    try:
        yield hierarchy
    finally:
        hierarchy.close()
