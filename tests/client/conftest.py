"""Buses for the client library's tests: ours (restartable on one address),
and the reference C sbusd, built once per session from its sources."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbus_relay.bench.build import BuildError
from sbus_relay.bench.reference import build_reference, find_sources
from tests.relay.conftest import tree  # noqa: F401 (hierarchies of buses, as the relay tests build)
from tests.support import BusProcess, is_listening, short_dir, start_bus

#: Seconds any one wait of these tests may take.
WAIT = 15.0


class Master:
    """``sbusd -f`` (or ``command``) on a fixed path that can be stopped or killed
    (-9) and started again there."""

    def __init__(self, tmp_path: Path, *args: str, command: str = "sbusd") -> None:
        self.tmp_path = tmp_path
        self.dir = short_dir()
        self.address = os.path.join(self.dir, "bus")
        self.args = args
        self.command = command
        self.process: BusProcess | None = None
        self.start()

    def start(self) -> None:
        # -r: a killed bus leaves its socket file behind
        self.process = start_bus(
            self.tmp_path, "-r", "-a", self.address, *self.args, command=self.command
        )

    def stop(self) -> None:
        """Stopped as a person stops it (SIGTERM), to be started again."""
        if self.process is not None:
            self.process.stop()
            self.process = None

    def kill(self) -> None:
        assert self.process is not None
        self.process._kill()  # and its own directory (the bus's is ours)

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()  # (one that has ended already: its directory removed)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[Master]:
    bus = Master(tmp_path)
    try:
        yield bus
    finally:
        bus.close()


@pytest.fixture(scope="session")
def reference_sbusd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference C sbusd, compiled from its sources (skipped where there are none)."""
    source, reason = find_sources()
    if source is None:
        pytest.skip(reason)
    try:
        return build_reference(source, tmp_path_factory.mktemp("reference"))
    except BuildError as exc:
        pytest.fail(f"the reference sources are there but do not build: {exc}")


@pytest.fixture
def reference_bus(reference_sbusd: Path) -> Iterator[str]:
    """A reference sbusd in the foreground on a private path."""
    directory = short_dir()
    address = os.path.join(directory, "ref")
    proc = subprocess.Popen(
        [str(reference_sbusd), "-f", "-a", address],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not is_listening(address):
            assert proc.poll() is None, "the reference sbusd exited"
            assert time.monotonic() < deadline, "the reference sbusd does not listen"
            time.sleep(0.02)
        yield address
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)
