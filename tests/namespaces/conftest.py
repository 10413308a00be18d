"""Fixtures for the namespace tests: a lab of real masters, containers and clients.

Everything a test starts is registered with the ``lab`` and torn down after
it, innermost first: clients, then namespaces (SIGKILL of their pid 1 kills
all inside), then masters; the test's socket directories are removed and the
host's mount table is checked for tmpfs mounts the namespaces left behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.namespaces.helpers import (
    MASTER_SOCKET_NAME,
    Agent,
    Container,
    Namespace,
    NsServer,
    host_mounts,
    unshare_problem,
)
from tests.relay.helpers import Bus, Peer
from tests.support import free_port, short_dir


@pytest.fixture(scope="session", autouse=True)
def _namespaces_allowed() -> None:
    """Skip, saying exactly what failed, where namespaces cannot be made."""
    problem = unshare_problem()
    if problem is not None:
        pytest.skip(f"NAMESPACE TESTS SKIPPED: {problem}")


class Lab:
    """Masters on the host, containers and clients; all cleaned up by the fixture."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.dirs: list[str] = []
        self.masters: list[Bus] = []
        self.namespaces: list[Namespace] = []
        self.servers: list[NsServer] = []
        self.agents: list[Agent] = []
        self.peers: list[Peer] = []

    def master(self, *args: str) -> Bus:
        """A master on the host at ``<dir>/sbus.socket``: the directory is what
        containers mount (a socket file mount would not see a restarted master)."""
        directory = short_dir()
        os.chmod(directory, 0o755)
        self.dirs.append(directory)
        bus = Bus(self.tmp_path, os.path.join(directory, MASTER_SOCKET_NAME), *args)
        self.masters.append(bus)
        return bus

    def container(self, name: str, master: Bus, *, net: bool = True, **kw: str) -> Container:
        """A container of ``master`` with its relay running."""
        box = Container(name, self.tmp_path, os.path.dirname(master.address), net=net, **kw)
        self.namespaces.append(box)
        box.start_relay()
        return box

    def namespace(self, name: str, *, net: bool = False) -> Namespace:
        """A bare pid + mount + UTS namespace (the host's filesystem, no relay)."""
        ns = Namespace(name, self.tmp_path, net=net)
        self.namespaces.append(ns)
        return ns

    def master_in(self, ns: Namespace) -> tuple[NsServer, str, int]:
        """A master running inside ``ns`` on a host-visible socket: (server, address, port)."""
        directory = short_dir()
        self.dirs.append(directory)
        address = os.path.join(directory, MASTER_SOCKET_NAME)
        port = free_port()
        server = NsServer(
            ns,
            "-f",
            "-a",
            address,
            "--metrics",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
            ready=("listening", "metrics.listening"),
        )
        self.servers.append(server)
        return server, address, port

    def relay_on_host(self, upstream: str, *args: str) -> Bus:
        """A relay in the host's namespaces."""
        directory = short_dir()
        self.dirs.append(directory)
        bus = Bus(self.tmp_path, os.path.join(directory, "relay.sock"), *args, upstream=upstream)
        self.masters.append(bus)
        return bus

    def host_agent(self, address: str) -> Agent:
        agent = Agent(self.tmp_path, address)
        self.agents.append(agent)
        return agent

    def peer(self, address: str) -> Peer:
        """A raw client on the host."""
        peer = Peer(address)
        self.peers.append(peer)
        return peer

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        for agent in self.agents:
            agent.close()
        for ns in reversed(self.namespaces):
            ns.destroy()
        for server in self.servers:
            server.kill()
        for bus in reversed(self.masters):
            bus.process._kill()  # also removes its directory when it has died already
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)
        mounts = host_mounts()
        leaked = [ns.tmpfs_source for ns in self.namespaces if ns.tmpfs_source in mounts]
        assert not leaked, f"namespace mounts visible on the host: {leaked}"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def hosted(lab: Lab) -> tuple[Bus, Container, Container]:
    """A master on the host and two containers, box-a and box-b, each with its own
    network namespace and a relay running the shipped configs/relay.yaml.  The
    master lets everyone reach its socket (``-o``) but admits only root and uid
    1000 (``-u``), so that the tests' unprivileged clients may try it directly."""
    master = lab.master("-o", "-u", "1000")
    return master, lab.container("box-a", master), lab.container("box-b", master)
