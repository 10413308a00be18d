"""``serve --take-over`` on one host (docs/kubernetes.md, "Upgrade"): the same
command starts the first bus and takes a running one over from the new side.

Every process is a real ``sbus-relay serve``; a client connected before the
take-over keeps its connection and its subscription.  tests/containers runs
the same in two containers with their own network namespaces.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.shipped import healthy, log_events, stop
from tests.relay.helpers import Peer, wait_until
from tests.support import VENV_BIN, free_port, run_cli, short_dir

pytestmark = pytest.mark.timeout(90)

#: Seconds a process gets to start (a busy machine's imports) or to hand over.
START = 30.0


class Node:
    """A socket directory, a config, and the ``serve --take-over`` processes started on it."""

    def __init__(self, root: Path, logs: Path) -> None:
        self.root = root
        self.logs = logs
        self.address = str(root / "sbus.socket")
        self.port = free_port()
        self.config = root / "master.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "address": self.address,
                    "foreground": True,
                    "remove_stale": True,
                    "metrics": f"127.0.0.1:{self.port}",
                    "log_format": "json",
                }
            )
        )
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> tuple[subprocess.Popen[bytes], Path]:
        err = self.logs / f"serve-{len(self.procs)}.err"
        with open(err, "wb") as stream:
            proc = subprocess.Popen(
                [os.path.join(VENV_BIN, "sbus-relay"), "serve", "--take-over", "-C",
                 str(self.config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stream,
            )  # fmt: skip
        self.procs.append(proc)
        return proc, err

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    root = Path(short_dir())
    built = Node(root, tmp_path)
    try:
        yield built
    finally:
        built.close()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def events(err: Path, name: str) -> list[dict[str, object]]:
    return [e for e in log_events(err) if e.get("event") == name]


def wait_event(err: Path, name: str) -> dict[str, object]:
    found = wait_until(lambda: events(err, name), f"{name} in {err.name}", timeout=START)
    return found[0]


def test_the_first_start_serves_and_the_second_takes_over(node: Node) -> None:
    first, first_err = node.start()
    wait_event(first_err, "listening")
    assert events(first_err, "upgrade.took_over") == []
    peer = Peer(node.address)
    other = Peer(node.address)
    try:
        peer.sub(b"k/")
        second, second_err = node.start()
        took = wait_event(second_err, "upgrade.took_over")
        assert took["clients"] == 2
        # one network namespace: the port is the old process's, and comes with the bus
        lingering = wait_event(first_err, "upgrade.lingering")
        assert lingering["healthz"] is False
        wait_until(lambda: healthy(node.port), "/healthz of the new process")
        other.pub(b"k/after", b"1")
        assert peer.recv() == b"MSG k/after\0" + b"1"
        assert first.poll() is None  # it stays until stopped
        assert stop(first) == 0
        assert os.path.exists(node.address)  # the successor's: left alone
        other.pub(b"k/later", b"2")
        assert peer.recv() == b"MSG k/later\0" + b"2"
        assert stop(second) == 0
        assert not os.path.exists(node.address)
    finally:
        peer.close()
        other.close()


def test_a_stale_socket_is_no_bus_to_take_over(node: Node) -> None:
    first, first_err = node.start()
    wait_event(first_err, "listening")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert os.path.exists(node.address)
    second, second_err = node.start()
    wait_event(second_err, "listening")
    assert events(second_err, "upgrade.took_over") == []
    assert stop(second) == 0


def test_an_upgrade_of_a_take_over_bus_ends_the_old_process(node: Node) -> None:
    first, first_err = node.start()
    wait_event(first_err, "listening")
    upgraded = run_cli("upgrade", "-a", node.address, timeout=60)
    assert upgraded.returncode == 0, upgraded.stderr
    # it started its successor itself: no container restarts it, so it ends
    assert first.wait(10) == 0
    assert events(first_err, "upgrade.lingering") == []
    new_pid = int(upgraded.stdout.decode().rsplit("pid ", 1)[1].strip())
    os.kill(new_pid, signal.SIGTERM)
    wait_until(lambda: not os.path.exists(node.address), "the successor ends")
