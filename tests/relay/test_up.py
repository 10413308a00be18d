"""``sbus-relay up``: a supervised hierarchy of real processes, and the configs."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sbus_relay.ops.config import load_config
from sbus_relay.ops.supervisor import hierarchy_from_mapping, load_hierarchy
from sbus_relay.protocol.errors import ConfigError
from tests.relay.helpers import WAIT, Peer, free_port, wait_until
from tests.support import VENV_BIN, read_line, run_cli, short_dir

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
#: "NAME (ROLE) listening at ADDRESS (pid PID, ...)" as printed by the supervisor
LISTENING = re.compile(rb"^(\S+) \(.*\) listening at (\S+) \(pid (\d+)")


class Up:
    """``sbus-relay up`` on a copy of dev-hierarchy.yaml with private paths and ports."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = short_dir()
        document = yaml.safe_load((CONFIGS / "dev-hierarchy.yaml").read_text())
        document["log_dir"] = self.dir
        document["restart_min"] = 0.2
        for bus in document["buses"]:
            bus["address"] = os.path.join(self.dir, bus["name"])
            bus["metrics"] = f"127.0.0.1:{free_port()}"
        self.config = tmp_path / "hierarchy.yaml"
        self.config.write_text(yaml.safe_dump(document))
        self.err = tmp_path / "up.err"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [os.path.join(VENV_BIN, "sbus-relay"), "up", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
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
    assert "relay-b exited with status -9; restarting" in up.err.read_text()
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


@pytest.mark.parametrize(
    ("document", "key", "reason"),
    [
        ({"buses": [{"name": "m", "address": "/x", "upstream": "m"}]}, "upstream", "own"),
        ({"buses": [{"name": "m", "address": "/x", "upstream": "q"}]}, "upstream", "no bus"),
        ({"buses": [{"name": "m", "address": "/x", "metrics": "nope"}]}, "metrics", "HOST:PORT"),
        ({"buses": [{"name": "m", "adress": "/x"}]}, "adress", "unknown key"),
        ({"buses": [{"name": "m"}]}, "address", "missing"),
        (
            {"buses": [{"name": "m", "address": "/x"}, {"name": "r", "address": "/x"}]},
            "address",
            "listens there too",
        ),
        ({"buses": [{"name": "m", "address": "/x"}], "restart_min": -1}, "restart_min", "positive"),
        ({"buses": [{"name": "m", "address": "/x", "args": "-v"}]}, "args", "list"),
        ({"busses": []}, "busses", "unknown key"),
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
    """Every YAML config in configs/ except deploy examples and Prometheus's file."""
    return sorted(
        p for p in CONFIGS.glob("*.y*ml") if p.name not in ("prometheus.yml", "prometheus.yaml")
    )


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: p.name)
def test_shipped_configs_load(path: Path) -> None:
    if path.name == "dev-hierarchy.yaml":
        hierarchy = load_hierarchy(str(path))
        assert hierarchy.buses[0].name == "master"
    else:
        load_config(str(path))


def test_container_relay_config_points_at_the_mounted_master() -> None:
    config = load_config(str(CONFIGS / "relay.yaml"))
    assert config.address == "/run/sbus.socket"
    assert config.upstream == "/run/sbus-master/sbus.socket"
    assert config.upstream != config.address
