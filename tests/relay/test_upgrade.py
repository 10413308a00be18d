"""Live upgrades (docs/deploy.md, "Upgrade"): a bus hands itself to a new process and
nobody notices, under load, on a master and on relays, with C clients.

Every bus here is a real process; the load is the benchmark's C load generator
(reference-protocol clients: sendmmsg/recvmmsg on plain sockets), which counts
gaps and reorderings per publisher sequence, so a lost, duplicated or
reordered message cannot hide.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbus_relay.bench.build import build_programs
from sbus_relay.cli.upgrade import LOOK_EVERY
from sbus_relay.ops.addresses import parse_address
from sbus_relay.ops.supervisor import listener_pid
from sbus_relay.protocol.limits import UPGRADE_WAIT
from tests.relay.conftest import Hierarchy
from tests.relay.helpers import Bus, wait_until
from tests.support import VENV_BIN, run_cli, start_bus

pytestmark = pytest.mark.timeout(120)

#: Messages per publisher, and their rate: long enough for three upgrades in the middle.
MESSAGES = 12_000
RATE = 3_000


@pytest.fixture(scope="module")
def loadgen() -> str:
    return str(build_programs()["loadgen"])


def serving_pid(address: str) -> int:
    pid = listener_pid(parse_address(address))
    assert pid, f"no bus answers on {address}"
    return pid


@pytest.fixture
def upgraded(tree: Hierarchy) -> Iterator[list[str]]:
    """Addresses whose buses were upgraded: their new processes are stopped after."""
    addresses: list[str] = []
    yield addresses
    for address in addresses:
        pid = listener_pid(parse_address(address))
        if pid:
            os.kill(pid, signal.SIGTERM)


def upgrade(address: str) -> str:
    """``sbus-relay upgrade -a ADDRESS``; its one line."""
    before = serving_pid(address)
    done = run_cli("upgrade", "-a", address, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    after = serving_pid(address)
    assert after != before
    line = done.stdout.decode().strip()
    assert line == f"{address}: pid {before} -> pid {after}"
    return line


class Load:
    """C subscribers and one C publisher at a fixed rate, started together."""

    def __init__(self, loadgen: str, pub_at: str, sub_at: list[str]) -> None:
        self.subs = [
            subprocess.Popen(
                [
                    loadgen,
                    "sub",
                    "-a",
                    a,
                    "-n",
                    str(MESSAGES),
                    "-t",
                    "5",
                    "-T",
                    "60",
                    "-p",
                    "bench/",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for a in sub_at
        ]
        for sub in self.subs:
            assert sub.stdout is not None and sub.stdout.readline().strip() == "ready"
        self.pub = subprocess.Popen(
            [loadgen, "pub", "-a", pub_at, "-n", str(MESSAGES), "-r", str(RATE), "-k", "bench",
             "-x", "distinct", "-w", "-T", "60"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.pub.stdout is not None and self.pub.stdout.readline().strip() == "ready"
        assert self.pub.stdin is not None
        self.pub.stdin.write("go\n")
        self.pub.stdin.flush()

    def results(self) -> list[dict]:
        """What each subscriber counted (the publisher hangs up once they are done)."""
        out = []
        for sub in self.subs:
            text, _ = sub.communicate(timeout=60)
            out.append(json.loads(text.strip().splitlines()[-1]))
        self.pub.communicate("", timeout=30)
        return out


def test_master_and_relays_upgraded_under_load_lose_nothing(
    tree: Hierarchy, upgraded: list[str], loadgen: str
) -> None:
    master = tree.bus("m")
    a = tree.bus("a", upstream=master)
    b = tree.bus("b", upstream=master)
    for relay in (a, b):
        relay.wait_log("upstream.interest_ready")
    load = Load(loadgen, a.address, [master.address, b.address])
    time.sleep(0.8)
    for bus in (a, master, b):  # a relay, the master between them, the other relay
        upgraded.append(bus.address)
        upgrade(bus.address)
        time.sleep(0.4)
    results = load.results()
    for result in results:
        assert (result["count"], result["gaps"], result["reordered"]) == (MESSAGES, 0, 0)
    # the counters went on: the master's new process counts what its old one did
    # (each message was handed to two of its clients: the subscriber, relay b)
    delivered = master.metric("sbus_messages_delivered_total")
    assert delivered == 2 * MESSAGES, delivered
    took = master.events("upgrade.took_over") + master.events("upgrade.handed_over")
    assert len(took) == 2, master.log()[-3000:]


def test_a_new_process_that_fails_leaves_the_old_one_serving(
    tree: Hierarchy, tmp_path: Path
) -> None:
    config = tmp_path / "bus.yaml"
    config.write_text("max_clients: 100\n")
    bus = tree.bus("m", "-C", str(config))
    sub, pub = tree.peer(bus), tree.peer(bus)
    sub.sub(b"k/")
    config.write_text("max_clients: 100\nno_such_key: 1\n")  # the new process cannot start
    t0 = time.monotonic()
    failed = run_cli("upgrade", "-a", bus.address, timeout=60)
    waited = time.monotonic() - t0
    assert failed.returncode == 1
    assert f"the bus on {bus.address} is still pid {bus.pid}" in failed.stderr.decode()
    # said when the new process ended, not after the whole wait for one that runs on
    assert waited < UPGRADE_WAIT / 2, waited
    wait_until(lambda: bus.events("upgrade.failed"), "upgrade.failed in the log")
    (line,) = bus.events("upgrade.failed")
    assert "exited with status 2 before taking the bus over" in line["reason"]
    packet = pub.pub(b"k/after", b"still served")
    assert sub.messages(1) == [packet]  # the same connections, served by the same process
    # while it waited, the command looked who answers about once a second, not
    # ten times: each look is a connection in the bus's log (the look before
    # signalling, the first, one a second, the last)
    looks = [e for e in bus.events("client.connected") if e["pid"] != os.getpid()]
    assert 1 < len(looks) <= waited / LOOK_EVERY + 3, (len(looks), waited)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_user_cannot_take_the_bus_over(tree: Hierarchy) -> None:
    os.chmod(tree.dir, 0o755)  # its socket reachable by another user
    bus = tree.bus("m", "-o")  # everyone may connect
    sub = tree.peer(bus)
    sub.sub(b"k/")
    code = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        f"s.connect({bus.address!r}); s.send(b'CMSG upgrade/take-over')\n"
        "s.settimeout(5); sys.stdout.write(repr(s.recv(1000)))\n"
    )
    out = subprocess.run(
        [os.path.join(VENV_BIN, "python"), "-c", code], capture_output=True, text=True, timeout=30
    )
    assert out.stdout == repr(b"CMSG upgrade/refused\0not the bus's own user"), out.stderr
    assert listener_pid(parse_address(bus.address)) == bus.pid
    packet = tree.peer(bus).pub(b"k/x", b"y")
    assert sub.messages(1) == [packet]


def test_systemd_is_told_the_new_main_pid(
    tmp_path: Path, upgraded: list[str], tree: Hierarchy
) -> None:
    notify_path = os.path.join(tree.dir, "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": notify_path}
    bus = start_bus(tmp_path, "-a", tree.path("m"), command="serve", env=env)
    try:
        assert listener.recv(1000) == b"READY=1"
        upgraded.append(bus.address)
        line = upgrade(bus.address)
        new = int(line.rsplit(" ", 1)[1])
        assert listener.recv(1000) == f"MAINPID={new}\nREADY=1".encode()
    finally:
        listener.close()
        bus.stop()


def test_a_daemon_leaves_its_pid_file_and_socket_to_the_new_process(tree: Hierarchy) -> None:
    address, pidfile = tree.path("d"), tree.path("d.pid")
    started = run_cli("serve", "-a", address, "-p", pidfile)
    assert started.returncode == 0, started.stderr.decode()
    old = int(Path(pidfile).read_text())
    try:
        line = upgrade(address)
        new = int(line.rsplit(" ", 1)[1])
        assert int(Path(pidfile).read_text()) == new
        wait_until(lambda: not os.path.exists(f"/proc/{old}"), "the old process to end")
        assert os.path.exists(address)  # left to the new process, not removed
    finally:
        os.kill(serving_pid(address), signal.SIGTERM)
    wait_until(lambda: not os.path.exists(pidfile), "the new daemon's clean-up")
    assert not os.path.exists(address)


def test_a_relay_reconnects_when_its_upstream_binds_again_not_after_its_back_off(
    tree: Hierarchy, tmp_path: Path
) -> None:
    master = tree.bus("m")
    relay = tree.bus("r", "--reconnect-min", "20", "--reconnect-max", "20", upstream=master)
    relay.wait_log("upstream.ready")
    master.stop()
    wait_until(lambda: relay.events("upstream.lost"), "the relay to notice")
    time.sleep(0.5)  # its first retry failed: the next is 20 s away
    back = Bus(tmp_path, master.address)
    tree.buses.append(back)
    try:
        wait_until(lambda: len(relay.events("upstream.ready")) == 2, "the relay back", timeout=5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{relay.log()[-2500:]}") from None


def test_a_hierarchy_file_given_as_an_address_is_named_as_one(tmp_path: Path) -> None:
    hierarchy = tmp_path / "tree.yaml"
    hierarchy.write_text("buses: []\n")
    done = run_cli("upgrade", "-a", str(hierarchy))
    assert done.returncode == 2 and not done.stdout
    said = done.stderr.decode()
    assert said.count("\n") == 1 and "Traceback" not in said
    assert f"{hierarchy} is a hierarchy file" in said
    assert f"sbus-relay upgrade {hierarchy} (without -a)" in said


def _two_bus_tree(tmp_path: Path, sock_dir: Path) -> tuple[Path, subprocess.Popen[str]]:
    """``sbus-relay up`` of a master and a relay, both serving."""
    hierarchy = tmp_path / "tree.yaml"
    hierarchy.write_text(
        f"log_dir: {tmp_path}\n"
        "buses:\n"
        f"  - name: master\n    address: {sock_dir}/m.sock\n"
        f"  - name: relay\n    address: {sock_dir}/r.sock\n    upstream: master\n"
    )
    relay_log = tmp_path / "relay.log"
    up = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "up", hierarchy.name],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    wait_until(
        lambda: relay_log.exists() and '"listening"' in relay_log.read_text(),
        "the relay serving",
    )
    return hierarchy, up


def test_up_upgrades_its_tree_and_its_buses_leave_upgrades_to_it(
    tmp_path: Path, short_tmp: Path
) -> None:
    sock_dir = short_tmp
    relay_log = tmp_path / "relay.log"
    hierarchy, up = _two_bus_tree(tmp_path, sock_dir)
    try:
        relay_pid = serving_pid(f"{sock_dir}/r.sock")
        os.kill(relay_pid, signal.SIGUSR2)  # a supervised bus says whom to ask instead
        wait_until(lambda: '"upgrade.supervised"' in relay_log.read_text(), "the relay's answer")
        assert serving_pid(f"{sock_dir}/r.sock") == relay_pid
        done = run_cli("upgrade", str(hierarchy), timeout=90)
        assert done.returncode == 0, done.stderr.decode()
        lines = done.stdout.decode().splitlines()
        assert lines[0].startswith("sbus-relay upgrade: asked sbus-relay up (pid ")
        assert [line.split(":")[0] for line in lines[1:]] == ["master", "relay"]
        assert serving_pid(f"{sock_dir}/r.sock") != relay_pid
    finally:
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=30)
    assert "master upgraded: pid" in out and "relay upgraded: pid" in out, out + err


def test_upgrade_of_one_bus_of_a_tree_says_it_upgrades_the_tree_and_follows_every_bus(
    tmp_path: Path, short_tmp: Path
) -> None:
    # up was started with a relative path: the tree is found from its directory
    hierarchy, up = _two_bus_tree(tmp_path, short_tmp)
    try:
        master, relay = serving_pid(f"{short_tmp}/m.sock"), serving_pid(f"{short_tmp}/r.sock")
        done = run_cli("upgrade", "-a", f"{short_tmp}/r.sock", timeout=90)
        assert done.returncode == 0, done.stderr.decode()
        lines = done.stdout.decode().splitlines()
        assert lines[0] == (
            f"sbus-relay upgrade: {short_tmp}/r.sock is bus relay of {hierarchy}, run by"
            f" sbus-relay up pid {up.pid}: it upgrades the whole tree, 2 buses (master, relay)"
        ), lines
        new_master, new_relay = (
            serving_pid(f"{short_tmp}/m.sock"),
            serving_pid(f"{short_tmp}/r.sock"),
        )
        assert lines[1:] == [
            f"master: pid {master} -> pid {new_master}",
            f"relay: pid {relay} -> pid {new_relay}",
        ]
        assert {new_master, new_relay}.isdisjoint({master, relay})
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=30)


def test_a_daemon_started_with_relative_paths_upgrades_and_a_failure_says_why(
    tree: Hierarchy, tmp_path: Path
) -> None:
    # As a user starts one from a checkout: `.venv/bin/sbusd ...`, `-C bus.yaml`.
    home = tmp_path / "home"
    home.mkdir()
    (home / "bin").symlink_to(VENV_BIN)
    (home / "bus.yaml").write_text("max_clients: 100\n")
    address, pidfile, log = tree.path("d"), tree.path("d.pid"), tmp_path / "d.log"
    argv = ["bin/sbus-relay", "serve", "-C", "bus.yaml", "-a", address, "-p", pidfile]
    started = subprocess.run(
        [*argv, "--log-file", str(log)],
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    assert started.returncode == 0, started.stderr.decode()
    try:
        upgrade(address)  # the daemon has left for /: the new process starts from home
        (home / "bus.yaml").write_text("max_clients: lots\n")
        failed = run_cli("upgrade", "-a", address, timeout=60)
        assert failed.returncode == 1
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        (why,) = [e["reason"] for e in lines if e["event"] == "upgrade.failed"]
        # the daemon's stderr goes nowhere: the new process's error reached its log
        assert why.endswith("bus.yaml: max_clients: expected an integer, got 'lots' (str)"), why
    finally:
        os.kill(serving_pid(address), signal.SIGTERM)
    wait_until(lambda: not os.path.exists(pidfile), "the daemon's clean-up")
