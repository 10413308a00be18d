"""The NATS link as a process of its own (docs/nats.md, "How it is built"):
the bus's child, shown in /clients, restarted when it dies (logged, traffic
flowing again), never left behind when the bus stops or is killed, and its
log records written where the bus logs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbus_relay.client import Client
from sbus_relay.ops.children import process_status
from tests.nats.cluster import Cluster, Host, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, n=1)
    yield c
    c.stop()


def gone(pid: int) -> bool:
    status = process_status(pid)
    return status is None or status[0] == "Z"


def crossed(pub: Client, sub: Client, key: bytes) -> None:
    """Publish ``key`` until ``sub`` gets it (the hosts know each other's interest)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pub.publish(key, b"probe")
        try:
            if bytes(sub.receive(timeout=0.2).key) == key:
                return
        except TimeoutError:
            continue
    raise AssertionError(f"{key!r} never crossed")


def test_the_link_process_is_shown_restarted_when_it_dies_and_ends_with_its_bus(
    tmp_path: Path, cluster: Cluster
) -> None:
    a = Host(tmp_path, "hosta", cluster.urls(), relay=False)
    b = Host(tmp_path, "hostb", cluster.urls(), relay=False)
    try:
        wait_until(lambda: a.link()["connected"] and b.link()["connected"], 30, "joined")
        process = a.link()["process"]
        pid = process["pid"]
        assert pid and pid != a.master.proc.pid and process["restarts"] == 0
        assert process["threads"] >= 1 and process["rss_bytes"] > 1 << 20
        assert process_status(pid)[1] == a.master.proc.pid  # the bus's child
        assert a.link()["engine"] in ("nats.c", "nats-py")
        # its log records are the bus's lines
        assert '"event": "nats.connected"' in a.master.stderr_text().replace('":"', '": "')
        with Client(b.master.address, timeout=5) as sub, Client(a.master.address) as pub:
            sub.subscribe(b"p/")
            crossed(pub, sub, b"p/one")
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: a.link()["process"]["restarts"] == 1, 20, "a new link process")
            wait_until(lambda: a.link()["connected"], 20, "the new link joined")
            new = a.link()["process"]["pid"]
            assert new != pid and gone(pid)  # reaped
            crossed(pub, sub, b"p/two")  # traffic flows again
        err = a.master.stderr_text()
        assert '"nats.link_lost"' in err.replace('":"', '": "') or "nats.link_lost" in err
        assert "killed by SIGKILL" in err
        # a bus that stops takes its link with it
        a.master.stop()
        wait_until(lambda: gone(new), 10, "the link process ended with its bus")
        # a bus that is killed too: the kernel closes its end of the socket pair
        orphan = b.link()["process"]["pid"]
        b.master.proc.send_signal(signal.SIGKILL)
        b.master.proc.wait(10)
        wait_until(lambda: gone(orphan), 10, "the link process ended with its killed bus")
    finally:
        for h in (a, b):
            h.master.stop()  # (a killed one: its files are cleaned up)


def test_a_reload_of_the_log_level_reaches_the_link_process(
    tmp_path: Path, cluster: Cluster
) -> None:
    """The link's records are written by its bus, at the level the bus's config
    says now: raised by a reload, its next process's info lines are written."""
    config = tmp_path / "hosta.yaml"
    config.write_text("log_level: warning\n")
    a = Host(tmp_path, "hosta", cluster.urls(), "-C", str(config), relay=False)
    try:
        wait_until(lambda: a.link()["connected"], 30, "joined")
        assert "nats.connected" not in a.master.stderr_text()  # an info line, below warning
        config.write_text("log_level: info\n")
        a.master.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "config.reloaded" in a.master.stderr_text(), 10, "reloaded")
        pid = a.link()["process"]["pid"]
        os.kill(pid, signal.SIGKILL)  # a new link process: its info lines are written now
        wait_until(lambda: "nats.connected" in a.master.stderr_text(), 30, "its info lines")
    finally:
        a.master.stop()
