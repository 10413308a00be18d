"""Reloading a running bus (SIGHUP): real ``sbus-relay serve`` processes.

What can change live changes, for the clients already connected too; what
cannot is named in one line and kept; a config with an error is refused in
one line and the bus runs on, its clients connected and no message lost
(docs/reliability.md, "Reload").
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.relay.helpers import Bus, Peer, wait_until
from tests.support import VENV_BIN, free_port, is_listening, run_cli, short_dir

pytestmark = pytest.mark.timeout(90)

LARGEST = "sbus_largest_queue_messages"
APPLIED = 'sbus_config_reloads_total{result="applied"}'
REFUSED = 'sbus_config_reloads_total{result="refused"}'
LAST_OK = "sbus_config_last_reload_successful"
HARD_DROPS = 'sbus_messages_dropped_total{reason="hard_discard"}'
#: uid and gid of the unprivileged user the revocation test connects as
NOBODY = 65534


def write_config(path: Path, **keys: Any) -> Path:
    path.write_text(yaml.safe_dump(keys))
    return path


def reload(bus: Bus, result: str = "applied") -> None:
    """SIGHUP, then wait until the bus counted the reload's outcome."""
    key = APPLIED if result == "applied" else REFUSED
    before = bus.metric(key)
    os.kill(bus.pid, signal.SIGHUP)
    wait_until(lambda: bus.metric(key) > before, f"a reload {result}")


def events(text: str, name: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in text.splitlines() if line.startswith("{"))
    return [e for e in lines if e.get("event") == name]


def flood(publisher: Peer, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        publisher.pub(b"k/%d" % i, b"x" * 32)
    publisher.sync()


@pytest.fixture
def bus_dir() -> Iterator[str]:
    directory = short_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_reload_changes_the_queue_limit_of_a_connected_subscriber(
    tmp_path: Path, bus_dir: str
) -> None:
    config = write_config(tmp_path / "bus.yaml", hard_limit_messages=100)
    bus = Bus(tmp_path, os.path.join(bus_dir, "bus"), "-C", str(config))
    try:
        stalled = Peer(bus.address)
        stalled.sub(b"k/")  # and never reads again
        publisher = Peer(bus.address)
        flood(publisher, 3000)
        bus.wait_metric(LARGEST, 100)
        assert bus.metric(HARD_DROPS) > 0

        write_config(config, hard_limit_messages=300)
        reload(bus)
        (line,) = events(bus.log(), "config.reloaded")
        assert line["changed"] == ["hard_limit_messages"], line
        assert not events(bus.log(), "config.kept")
        flood(publisher, 3000, start=3000)
        bus.wait_metric(LARGEST, 300)  # the same connection, under its new limit

        # Lower again: what is queued stays; what comes next is dropped.
        write_config(config, hard_limit_messages=50)
        reload(bus)
        drops = bus.metric(HARD_DROPS)
        flood(publisher, 500, start=6000)
        wait_until(lambda: bus.metric(HARD_DROPS) >= drops + 500, "the next 500 dropped")
        assert bus.metric(LARGEST) == 300
        # A subscriber that comes now gets the limit of now.
        late = Peer(bus.address)
        late.sub(b"late/")
        for i in range(3000):
            publisher.pub(b"late/%d" % i, b"x" * 32)
        publisher.sync()
        rows = clients(bus)
        assert max(r["queued_messages"] for r in rows if r["patterns"]) == 300
        assert sorted(r["queued_messages"] for r in rows)[-2] == 50, rows
        assert bus.metric(APPLIED) == 2 and bus.metric(LAST_OK) == 1
        for peer in (stalled, publisher, late):
            peer.close()
    finally:
        bus.stop()


def clients(bus: Bus) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{bus.port}/clients"
    with urllib.request.urlopen(url, timeout=5) as response:
        rows: list[dict[str, Any]] = json.loads(response.read())["clients"]
    return rows


def test_a_config_with_an_error_is_refused_in_one_line_and_the_bus_runs_on(
    tmp_path: Path, bus_dir: str
) -> None:
    config = write_config(tmp_path / "bus.yaml", hard_limit_messages=100)
    bus = Bus(tmp_path, os.path.join(bus_dir, "bus"), "-C", str(config))
    try:
        reader = Peer(bus.address)
        reader.send(b"CMSG blocking/hard/block")  # it keeps up or holds the publisher
        reader.sub(b"k/")
        stalled = Peer(bus.address)
        stalled.sub(b"k/")
        publisher = Peer(bus.address)
        total = 20_000
        got: list[bytes] = []
        receiving = threading.Thread(target=lambda: got.extend(reader.messages(total, 0, 60)))
        receiving.start()
        sending = threading.Thread(target=flood, args=(publisher, total))
        sending.start()
        # Refused while the traffic flows: a bad value, then a file that is not YAML.
        config.write_text("hard_limit_messages: lots\n")
        reload(bus, "refused")
        config.write_text("hard_limit_messages: [\n")
        reload(bus, "refused")
        sending.join(60)
        receiving.join(60)
        assert [p.split(b"\0")[0] for p in got] == [b"MSG k/%d" % i for i in range(total)]

        refused = events(bus.log(), "config.refused")
        assert [e["error"] for e in refused] == [
            f"{config}: hard_limit_messages: expected an integer, got 'lots' (str)",
            f"{config}: (file): invalid YAML: expected the node content, but found"
            " '<stream end>' at line 2",
        ]
        assert all("\n" not in e["error"] for e in refused)
        assert not events(bus.log(), "config.reloaded")
        assert bus.metric(LAST_OK) == 0 and bus.metric(APPLIED) == 0
        # The old limit holds, and everyone is still connected.
        assert bus.metric(LARGEST) == 100
        assert bus.metric("sbus_clients_connected") == 3
        assert 'sbus_disconnects_total{reason="closed"}' not in {
            k for k, v in bus.metrics().items() if v
        }
        stalled.whoami()

        write_config(config, hard_limit_messages=200)  # fixed: taken, and said so
        reload(bus)
        assert bus.metric(LAST_OK) == 1
        reader.close()  # it would hold the publisher now (hard/block)
        flood(publisher, 2000, start=total)
        bus.wait_metric(LARGEST, 200)
        for peer in (stalled, publisher):
            peer.close()
    finally:
        bus.stop()


class FileBus:
    """``sbus-relay serve -C FILE`` alone, as ``make run`` starts it: the address
    and the metrics address come from the file."""

    def __init__(self, tmp_path: Path, config: Path, address: str) -> None:
        self.address = address
        self.stderr = tmp_path / "serve.err"
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(
                [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-C", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        wait_until(lambda: is_listening(address) or self.proc.poll() is not None, "listening")
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)


def test_what_cannot_change_live_is_named_in_one_line_and_kept(
    tmp_path: Path, bus_dir: str
) -> None:
    address = os.path.join(bus_dir, "bus")
    port = free_port()
    settings: dict[str, Any] = {
        "address": address,
        "foreground": True,
        "log_format": "json",
        "metrics": f"127.0.0.1:{port}",
    }
    config = write_config(tmp_path / "bus.yaml", **settings)
    bus = FileBus(tmp_path, config, address)
    try:
        moved = {
            **settings,
            "address": os.path.join(bus_dir, "elsewhere"),
            "metrics": f"127.0.0.1:{free_port()}",
            "upstream": os.path.join(bus_dir, "nothing-there"),
            "max_clients": 2,
        }
        write_config(config, **moved)
        os.kill(bus.proc.pid, signal.SIGHUP)
        wait_until(lambda: events(bus.log(), "config.kept"), "the kept line")
        (kept,) = events(bus.log(), "config.kept")
        assert kept["fields"] == ["address", "upstream", "metrics"]
        assert kept["level"] == "warning"
        assert "address" in kept["detail"] and "upstream" in kept["detail"]
        (done,) = events(bus.log(), "config.reloaded")
        assert done["changed"] == ["max_clients"]
        # Still where it was, a master, with its metrics where they were ...
        assert is_listening(address) and not os.path.exists(moved["address"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b'role="master"' in r.read()
        # ... and the live field taken: a third client is refused.
        first, second = Peer(address), Peer(address)
        first.sync()
        second.sync()
        third = Peer(address)
        assert third.is_closed(), "a third client was served with max_clients 2"
        for peer in (first, second, third):
            peer.close()
    finally:
        bus.stop()
    assert bus.proc.returncode == 0


def test_flags_keep_precedence_over_the_file_on_reload(tmp_path: Path, bus_dir: str) -> None:
    config = write_config(tmp_path / "bus.yaml", hard_limit_messages=100)
    bus = Bus(
        tmp_path,
        os.path.join(bus_dir, "bus"),
        "-C",
        str(config),
        "--hard-limit-messages",
        "80",
        "--instance",
        "from-the-flag",
    )
    try:
        write_config(config, hard_limit_messages=500, instance="from-the-file", max_clients=9)
        reload(bus)
        (line,) = events(bus.log(), "config.reloaded")
        assert line["changed"] == ["max_clients"]
        stalled = Peer(bus.address)
        stalled.sub(b"k/")
        publisher = Peer(bus.address)
        flood(publisher, 3000)
        bus.wait_metric(LARGEST, 80)
        assert 'sbus_build_info{name="from-the-flag",role="master",version' in " ".join(
            bus.metrics()
        )
        stalled.close()
        publisher.close()
    finally:
        bus.stop()


def test_log_level_and_log_file_change_live(tmp_path: Path, bus_dir: str) -> None:
    log_file = tmp_path / "bus.log"
    config = write_config(tmp_path / "bus.yaml", log_level="warning")
    bus = Bus(tmp_path, os.path.join(bus_dir, "bus"), "-C", str(config))
    try:
        Peer(bus.address).close()
        time.sleep(0.2)
        assert not events(bus.log(), "client.connected")  # info: below warning

        write_config(config, log_level="info", log_file=str(log_file), instance="renamed")
        reload(bus)
        Peer(bus.address).close()
        wait_until(lambda: log_file.exists() and "client.connected" in log_file.read_text(), "")
        (connected,) = events(log_file.read_text(), "client.connected")
        assert connected["instance"] == "renamed"
        assert not events(bus.log(), "client.connected")  # stderr no longer gets them

        # logrotate moves the file away, then asks for a reload: a new file is made.
        rotated = log_file.rename(tmp_path / "bus.log.1")
        reload(bus)
        Peer(bus.address).close()
        wait_until(lambda: log_file.exists() and "client.connected" in log_file.read_text(), "")
        assert len(events(rotated.read_text(), "client.connected")) == 1
        assert 'name="renamed"' in " ".join(bus.metrics())
    finally:
        bus.stop()


def test_the_socket_mode_follows_group_and_other_access(tmp_path: Path, bus_dir: str) -> None:
    config = write_config(tmp_path / "bus.yaml")
    bus = Bus(tmp_path, os.path.join(bus_dir, "bus"), "-C", str(config))
    try:
        assert stat.S_IMODE(os.stat(bus.address).st_mode) == 0o700
        write_config(config, group_access=True)
        reload(bus)
        assert stat.S_IMODE(os.stat(bus.address).st_mode) == 0o770
        write_config(config, group_access=True, other_access=True)
        reload(bus)
        assert stat.S_IMODE(os.stat(bus.address).st_mode) == 0o777
        write_config(config)
        reload(bus)
        assert stat.S_IMODE(os.stat(bus.address).st_mode) == 0o700
    finally:
        bus.stop()


def connect_as(uid: int, address: str) -> socket.socket:
    """A connection made by a child process running as ``uid`` (its credentials
    are what the bus sees), handed back to us over SCM_RIGHTS."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    pid = os.fork()
    if pid == 0:  # the child: plain system calls, then _exit
        status = 1
        try:
            ours.close()
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(address)
            socket.send_fds(theirs, [b"fd"], [sock.fileno()])
            status = 0
        finally:
            os._exit(status)
    theirs.close()
    try:
        ours.settimeout(15)
        _, fds, _, _ = socket.recv_fds(ours, 16, 1)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    return socket.socket(fileno=fds[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="connects as another user (needs root)")
def test_a_user_taken_off_the_allowed_users_is_disconnected(tmp_path: Path, bus_dir: str) -> None:
    config = write_config(tmp_path / "bus.yaml", users=[NOBODY])
    os.chmod(bus_dir, 0o755)
    bus = Bus(tmp_path, os.path.join(bus_dir, "bus"), "-C", str(config), "-o")
    try:
        theirs = connect_as(NOBODY, bus.address)
        theirs.settimeout(5)
        mine = Peer(bus.address)
        mine.sub(b"k/")
        bus.wait_metric("sbus_users_connected", 2)

        write_config(config, users=[0])
        reload(bus)
        assert theirs.recv(4096) == b"CMSG disconnect\0user_not_allowed: no longer among the" \
            b" allowed users"  # fmt: skip
        assert theirs.recv(4096) == b""
        bus.wait_metric('sbus_disconnects_total{reason="user_not_allowed"}', 1)
        refused = connect_as(NOBODY, bus.address)
        refused.settimeout(5)
        assert refused.recv(4096) == b"CMSG disconnect\0user_not_allowed"
        mine.sync()  # our own user is untouched
        theirs.close()
        refused.close()
        mine.close()
    finally:
        bus.stop()


def test_a_hangup_of_the_terminal_stops_a_foreground_bus_and_kill_hup_reloads(
    tmp_path: Path, bus_dir: str
) -> None:
    """``make run`` in a terminal: closing the terminal stops the bus, as the
    reference's ``sbusd -f`` does; a SIGHUP sent while the terminal is there reloads."""
    address = os.path.join(bus_dir, "bus")
    config = write_config(tmp_path / "bus.yaml", log_format="json")
    master, slave = pty.openpty()
    err = tmp_path / "serve.err"

    def own_terminal() -> None:  # a session of its own, the pty its terminal
        os.setsid()
        # as in a terminal's shell, whatever this test runs under (nohup, a CI runner)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-f", "-a", address, "-C", str(config)],
            stdin=slave,
            stdout=slave,
            stderr=stderr,
            preexec_fn=own_terminal,
        )
    os.close(slave)
    try:
        wait_until(lambda: is_listening(address), "listening")
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: events(err.read_text(), "config.reloaded"), "the reload")
        assert proc.poll() is None
        os.close(master)  # the terminal goes away: the kernel hangs it up
        master = -1
        assert proc.wait(10) == 0, err.read_text()
        assert not os.path.exists(address)
        (hup,) = [e for e in events(err.read_text(), "signal") if e.get("hangup")]
        assert hup["signal"] == "SIGHUP"
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_check_validates_the_config_without_serving(tmp_path: Path) -> None:
    good = write_config(tmp_path / "good.yaml", hard_limit_messages=10)
    done = run_cli("serve", "--check", "-C", str(good))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{good}: valid\n".encode(), b"")
    bad = write_config(tmp_path / "bad.yaml", hard_limit_messages="lots")
    done = run_cli("serve", "--check", "-C", str(bad))
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        f"sbus-relay serve: {bad}: hard_limit_messages: expected an integer, got 'lots' (str)"
    ]


def test_a_higher_limit_releases_a_publisher_held_by_a_full_block_mode_subscriber(
    tmp_path: Path, bus_dir: str
) -> None:
    config = write_config(tmp_path / "bus.yaml", hard_limit_messages=100)
    bus = Bus(tmp_path, os.path.join(bus_dir, "bus"), "-C", str(config))
    try:
        stalled = Peer(bus.address)
        stalled.send(b"CMSG blocking/hard/block")  # over its limit, publishers wait
        stalled.sub(b"k/")
        publisher = Peer(bus.address)
        publisher.sock.settimeout(0.05)
        with pytest.raises(TimeoutError):  # the bus stops reading it: its sends block
            for i in range(100_000):
                publisher.pub(b"k/%d" % i, b"x" * 32)
        bus.wait_metric("sbus_blocked_publishers", 1)
        # at the limit, the packet that filled it queued too: the publisher waits
        wait_until(lambda: bus.metric(LARGEST) >= 100, "the queue at its limit")
        held = bus.metric(LARGEST)
        time.sleep(0.3)
        assert bus.metric(LARGEST) == held  # and stays so: the publisher is not read

        write_config(config, hard_limit_messages=1000)
        reload(bus)
        # released at once: the bus reads what waits in its socket, past the old limit
        wait_until(lambda: bus.metric(LARGEST) > held, "the queue past the old limit")
        wait_until(lambda: bus.metric("sbus_blocked_publishers") == 0, "the publisher released")
        stalled.close()
        publisher.close()
    finally:
        bus.stop()
