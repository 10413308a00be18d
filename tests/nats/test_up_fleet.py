"""``sbus-relay up configs/dev-fleet.yaml``: a 3-node NATS cluster and two hosts
(a master joined to NATS with a relay each), on a copy with private ports
and paths; what it prints to try works."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sbus_relay.client import Client
from tests.nats.cluster import nats_server_binary, wait_until
from tests.support import VENV_BIN, free_port, read_line, run_cli, short_dir

pytestmark = pytest.mark.timeout(120)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def fleet_config(tmp_path: Path, where: str) -> tuple[Path, dict[str, Any]]:
    """configs/dev-fleet.yaml with private ports and paths (under ``where``)."""
    document = yaml.safe_load((CONFIGS / "dev-fleet.yaml").read_text())
    document["log_dir"] = where
    old = {n["port"]: free_port() for n in document["nats_cluster"]}
    for node in document["nats_cluster"]:
        node["port"] = old[node["port"]]
        node["cluster_port"] = free_port()
    for bus in document["buses"]:
        bus["address"] = os.path.join(where, bus["name"])
        if "metrics" in bus:
            bus["metrics"] = f"127.0.0.1:{free_port()}"
        args = [str(a) for a in bus.get("args", [])]
        for before, after in old.items():
            args = [a.replace(f":{before}", f":{after}") for a in args]
        bus["args"] = args
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump(document))
    return config, document


def test_up_dev_fleet(tmp_path: Path) -> None:
    nats_server_binary()  # skips without one
    where = short_dir()
    config, document = fleet_config(tmp_path, where)
    with open(tmp_path / "up.err", "wb") as err:
        up = subprocess.Popen(
            [os.path.join(VENV_BIN, "sbus-relay"), "up", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
    try:
        assert up.stdout is not None
        lines = []
        while not lines or not lines[-1].startswith(b" and: "):
            line = read_line(up.stdout.fileno(), 60)
            assert line, (tmp_path / "up.err").read_text()
            lines.append(line)
        assert lines[0].startswith(b"NATS cluster: nats://127.0.0.1:")
        sub_cmd = shlex.split(lines[-2].decode().removeprefix("try: "))
        pub_cmd = shlex.split(lines[-1].decode().removeprefix(" and: "))
        # commands that run this very program: by its path unless $PATH finds it
        program = os.path.realpath(os.path.join(VENV_BIN, "sbus-relay"))
        for cmd, verb in ((sub_cmd, "sub"), (pub_cmd, "pub")):
            found = shutil.which(cmd[0])
            assert found and os.path.realpath(found) == program, cmd
            assert cmd[1:3] == [verb, "-a"], cmd
        hosta = next(b for b in document["buses"] if b["name"] == "hosta")
        wait_until(
            lambda: b"nats: up" in _get(f"http://{hosta['metrics']}/healthz"), 20, "hosta joined"
        )
        with Client(sub_cmd[3], timeout=10) as sub:
            sub.subscribe(b"demo/")
            for _ in range(100):  # until host b's interest has reached host a
                assert run_cli(*pub_cmd[1:]).returncode == 0
                try:
                    m = sub.receive(timeout=0.2)
                    break
                except TimeoutError:
                    continue
            else:
                raise AssertionError("nothing crossed")
            assert bytes(m.key) == b"demo/hello"
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)
        if up.stdout is not None:
            up.stdout.close()
        shutil.rmtree(where, ignore_errors=True)
    assert up.returncode == 0
    for node in document["nats_cluster"]:  # the cluster stopped with the buses
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", node["port"]), timeout=1).close()


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as r:
        return bytes(r.read())
