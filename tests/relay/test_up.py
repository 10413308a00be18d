"""``sbus-relay up``: a supervised hierarchy of real processes, and the configs."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sbus_relay.ops.config import load_config
from sbus_relay.ops.hierarchy import hierarchy_from_mapping, load_hierarchy, plan_tree_reload
from sbus_relay.ops.supervisor import Supervisor, SupervisorError
from sbus_relay.protocol.errors import ConfigError
from tests.relay.helpers import WAIT, Peer, wait_until
from tests.support import VENV_BIN, free_port, read_line, run_cli, short_dir

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
#: "NAME (ROLE) listening at ADDRESS (pid PID, ...)" as printed by the supervisor
LISTENING = re.compile(rb"^(\S+) \(.*\) listening at (\S+) \(pid (\d+)")


class Up:
    """``sbus-relay up`` on a copy of dev-hierarchy.yaml with private paths and ports."""

    def __init__(
        self,
        tmp_path: Path,
        edit: Callable[[dict[str, Any]], None] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.dir = short_dir()
        document = yaml.safe_load((CONFIGS / "dev-hierarchy.yaml").read_text())
        document["log_dir"] = self.dir
        document["restart_min"] = 0.2
        for bus in document["buses"]:
            bus["address"] = os.path.join(self.dir, bus["name"])
            bus["metrics"] = f"127.0.0.1:{free_port()}"
        if edit is not None:
            edit(document)
        self.document = document
        self.config = tmp_path / "hierarchy.yaml"
        self.config.write_text(yaml.safe_dump(document))
        self.err = tmp_path / "up.err"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [os.path.join(VENV_BIN, "sbus-relay"), "up", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=cwd,
            )
        self.pids: dict[str, int] = {}
        self.addresses: dict[str, str] = {}

    def read_until(self, text: bytes) -> list[bytes]:
        """stdout lines up to the one containing ``text``; records bus pids."""
        assert self.proc.stdout is not None
        lines = []
        while True:
            line = read_line(self.proc.stdout.fileno(), WAIT)
            if not line:
                raise AssertionError(f"up exited: {self.err.read_text()}")
            lines.append(line)
            match = LISTENING.match(line)
            if match:
                name = match.group(1).decode()
                self.pids[name] = int(match.group(3))
                self.addresses[name] = match.group(2).decode()
            if text in line:
                return lines

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.pids.values():  # never leave a bus behind a failed test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    running = Up(tmp_path)
    try:
        yield running
    finally:
        running.close()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def sideways(sender: Peer, receiver: Peer, key: bytes) -> bytes:
    """Publish on one relay until the other's subscriber gets it (interest takes a
    moment to travel up and back down); returns the packet received."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        packet = sender.pub(key, b"hello")
        got = receiver.messages(1, drain=0, timeout=0.2)
        if got:
            assert got[0] == packet
            return packet
    raise AssertionError(f"{key!r} never crossed from one relay to the other")


def test_up_runs_the_hierarchy_restarts_the_dead_and_stops_all_on_sigint(up: Up) -> None:
    up.read_until(b"buses running")
    assert set(up.pids) == {"master", "relay-a", "relay-b"}
    receiver = Peer(up.addresses["relay-b"])
    receiver.sub(b"demo/")
    sender = Peer(up.addresses["relay-a"])
    sideways(sender, receiver, b"demo/hello")

    # a relay that dies is restarted (with a log line), and works again
    old = up.pids["relay-b"]
    os.kill(old, signal.SIGKILL)
    receiver.close()
    up.read_until(b"relay-b (relay of master) listening")
    assert up.pids["relay-b"] != old
    assert "relay-b killed by SIGKILL; restarting" in up.err.read_text()
    receiver = Peer(up.addresses["relay-b"])
    receiver.sub(b"demo/")
    sideways(sender, receiver, b"demo/again")
    receiver.close()
    sender.close()

    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(WAIT) == 0
    stopped = up.read_until(b"master stopped")
    # relays first, the master last
    assert [line.split()[0] for line in stopped] == [b"relay-b", b"relay-a", b"master"]
    for name, pid in up.pids.items():
        assert gone(pid), f"{name} (pid {pid}) survived the supervisor"
    wait_until(lambda: not any(os.path.exists(a) for a in up.addresses.values()), "sockets removed")
    assert sorted(os.listdir(up.dir)) == ["master.log", "relay-a.log", "relay-b.log"]  # no .lock


def test_up_refuses_a_bad_file_with_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "buses:\n"
        "  - {name: master, address: /tmp/x/m}\n"
        "  - {name: a, address: /tmp/x/a, upstream: b}\n"
        "  - {name: b, address: /tmp/x/b, upstream: a}\n"
    )
    result = run_cli("up", str(bad))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1, err
    assert str(bad) in err and "buses[a].upstream" in err and "cycle" in err


@pytest.mark.parametrize("command", ["up", "top"])
def test_a_bus_config_given_for_a_hierarchy_says_which_it_is(command: str, tmp_path: Path) -> None:
    config = tmp_path / "bus.yaml"
    config.write_text("address: /tmp/x/bus\nmetrics: 127.0.0.1:9999\n")
    result = run_cli(command, str(config))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1, err
    assert "this is one bus's config, not a hierarchy file" in err
    assert f"'sbus-relay serve -C {config}'" in err
    assert "'sbus-relay top --metrics 127.0.0.1:9999'" in err


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ('["--upstream-queue-messages", "lots"]', "--upstream-queue-messages: expected an integer"),
        ('["--no-such-flag"]', "unrecognized arguments: --no-such-flag"),
        ('["--max-clinets", "3"]', "--max-clinets 3 (did you mean --max-clients?)"),
        ('["-C", "/nonexistent/sbus.yaml"]', "/nonexistent/sbus.yaml"),
        ('["-a", "/tmp/x/b"]', "-a/--address is not for args: its 'address' key sets it"),
        ('["--upstream", "/tmp/x/a"]', "--upstream is not for args: its 'upstream' key sets it"),
        ('["--metrics", "127.0.0.1:0"]', "--metrics is not for args: its 'metrics' key sets it"),
        ('["--instance", "b"]', "--instance is not for args: its 'name' key sets it"),
        ('["--no-foreground"]', "up runs every bus in the foreground"),
        ('["--check"]', "--check is not for args: up runs every bus; `up --check` checks"),
    ],
    ids=[
        "bad value",
        "unknown flag",
        "misspelled flag",
        "missing config",
        "address",
        "upstream",
        "metrics",
        "instance",
        "daemon",
        "check",
    ],
)
def test_up_check_refuses_serve_flags_serve_would_refuse(
    tmp_path: Path, args: str, reason: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "buses:\n"
        "  - {name: master, address: /tmp/x/m}\n"
        f"  - {{name: a, address: /tmp/x/a, upstream: master, args: {args}}}\n"
    )
    for extra in (("--check",), ()):  # refused before anything starts
        result = run_cli("up", str(bad), *extra)
        assert result.returncode == 2
        err = result.stderr.decode()
        assert err.count("\n") == 1, err
        assert f"{bad}: buses[a].args: " in err and reason in err, err


def test_up_refuses_a_config_file_in_args_that_moves_a_bus_in_the_tree(tmp_path: Path) -> None:
    # A -C file given in args must not make the master a relay (of itself's
    # relay: a cycle the file's own check never saw).
    sneaky = tmp_path / "sneaky.yaml"
    sneaky.write_text("upstream: /tmp/x/a\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "buses:\n"
        f"  - {{name: master, address: /tmp/x/m, args: [-C, {sneaky}]}}\n"
        "  - {name: a, address: /tmp/x/a, upstream: master}\n"
    )
    result = run_cli("up", str(bad), "--check")
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        f"sbus-relay up: {bad}: buses[master].args: its config file sets upstream /tmp/x/a:"
        " the bus's own 'upstream' key decides that"
    ]


def test_a_second_up_of_a_running_tree_says_so_and_leaves_it_alone(up: Up, tmp_path: Path) -> None:
    up.read_until(b"buses running")
    logs_dir = Path(up.dir)
    settled = ('"listening"', '"upstream.interest_ready"')  # each relay's link is up too
    wait_until(
        lambda: all(
            all(e in (logs_dir / f"{n}.log").read_text() for e in settled[: 1 + (n != "master")])
            for n in up.pids
        ),
        "every bus up and linked",
    )
    sockets = {name: os.stat(address).st_ino for name, address in up.addresses.items()}
    logs = {p.name: p.read_text() for p in Path(up.dir).glob("*.log")}
    again = run_cli("up", str(up.config), timeout=WAIT)
    assert again.returncode == 1
    assert again.stdout == b""
    assert again.stderr.decode().splitlines() == [
        f"sbus-relay up: {up.config} is already up: sbus-relay up pid {up.proc.pid} runs it"
        f" (master answers at {up.addresses['master']}, pid {up.pids['master']}; 2 more of"
        f" its buses answer too); stop that one first (Ctrl-C where it runs, or kill"
        f" {up.proc.pid})"
    ]
    # The running tree is untouched: same processes, same sockets, and its logs
    # hold nothing but what its own buses wrote (e.g. the probes' connections):
    # no second bus started, failed or exited there.
    assert up.proc.poll() is None
    assert {n: os.stat(a).st_ino for n, a in up.addresses.items()} == sockets
    assert all(not gone(pid) for pid in up.pids.values())
    for path in Path(up.dir).glob("*.log"):
        added = path.read_text()[len(logs[path.name]) :]
        events = {json.loads(line)["event"] for line in added.splitlines()}
        assert not events & {"server.started", "listening", "exited"}, added
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(WAIT) == 0
    assert up.read_until(b"master stopped")


def test_a_failed_start_reports_each_stopped_bus_once(tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]

    def busy_relay_port(document: dict[str, Any]) -> None:
        document["buses"][1]["metrics"] = f"127.0.0.1:{port}"

    running = Up(tmp_path, busy_relay_port)
    try:
        assert running.proc.wait(WAIT) == 1
        assert running.proc.stdout is not None
        out = running.proc.stdout.read().decode()
        err = running.err.read_text()
        assert out.count("master stopped") == 1, out
        assert "relay-a stopped" not in out and "relay-b" not in out, out
        assert "relay-a exited with status 2 before listening" in err, err
    finally:
        blocker.close()
        running.close()


def test_a_failed_start_takes_back_the_log_dir_it_made_but_the_log_saying_why(
    tmp_path: Path,
) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]
    logs: list[Path] = []

    def busy_relay_port_and_a_new_log_dir(document: dict[str, Any]) -> None:
        logs.append(Path(document["log_dir"]) / "logs")
        document["log_dir"] = str(logs[0])
        document["buses"][1]["metrics"] = f"127.0.0.1:{port}"

    running = Up(tmp_path, busy_relay_port_and_a_new_log_dir)
    try:
        assert running.proc.wait(WAIT) == 1
        err = running.err.read_text()
        relay_log = logs[0] / "relay-a.log"
        assert f"(log {relay_log})" in err, err
        # the master's log went with it; the one the error names stays
        assert sorted(logs[0].iterdir()) == [relay_log], err
        assert "Address already in use" in relay_log.read_text()
    finally:
        blocker.close()
        running.close()


def test_a_failed_start_leaves_no_log_dir_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sbus_relay.ops import natscluster

    log_dir = tmp_path / "fleet"
    hierarchy = hierarchy_from_mapping(
        {
            "log_dir": str(log_dir),
            "nats_cluster": [{"name": "n1", "port": free_port(), "cluster_port": free_port()}],
            "buses": [{"name": "m", "address": str(tmp_path / "m.sock")}],
        },
        "fleet.yaml",
    )
    monkeypatch.setattr(natscluster, "binary", lambda: None)  # no nats-server installed
    with pytest.raises(SupervisorError, match="no nats-server"):
        Supervisor(hierarchy, out=lambda _line: None).start()
    assert not log_dir.exists()


def test_a_failed_start_leaves_what_was_in_the_log_dir_before(tmp_path: Path) -> None:
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own\n")
    old_log = tmp_path / "m.log"
    old_log.write_text("an earlier run\n")
    hierarchy = hierarchy_from_mapping(
        {
            "log_dir": str(tmp_path),
            "buses": [
                {"name": "m", "address": str(tmp_path / "m.sock")},
                {"name": "r", "address": str(tmp_path / "r.sock"), "upstream": "m",
                 "args": ["--hard-limit-bytes", "lots"]},
            ],
        },
        "tree.yaml",
    )  # fmt: skip
    with pytest.raises(SupervisorError, match="bus r exited with status 2"):
        Supervisor(hierarchy, out=lambda _line: None).start()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.log", "notes.txt", "r.log"]
    assert old_log.read_text().startswith("an earlier run\n")


@pytest.mark.parametrize(
    ("document", "key", "reason"),
    [
        ({"buses": [{"name": "m", "address": "/x", "upstream": "m"}]}, "upstream", "own"),
        ({"buses": [{"name": "m", "address": "/x", "upstream": "q"}]}, "upstream", "no bus"),
        ({"buses": [{"name": "m", "address": "/x", "metrics": "nope"}]}, "metrics", "HOST:PORT"),
        ({"buses": [{"name": "m", "adress": "/x"}]}, "adress", "did you mean 'address'?"),
        ({"buses": [{"name": "m"}]}, "address", "missing"),
        (
            {"buses": [{"name": "m", "address": "/x"}, {"name": "r", "address": "/x"}]},
            "address",
            "listens there too",
        ),
        ({"buses": [{"name": "m", "address": "/x"}], "restart_min": -1}, "restart_min", "positive"),
        (
            {"buses": [{"name": "m", "address": "/x"}], "restart_min": 5, "restart_max": 1},
            "restart_max",
            "1.0 is below restart_min 5.0",
        ),
        ({"buses": [{"name": "m", "address": "/x", "args": "-v"}]}, "args", "list"),
        ({"busses": []}, "busses", "unknown key; did you mean 'buses'?"),
        (
            {
                "buses": [
                    {"name": "m", "address": "/x", "metrics": "127.0.0.1:9900"},
                    {"name": "r", "address": "/y", "upstream": "m", "metrics": "0.0.0.0:9900"},
                ]
            },
            "metrics",
            "port also used",
        ),
    ],
)
def test_hierarchy_validation_names_key_and_reason(
    document: dict[str, object], key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        hierarchy_from_mapping(document, "h.yaml")
    assert caught.value.source == "h.yaml"
    assert caught.value.key.endswith(key), caught.value
    assert reason in caught.value.reason


def test_hierarchy_starts_parents_first() -> None:
    hierarchy = hierarchy_from_mapping(
        {
            "buses": [
                {"name": "leaf", "address": "/l", "upstream": "mid"},
                {"name": "mid", "address": "/m", "upstream": "top"},
                {"name": "top", "address": "/t"},
            ]
        },
        "h.yaml",
    )
    assert [b.name for b in hierarchy.buses] == ["top", "mid", "leaf"]


def shipped_configs() -> list[Path]:
    """Every bus config in configs/ (and the host relay instances of deploy/):
    not Prometheus's file, not the compose file."""
    top = [p for p in CONFIGS.glob("*.y*ml") if p.name not in ("prometheus.yml", "prometheus.yaml")]
    return sorted([*top, *(CONFIGS / "deploy").glob("relay-*.yaml")])


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: p.name)
def test_shipped_configs_load(path: Path) -> None:
    if path.name == "dev-hierarchy.yaml":
        hierarchy = load_hierarchy(str(path))
        assert hierarchy.buses[0].name == "master"
    elif path.name == "dev-fleet.yaml":  # tests/nats/test_up_fleet.py runs it
        assert len(load_hierarchy(str(path)).nats_cluster) == 3
    else:
        load_config(str(path))


def test_container_relay_config_points_at_the_mounted_master() -> None:
    config = load_config(str(CONFIGS / "relay.yaml"))
    assert config.address == "/run/sbus.socket"
    assert config.upstream == "/run/sbus-master/sbus.socket"
    assert config.upstream != config.address


def test_up_refuses_two_buses_on_one_socket_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    hierarchy = tmp_path / "h.yaml"
    hierarchy.write_text(
        "buses:\n"
        f"  - {{name: master, address: {real / 'bus.sock'}}}\n"
        f"  - {{name: relay, address: {tmp_path / 'link' / 'bus.sock'}, upstream: master}}\n"
    )
    result = run_cli("up", str(hierarchy))
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and "buses[relay].address" in lines[0], lines
    assert "listens there too" in lines[0]
    assert not (real / "bus.sock").exists()  # nothing was started


def test_up_refuses_a_config_nested_thousands_deep(tmp_path: Path) -> None:
    hierarchy = tmp_path / "deep.yaml"
    hierarchy.write_text("buses: " + "[" * 5000 + "]" * 5000 + "\n")
    result = run_cli("up", str(hierarchy))
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and "nested too deeply" in lines[0], lines


def test_shipped_configs_can_run_side_by_side() -> None:
    ports: dict[str, str] = {}
    sockets: dict[str, str] = {}
    for path in shipped_configs():
        if path.name in ("dev-hierarchy.yaml", "dev-fleet.yaml"):
            entries = [
                (f"{path.name}:{b.name}", b.metrics, b.address)
                for b in load_hierarchy(str(path)).buses
            ]
        else:
            config = load_config(str(path))
            # relay.yaml runs in a container: its /run/sbus.socket is the container's.
            address = None if path.name == "relay.yaml" else config.address
            entries = [(path.name, config.metrics, address)]
        for name, metrics, address in entries:
            assert metrics is not None, f"{name} serves no metrics"
            port = metrics.rsplit(":", 1)[1]
            assert port not in ports, f"{name} and {ports[port]} both use port {port}"
            ports[port] = name
            if address is not None:
                assert address not in sockets, f"{name} and {sockets[address]} share {address}"
                sockets[address] = name


def test_up_checks_that_the_bus_itself_listens(tmp_path: Path) -> None:
    # Another process holds the master's address: the master cannot bind, and
    # up must not take that other process's answer for the master's.
    directory = short_dir()
    address = os.path.join(directory, "master")
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    squatter.bind(address)
    squatter.listen(16)
    hierarchy = tmp_path / "h.yaml"
    hierarchy.write_text(f"buses:\n  - {{name: master, address: {address}}}\n")
    try:
        # Found before anything starts ...
        result = run_cli("up", str(hierarchy), timeout=WAIT * 2)
        # ... and, should it appear between that check and the start, while starting.
        supervisor = Supervisor(load_hierarchy(str(hierarchy)), out=lambda _: None)
        with pytest.raises(SupervisorError) as starting:
            supervisor.start()
    finally:
        squatter.close()
        shutil.rmtree(directory, ignore_errors=True)
    assert result.returncode == 1, result.stderr
    assert result.stderr.decode().splitlines() == [
        f"sbus-relay up: {hierarchy}: master's address {address} is in use by pid"
        f" {os.getpid()}, which no sbus-relay up runs; stop it or give the bus another address"
    ]
    assert "master exited with status 2 before listening" in str(starting.value)
    assert f"another process (pid {os.getpid()}) listens at {address}" in str(starting.value)


def test_up_gives_up_on_a_bus_that_keeps_failing_at_start(tmp_path: Path) -> None:
    def two_buses(document: dict[str, Any]) -> None:
        document["buses"] = document["buses"][:2]  # master and relay-a
        document["restart_max"] = 0.5

    up = Up(tmp_path, two_buses)
    try:
        up.read_until(b"buses running")
        port = int(up.document["buses"][1]["metrics"].rsplit(":", 1)[1])
        blocker = socket.socket()
        os.kill(up.pids["relay-a"], signal.SIGKILL)
        wait_until(lambda: gone(up.pids["relay-a"]), "relay-a gone")
        blocker.bind(("127.0.0.1", port))  # its metrics port is taken from now on
        blocker.listen(1)
        try:
            wait_until(lambda: "giving up on it" in up.err.read_text(), "up gave up", timeout=30)
            err = up.err.read_text()
            # The kill (within 10 s of its start) counts too: 1 + 4 failed restarts.
            assert "giving up on it after 5 failed starts in a row" in err, err
            assert err.count("relay-a failed to start") == 4, err
            assert f"cannot serve metrics on 127.0.0.1:{port}: Address already in use" in err
            assert up.proc.poll() is None  # the master keeps running
            assert not gone(up.pids["master"])
        finally:
            blocker.close()
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(WAIT) == 0
    finally:
        up.close()


def test_up_works_from_a_folder_holding_a_checkout_named_like_the_package(
    tmp_path: Path,
) -> None:
    # A clone called sbus_relay, and up run from the folder above it: the buses'
    # interpreter must not import that folder instead of the installed package.
    (tmp_path / "sbus_relay").mkdir()
    running = Up(tmp_path, cwd=tmp_path)
    try:
        running.read_until(b"buses running")
        assert len(running.pids) == 3
    finally:
        running.close()


# --- reloading the tree -------------------------------------------------------------


def events_in(path: Path, name: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.startswith("{"))
    return [e for e in lines if e.get("event") == name]


def test_a_reload_of_the_tree_reloads_every_bus_and_applies_the_file(tmp_path: Path) -> None:
    master_config = tmp_path / "master.yaml"
    master_config.write_text("hard_limit_messages: 100\n")

    def with_a_config_file(document: dict[str, Any]) -> None:
        document["buses"][0]["args"] = ["-C", str(master_config)]

    up = Up(tmp_path, with_a_config_file)
    try:
        up.read_until(b"buses running")
        logs = Path(up.dir)
        relay_a = Peer(up.addresses["relay-a"])
        relay_a.sub(b"kept/")
        # The edits: the master's own file, a new relay, one gone, one changed.
        master_config.write_text("hard_limit_messages: 200\n")
        document = up.document
        relay_b = document["buses"].pop(2)
        document["buses"][1]["args"] = ["--reconnect-max", "3"]
        document["buses"].append(
            {
                "name": "relay-c",
                "address": os.path.join(up.dir, "relay-c"),
                "upstream": "relay-a",
                "metrics": f"127.0.0.1:{free_port()}",
            }
        )
        up.config.write_text(yaml.safe_dump(document))
        asked = run_cli("up", "--reload", str(up.config))
        assert asked.returncode == 0, asked.stderr
        assert asked.stdout.decode() == (
            f"sbus-relay up: asked sbus-relay up pid {up.proc.pid} to reload {up.config};"
            " it says how it went\n"
        )
        lines = up.read_until(b"reloaded the hierarchy")
        assert lines[-1].decode() == (
            "sbus-relay up: reloaded the hierarchy: 2 reloaded; started relay-c; stopped relay-b\n"
        )
        assert [line.split()[0] for line in lines[:-1]] == [b"relay-b", b"relay-c"]
        wait_until(lambda: gone(up.pids["relay-b"]), "relay-b stopped")
        assert up.err.read_text().splitlines() == [
            "sbus-relay up: kept as they run until up restarts: relay-a (changed args)"
        ]
        wait_until(lambda: events_in(logs / "master.log", "config.reloaded"), "master reloaded")
        assert events_in(logs / "master.log", "config.reloaded")[0]["changed"] == [
            "hard_limit_messages"
        ]
        wait_until(lambda: events_in(logs / "relay-a.log", "config.reloaded"), "relay-a too")
        # relay-a kept its process and its clients; relay-c works below it
        assert not gone(up.pids["relay-a"])
        relay_a.sync()
        sideways(Peer(up.addresses["relay-c"]), relay_a, b"kept/new")

        # A file with an error: one line, and nothing changes.
        up.config.write_text("buses: []\n")
        up.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload refused" in up.err.read_text(), "the refusal")
        assert up.err.read_text().splitlines()[-1] == (
            f"sbus-relay up: reload refused: {up.config}: buses: expected a non-empty list of"
            " buses; every bus runs on as it was"
        )
        # ... nor an error in one bus's own config file
        document["buses"].append(relay_b)
        up.config.write_text(yaml.safe_dump(document))
        master_config.write_text("hard_limit_messages: lots\n")
        up.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: up.err.read_text().count("reload refused") == 2, "the refusal")
        assert (
            f"{up.config}: buses[master].args: {master_config}: hard_limit_messages:"
            in (up.err.read_text().splitlines()[-1])
        )
        assert len(events_in(logs / "master.log", "config.reloaded")) == 1
        assert all(not gone(up.pids[n]) for n in ("master", "relay-a", "relay-c"))
        relay_a.sync()

        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(WAIT) == 0
        stopped = up.read_until(b"master stopped")
        assert [line.split()[0] for line in stopped] == [b"relay-c", b"relay-a", b"master"]
        relay_a.close()
    finally:
        up.close()


def test_up_stops_when_its_terminal_hangs_up(tmp_path: Path) -> None:
    master, slave = pty.openpty()

    def own_terminal() -> None:  # a session of its own, the pty its terminal
        os.setsid()
        # as in a terminal's shell, whatever this test runs under (nohup, a CI runner)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    directory = short_dir()
    hierarchy = tmp_path / "h.yaml"
    hierarchy.write_text(
        yaml.safe_dump({"buses": [{"name": "m", "address": os.path.join(directory, "m")}]})
    )
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "up", str(hierarchy)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=own_terminal,
    )
    os.close(slave)
    try:
        out = b""
        while b"running" not in out:
            ready, _, _ = select.select([master], [], [], WAIT)
            assert ready, out
            out += os.read(master, 4096)
        proc.send_signal(signal.SIGHUP)  # the terminal is there: a reload
        while b"reloaded the hierarchy" not in out:
            ready, _, _ = select.select([master], [], [], WAIT)
            assert ready, out
            out += os.read(master, 4096)
        os.close(master)  # the terminal goes away
        master = -1
        assert proc.wait(WAIT) == 0
        wait_until(lambda: not os.path.exists(os.path.join(directory, "m")), "the bus stopped")
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def test_plan_of_a_tree_reload() -> None:
    def tree(*buses: dict[str, Any]) -> Any:
        return hierarchy_from_mapping({"buses": list(buses)}, "h.yaml")

    m = {"name": "m", "address": "/tmp/x/m"}
    a = {"name": "a", "address": "/tmp/x/a", "upstream": "m"}
    b = {"name": "b", "address": "/tmp/x/b", "upstream": "a"}
    running = tree(m, a, b)
    same = plan_tree_reload(running, tree(m, a, b), source="h.yaml")
    assert (same.started, same.stopped, same.kept) == ((), (), ())
    # b gone and a moved: a keeps running where it is, b stops
    moved = plan_tree_reload(running, tree(m, {**a, "address": "/tmp/x/a2"}), source="h.yaml")
    assert moved.stopped == ("b",) and moved.kept == (("a", "changed address"),)
    assert moved.hierarchy.bus("a").address == "/tmp/x/a"
    # a gone, but b (changed, so kept as it runs) still runs under it: a stays
    kept = plan_tree_reload(running, tree(m, {**b, "upstream": "m"}), source="h.yaml")
    assert kept.stopped == () and [n for n, _ in kept.kept] == ["b", "a"]
    assert [s.name for s in kept.hierarchy.buses] == ["m", "a", "b"]
    # a new bus where a kept bus still listens: refused
    with pytest.raises(ConfigError, match=r"buses\[c\]\.address: bus 'a' listens there too"):
        plan_tree_reload(
            running,
            tree(m, {**a, "address": "/tmp/x/a2"}, {"name": "c", "address": "/tmp/x/a"}),
            source="h.yaml",
        )


def test_up_check_shows_the_nats_cluster_a_fleet_file_starts_first() -> None:
    """Each nats-server of the file's cluster, its name and ports, before the buses."""
    fleet = yaml.safe_load((CONFIGS / "dev-fleet.yaml").read_text())
    result = run_cli("up", str(CONFIGS / "dev-fleet.yaml"), "--check")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    nodes = fleet["nats_cluster"]
    assert len(lines) == len(nodes) + len(fleet["buses"])
    for line, node in zip(lines, nodes, strict=False):
        words = line.split()
        assert os.path.basename(words[0]) == "nats-server", line
        assert words[words.index("-n") + 1] == node["name"]
        assert words[words.index("-p") + 1] == str(node["port"])
        assert words[words.index("--cluster") + 1].endswith(f":{node['cluster_port']}")
    for line in lines[len(nodes) :]:
        assert " serve " in line and "nats-server" not in line, line
