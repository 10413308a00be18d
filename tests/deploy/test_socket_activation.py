"""The units' commands, run for real without systemd as PID 1.

``systemd-socket-activate`` does what ``sbus-master.socket`` does: it binds a
SOCK_SEQPACKET socket, waits for the first connection, then execs the
master's ``ExecStart`` with the socket as descriptor 3 and ``LISTEN_FDS``.
The relay template's ``ExecStart`` then runs against that master.  Each
command is the unit's own (shipped.exec_argv); each config is the shipped one
with only its paths and port moved into the test's directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.shipped import (
    CONFIGS,
    DEPLOY,
    MASTER_SERVICE,
    MASTER_SOCKET,
    RELAY_TEMPLATE,
    Unit,
    config_files,
    environment,
    exec_argv,
    healthy,
    listening_inode,
    load,
    log_events,
    reload_argvs,
    scrape,
    stop,
    write_config,
)
from tests.relay.helpers import Peer, identity, wait_until
from tests.support import free_port, short_dir

STORED = "sbus_patterns_stored"
CONNECTED = "sbus_upstream_connected"


def find_socket_activate() -> str:
    path = shutil.which("systemd-socket-activate")
    if path is None:
        pytest.skip(
            "!!! systemd-socket-activate NOT FOUND: socket activation was NOT run.  "
            "Install Debian's 'systemd' package (systemd need not be running). !!!"
        )
    return path


def listening_events(master: Master) -> list[dict[str, Any]]:
    return [e for e in log_events(master.stderr_path) if e["event"] == "listening"]


class Master:
    """``sbus-master.service``'s command on a socket bound as ``sbus-master.socket`` says.

    ``activated`` runs it under ``systemd-socket-activate``; otherwise ``start``
    runs it on ``held``, a socket this test holds as systemd would across
    restarts of the service.
    """

    def __init__(self, tmp_path: Path, directory: str) -> None:
        socket_unit, self.service = load(MASTER_SOCKET), load(MASTER_SERVICE)
        self.tmp_path = tmp_path
        self.path = os.path.join(directory, "master.sock")
        self.mode = int(socket_unit.value("Socket", "SocketMode"), 8)
        # The config's own address: a master that bound it instead of taking
        # the inherited socket would create this file.
        self.configured = os.path.join(directory, "configured.sock")
        self.port = free_port()
        self.etc = Path(directory) / "etc"
        self.etc.mkdir(exist_ok=True)
        (name,) = config_files(self.service)
        write_config(
            CONFIGS / name, self.etc / name,
            address=self.configured,
            pidfile=os.path.join(directory, "master.pid"),
            metrics=f"127.0.0.1:{self.port}",
        )  # fmt: skip
        self.argv = exec_argv(self.service, self.etc)
        self.stderr_path = tmp_path / "master.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.held: socket.socket | None = None
        #: what systemd adds to the unit's environment (NOTIFY_SOCKET for Type=notify)
        self.systemd_env: dict[str, str] = {}

    def activated(self) -> subprocess.Popen[bytes]:
        """Bind and wait for the first connection, as systemd does, then exec the service."""
        argv = [find_socket_activate(), "--seqpacket", "-l", self.path]
        for pair in [*environment(self.service), *map("=".join, self.systemd_env.items())]:
            argv += ["-E", pair]
        self.proc = self._popen([*argv, *self.argv])
        wait_until(lambda: self._alive() and listening_inode(self.path), f"{self.path} bound")
        # SocketMode=: systemd binds with it; here the file gets it before any
        # connection can start the service.
        os.chmod(self.path, self.mode)
        return self.proc

    def hold(self) -> socket.socket:
        """Bind the socket in this process, as systemd keeps it between restarts."""
        self.held = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.held.bind(self.path)
        os.chmod(self.path, self.mode)
        self.held.listen(16)
        return self.held

    def start(self) -> subprocess.Popen[bytes]:
        """Start the service on the held socket (descriptor 3, LISTEN_FDS=1)."""
        assert self.held is not None
        fd = self.held.fileno()
        script = f'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@" 3<&{fd}'
        self.proc = self._popen(["bash", "-c", script, "bash", *self.argv], pass_fds=(fd,))
        wait_until(lambda: self._alive() and healthy(self.port), "the master's /healthz")
        return self.proc

    def _popen(self, argv: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        # The service's environment is what systemd gives: the unit's own Environment=.
        env = {"PATH": os.defpath, **dict(p.split("=", 1) for p in environment(self.service))}
        env.update(self.systemd_env)
        with open(self.stderr_path, "ab") as err:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                env=env, pass_fds=pass_fds,
            )  # fmt: skip

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the master exited with {self.proc.returncode}:\n{self.log()}")
        return True

    def log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def metric(self, name: str) -> float:
        return scrape(self.port).get(name, 0.0)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.held is not None:
            self.held.close()


class TemplateRelay:
    """``sbus-relay@NAME.service``'s command, reading the shipped example as relay-NAME.yaml."""

    def __init__(self, tmp_path: Path, directory: str, upstream: str, instance: str) -> None:
        unit = load(RELAY_TEMPLATE)
        etc = Path(directory) / "etc"
        etc.mkdir(exist_ok=True)
        (name,) = config_files(unit, instance)
        assert name == f"relay-{instance}.yaml", name
        self.path = os.path.join(directory, f"relay-{instance}.sock")
        self.port = free_port()
        write_config(
            DEPLOY / "relay-example.yaml", etc / name,
            address=self.path, upstream=upstream, metrics=f"127.0.0.1:{self.port}",
        )  # fmt: skip
        self.argv = exec_argv(unit, etc, instance)
        self.stderr_path = tmp_path / f"relay-{instance}.err"
        self.proc = self.start()

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                env={"PATH": os.defpath},
            )  # fmt: skip
        wait_until(lambda: self._alive() and healthy(self.port), f"{self.path}'s /healthz")
        assert listening_inode(self.path), f"the relay does not listen on {self.path}"
        return self.proc

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            log = self.stderr_path.read_text(errors="replace")
            raise AssertionError(f"the relay exited with {self.proc.returncode}:\n{log}")
        return True

    def metric(self, name: str) -> float:
        return scrape(self.port).get(name, 0.0)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def directory() -> Any:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def master(tmp_path: Path, directory: str) -> Any:
    bus = Master(tmp_path, directory)
    yield bus
    bus.close()


@pytest.fixture
def peers() -> Any:
    opened: list[Peer] = []

    def peer(address: str) -> Peer:
        opened.append(Peer(address))
        return opened[-1]

    yield peer
    for one in opened:
        one.close()


@pytest.mark.timeout(60)
def test_master_starts_on_the_first_connection_on_the_inherited_socket(
    master: Master, peers: Any
) -> None:
    proc = master.activated()
    inode = listening_inode(master.path)
    # Nothing has connected: the socket is bound, the service not started.
    with open(f"/proc/{proc.pid}/comm") as comm:
        assert comm.read().startswith("systemd-socket")
    subscriber = peers(master.path)  # this connection starts the master
    wait_until(lambda: listening_events(master), "the master's 'listening' log event")
    # It serves the socket it was given, not the address in its config.
    assert [e["address"] for e in listening_events(master)] == [master.path], master.log()
    subscriber.sub(b"deploy/")
    sent = peers(master.path).pub(b"deploy/activated", b"through the activated socket")
    assert subscriber.messages(1) == [sent]
    # The very process systemd-socket-activate was, now our server...
    with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
        assert b"serve" in cmdline.read().split(b"\0")
    # ...serving on descriptor 3, the socket bound before it started, never re-bound.
    assert os.readlink(f"/proc/{proc.pid}/fd/3") == f"socket:[{inode}]"
    assert listening_inode(master.path) == inode
    assert not os.path.lexists(master.configured)
    assert stat.S_IMODE(os.stat(master.path).st_mode) == master.mode  # SocketMode kept


@pytest.mark.timeout(60)
def test_activated_master_stops_cleanly_on_sigterm(master: Master, peers: Any) -> None:
    proc = master.activated()
    client = peers(master.path)
    client.sync()
    # systemd stops a service with SIGTERM; Restart=on-failure restarts it
    # only if it exits with a failure.
    assert stop(proc) == 0, master.log()
    assert client.is_closed()
    exited = [e for e in log_events(master.stderr_path) if e["event"] == "exited"]
    assert [e["status"] for e in exited] == [0], master.log()
    # The socket file is systemd's (RemoveOnStop=yes): the service leaves it.
    assert stat.S_ISSOCK(os.stat(master.path).st_mode)
    assert not os.path.lexists(master.configured)


@pytest.mark.timeout(90)
def test_activated_master_notifies_systemd_and_upgrades_in_place_on_sigusr2(
    master: Master, peers: Any, directory: str
) -> None:
    # Type=notify: systemd waits for READY=1; NotifyAccess=all lets the process
    # that takes the bus over name itself the main one (MAINPID=).
    assert master.service.value("Service", "Type") == "notify"
    assert master.service.value("Service", "NotifyAccess") == "all"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(directory, "notify"))
    notify.settimeout(30)
    master.systemd_env["NOTIFY_SOCKET"] = notify.getsockname()
    proc = master.activated()
    inode = listening_inode(master.path)
    new = 0
    try:
        subscriber = peers(master.path)  # starts the master
        assert notify.recv(1000) == b"READY=1"
        subscriber.sub(b"deploy/")
        publisher = peers(master.path)
        before = publisher.pub(b"deploy/1", b"before the upgrade")
        assert subscriber.messages(1) == [before]
        # what `systemctl kill -s SIGUSR2 --kill-whom=main sbus-master` does
        os.kill(proc.pid, signal.SIGUSR2)
        try:
            said = dict(line.split("=", 1) for line in notify.recv(1000).decode().split())
        except TimeoutError:
            raise AssertionError(master.log()) from None
        new = int(said["MAINPID"])
        assert new != proc.pid and said["READY"] == "1"
        assert proc.wait(timeout=30) == 0, master.log()
        # the same connections, the same subscription, the same socket file
        after = publisher.pub(b"deploy/2", b"after the upgrade")
        assert subscriber.messages(1) == [after]
        assert listening_inode(master.path) == inode
        peers(master.path).sync()  # and new clients are served by the new process
        took = [e for e in log_events(master.stderr_path) if e["event"] == "upgrade.took_over"]
        assert [e["from_pid"] for e in took] == [proc.pid], master.log()
    finally:
        notify.close()
        if new:
            os.kill(new, signal.SIGTERM)
            wait_until(lambda: not os.path.exists(f"/proc/{new}"), "the new master to stop")


@pytest.mark.timeout(60)
def test_activated_master_serves_metrics_for_prometheus(master: Master, peers: Any) -> None:
    master.activated()
    peers(master.path).sync()
    # one look with a 2 s timeout failed on a loaded machine: wait for the answer
    wait_until(lambda: healthy(master.port), "/healthz to answer 200")
    samples = scrape(master.port)
    assert samples["sbus_clients_connected"] == 1
    assert any(name.startswith("sbus_build_info") for name in samples), sorted(samples)


@pytest.mark.timeout(90)
def test_relay_template_command_relays_the_activated_master(
    tmp_path: Path, directory: str, master: Master, peers: Any
) -> None:
    proc = master.activated()
    relay = TemplateRelay(tmp_path, directory, master.path, "test")
    # The relay's connection is what started the master (Requires= + activation).
    wait_until(lambda: relay.metric(CONNECTED) == 1, "the relay connected upstream")
    with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
        assert b"serve" in cmdline.read().split(b"\0")
    below = peers(relay.path)
    assert below.whoami() == identity(relay.proc.pid, os.getpid())
    below.sub(b"deploy/")
    wait_until(lambda: master.metric(STORED) == 1, "the relay's SUB on the master")
    sent = peers(master.path).pub(b"deploy/down", b"master to relay")
    assert below.messages(1) == [sent]
    assert stop(relay.proc) == 0
    assert not os.path.lexists(relay.path)  # the relay's own socket file: removed
    assert stop(proc) == 0, master.log()


@pytest.mark.timeout(90)
def test_relay_template_restarts_over_its_stale_socket(
    tmp_path: Path, directory: str, master: Master, peers: Any
) -> None:
    master.activated()
    relay = TemplateRelay(tmp_path, directory, master.path, "crash")
    try:
        relay.proc.kill()  # a crash: Restart=on-failure runs the same command again
        relay.proc.wait()
        assert stat.S_ISSOCK(os.lstat(relay.path).st_mode)  # left behind
        relay.start()  # the unit's -r removes the stale file
        client = peers(relay.path)
        client.sub(b"again/")
        sent = peers(relay.path).pub(b"again/x")
        assert client.messages(1) == [sent]
        assert stop(relay.proc) == 0
    finally:
        relay.close()


@pytest.mark.timeout(120)
def test_master_restart_keeps_the_socket_and_the_relay_comes_back(
    tmp_path: Path, directory: str, master: Master, peers: Any
) -> None:
    master.hold()
    inode = os.stat(master.path).st_ino
    master.start()
    relay = TemplateRelay(tmp_path, directory, master.path, "back")
    try:
        wait_until(lambda: relay.metric(CONNECTED) == 1, "the relay connected upstream")
        below = peers(relay.path)
        below.sub(b"deploy/")
        wait_until(lambda: master.metric(STORED) == 1, "the relay's SUB on the master")
        # The master crashes; the socket stays with systemd and keeps accepting.
        assert master.proc is not None
        master.proc.kill()
        master.proc.wait()
        wait_until(lambda: relay.metric(CONNECTED) == 0, "the relay saw the master go")
        early = peers(master.path)  # waits in the backlog instead of failing
        master.start()
        early.sync()
        wait_until(lambda: relay.metric(CONNECTED) == 1, "the relay reconnected")
        wait_until(lambda: master.metric(STORED) == 1, "the relay's SUB sent again")
        sent = early.pub(b"deploy/after", b"same socket file")
        assert below.messages(1) == [sent]
        # The same file, the same socket: a bind mount of it stays valid.
        assert os.stat(master.path).st_ino == inode
        assert stop(relay.proc) == 0
        assert master.proc is not None and stop(master.proc) == 0, master.log()
    finally:
        relay.close()


def systemctl_reload(unit: Unit, etc: Path, pid: int, instance: str = "") -> Any:
    """Run the unit's ``ExecReload=`` commands as systemd does: in order, up to
    the first that fails (returned; None when all succeeded)."""
    for argv in reload_argvs(unit, etc, pid, instance):
        done = subprocess.run(
            argv, capture_output=True, timeout=30, check=False, env={"PATH": os.defpath}
        )
        if done.returncode != 0:
            return done
    return None


def edit(path: Path, **keys: Any) -> None:
    document = yaml.safe_load(path.read_text())
    document.update(keys)
    path.write_text(yaml.safe_dump(document))


def reloaded(stderr_path: Path) -> list[dict[str, Any]]:
    return [e for e in log_events(stderr_path) if e["event"] == "config.reloaded"]


@pytest.mark.timeout(90)
def test_systemctl_reload_checks_then_reloads_the_master(master: Master, peers: Any) -> None:
    proc = master.activated()
    client = peers(master.path)
    client.sub(b"deploy/")
    (name,) = config_files(master.service)
    edit(master.etc / name, accounting_top=3)
    assert systemctl_reload(master.service, master.etc, proc.pid) is None
    wait_until(lambda: reloaded(master.stderr_path), "the master's config.reloaded")
    assert reloaded(master.stderr_path)[0]["changed"] == ["accounting_top"]

    # An error: the check fails in one line and the bus never hears of it.
    edit(master.etc / name, accounting_top="many")
    failed = systemctl_reload(master.service, master.etc, proc.pid)
    assert failed is not None and failed.returncode == 2
    assert failed.stderr.decode().splitlines() == [
        f"sbus-relay serve: {master.etc / name}: accounting_top: expected an integer,"
        " got 'many' (str)"
    ]
    client.sync()  # still connected, still served
    assert master.metric('sbus_config_reloads_total{result="applied"}') == 1
    assert master.metric('sbus_config_reloads_total{result="refused"}') == 0
    assert stop(proc) == 0, master.log()


@pytest.mark.timeout(90)
def test_systemctl_reload_of_a_relay_instance(
    tmp_path: Path, directory: str, master: Master, peers: Any
) -> None:
    master.activated()
    relay = TemplateRelay(tmp_path, directory, master.path, "rl")
    try:
        below = peers(relay.path)
        below.sync()
        etc = Path(directory) / "etc"
        edit(etc / "relay-rl.yaml", upstream_queue_messages=1000)
        assert systemctl_reload(load(RELAY_TEMPLATE), etc, relay.proc.pid, "rl") is None
        wait_until(lambda: reloaded(relay.stderr_path), "the relay's config.reloaded")
        assert reloaded(relay.stderr_path)[0]["changed"] == ["upstream_queue_messages"]
        below.sync()
        assert relay.metric(CONNECTED) == 1
        assert stop(relay.proc) == 0
    finally:
        relay.close()
