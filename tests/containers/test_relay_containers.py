"""Relays in real containers under a master on the host (docs/deploy.md,
"The container image"; docs/kubernetes.md).

The master runs here, from this checkout; each relay runs in a container of
the project's image with its shipped command (``serve -C
/etc/sbus/relay.yaml``), the master's socket directory bind-mounted at
``/run/sbus-master`` and a directory of the host as its ``/run``, with a
read-only root, no capability and no network but ``lo``.  Clients inside the
containers are ``podman exec``'d agents (tests/namespaces/agent.py).

What ``SO_PEERCRED`` reports across the namespaces: the master, in the host's
PID namespace, sees a relay by its host pid and a client in a container that
connects to it directly by the client's host pid; a relay sees its clients by
their pids in the container; uids and gids are those of the reader's user
namespace (the host's, for the master: a container's uid 10001 under a user
namespace mapping 0 to 200000 is uid 210001 to it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containers.podman import (
    IMAGE_UID,
    INTEREST,
    RELAY_METRICS,
    STORED,
    WAIT,
    Container,
    host_dir,
    host_pid_of,
    remove_all,
    sum_of,
)
from tests.namespaces.helpers import Agent
from tests.relay.helpers import wait_until
from tests.support import BusProcess, free_port, run_cli, running, start_bus

pytestmark = pytest.mark.timeout(1200)  # the first run makes the base and the image

#: A user namespace's first host id for the container's id 0.
UID_BASE = 200000
RELAY_SOCKET = "/run/sbus.socket"
MASTER_IN_CONTAINER = "/run/sbus-master/sbus.socket"


class Site:
    """A master on the host and the relay containers under it."""

    def __init__(self, image: str, root: Path, logs: Path) -> None:
        self.image = image
        self.root = root
        self.logs = logs
        self.master_dir = root / "master"
        self.master_dir.mkdir(mode=0o755)
        self.master_dir.chmod(0o755)
        self.socket = str(self.master_dir / "sbus.socket")
        self.metrics = free_port()
        config = root / "master.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "address": self.socket,
                    "foreground": True,
                    "other_access": True,
                    "metrics": f"127.0.0.1:{self.metrics}",
                    "log_format": "json",
                }
            )
        )
        self.master: BusProcess = start_bus(
            logs, "-C", str(config), "-a", self.socket, command="serve"
        )
        self.successor: int | None = None
        self.containers: list[Container] = []
        self.agents: list[Agent] = []

    def relay(self, name: str, uid_base: int | None = None) -> tuple[Container, Path]:
        """A relay container; returns it and the host directory that is its /run."""
        owner = IMAGE_UID + (uid_base or 0)
        run = host_dir(self.root, f"run-{name}", owner)
        container = Container(
            self.image, f"relay-{name}", ["serve", "-C", "/etc/sbus/relay.yaml"],
            mounts=[(self.master_dir, "/run/sbus-master", "rw"), (run, "/run", "rw")],
            uid_base=uid_base,
        )  # fmt: skip
        self.containers.append(container)
        wait_relay(container, run)
        return container, run

    def wait_stored(self, at_least: int) -> None:
        """Until the master holds ``at_least`` patterns (its relays' SUBs arrive
        after their clients' returned)."""
        wait_until(
            lambda: sum_of(urlopen_text(self.metrics), STORED) >= at_least,
            f"{at_least} patterns on the master", WAIT,
        )  # fmt: skip

    def agent(self, container: Container | None, address: str, user: str | None = None) -> Agent:
        if container is None:
            uid = int(user.split(":")[0]) if user else IMAGE_UID
            agent = Agent(self.logs, address, user=(uid, uid))
        else:
            agent = container.agent(self.logs, address, user)
        self.agents.append(agent)
        return agent

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
        try:
            remove_all(self.containers)
        finally:
            self.master.stop()
            if self.successor is not None:
                with_pid_gone(self.successor)


def urlopen_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def with_pid_gone(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_until(lambda: not running(pid), f"pid {pid} ends")


def wait_relay(container: Container, run: Path, connects: int = 1) -> None:
    """Until the relay listens on its socket and is linked to the master (its
    log: the socket is in the container's network namespace, whose
    /proc/net/unix the host does not read)."""
    container.wait_event("listening", connects)
    container.wait_event("upstream.connected", connects)
    assert (run / "sbus.socket").exists()


@pytest.fixture
def site(image: str, tmp_path: Path) -> Iterator[Site]:
    root = Path(os.environ.get("SBUS_TEST_DIR", "/tmp")) / f"sbus-ct-{os.urandom(4).hex()}"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    built = Site(image, root, tmp_path)
    try:
        yield built
    finally:
        try:
            built.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)


def cred(gid: int, uid: int, pid: int) -> str:
    return f"!/cred/{gid}/{uid}/{pid}"


def test_traffic_crosses_containers_both_ways(site: Site) -> None:
    a, _ = site.relay("a")
    b, _ = site.relay("b")
    host = site.agent(None, site.socket)
    in_a = site.agent(a, RELAY_SOCKET)
    in_b = site.agent(b, RELAY_SOCKET)
    host.sub("up/")
    in_b.sub("down/")
    in_b.sub("side/")
    # what each relay sends up is what is wanted above it: wait until they know
    site.wait_stored(3)
    a.wait_metric(RELAY_METRICS, INTEREST, 2)
    in_a.pub("up/from-a", "1")
    assert host.messages(1) == [("up/from-a", "1")]
    host.pub("down/from-host", "2")
    assert in_b.messages(1) == [("down/from-host", "2")]
    in_a.pub("side/a-to-b", "3")
    assert in_b.messages(1) == [("side/a-to-b", "3")]


def test_identities_across_pid_and_user_namespaces(site: Site) -> None:
    a, _ = site.relay("a")
    mapped, _ = site.relay("userns", uid_base=UID_BASE)
    relay_pid = a.host_pid()
    # a client of the relay: the relay's host pid as the master sees it, then
    # the client's container pid as the relay sees it
    in_a = site.agent(a, RELAY_SOCKET)
    assert in_a.whoami() == cred(10001, 10001, relay_pid) + "/" + cred(10001, 10001, in_a.pid)
    other_user = site.agent(a, RELAY_SOCKET, user="1000:1000")
    relay_cred = cred(10001, 10001, relay_pid)
    assert other_user.whoami() == relay_cred + "/" + cred(1000, 1000, other_user.pid)
    # a client in the container that connects to the master itself: its host pid
    direct = site.agent(a, MASTER_IN_CONTAINER)
    seen = direct.whoami()
    host_pid = host_pid_of(direct.pid, relay_pid)
    assert host_pid != direct.pid
    assert seen == cred(10001, 10001, host_pid)
    # under a user namespace the master sees the mapped host ids
    mapped_pid = mapped.host_pid()
    in_mapped = site.agent(mapped, RELAY_SOCKET)
    assert in_mapped.whoami() == (
        cred(UID_BASE + IMAGE_UID, UID_BASE + IMAGE_UID, mapped_pid)
        + "/"
        + cred(IMAGE_UID, IMAGE_UID, in_mapped.pid)
    )
    root_direct = site.agent(mapped, MASTER_IN_CONTAINER, user="0:0")
    assert re.fullmatch(rf"!/cred/{UID_BASE}/{UID_BASE}/\d+", root_direct.whoami())


def test_secret_keys_stay_in_their_container(site: Site) -> None:
    a, _ = site.relay("a")
    b, _ = site.relay("b")
    owner = site.agent(a, RELAY_SOCKET)
    snoop = site.agent(b, RELAY_SOCKET)
    key = owner.whoami() + "/inbox"
    owner.sub(key)
    snoop.sub("")
    site.wait_stored(2)
    host = site.agent(None, site.socket)
    host.pub(key, "for a only")
    assert owner.messages(1) == [(key, "for a only")]
    assert snoop.messages(0) == []


def test_a_killed_relay_container_restarts_and_relays_again(site: Site) -> None:
    a, run = site.relay("a")
    host = site.agent(None, site.socket)
    host.sub("up/")
    first_pid = a.host_pid()
    a.kill()
    assert (run / "sbus.socket").exists()  # left behind: the restart removes it (remove_stale)
    a.start()
    wait_relay(a, run, connects=2)
    assert a.host_pid() != first_pid
    in_a = site.agent(a, RELAY_SOCKET)
    assert in_a.whoami().startswith(cred(10001, 10001, a.host_pid()) + "/")
    a.wait_metric(RELAY_METRICS, INTEREST, 1)
    in_a.pub("up/after-restart", "x")
    assert host.messages(1) == [("up/after-restart", "x")]


def test_the_master_upgrades_live_under_the_containers(site: Site) -> None:
    a, _ = site.relay("a")
    b, _ = site.relay("b")
    host = site.agent(None, site.socket)
    in_a = site.agent(a, RELAY_SOCKET)
    in_b = site.agent(b, RELAY_SOCKET)
    host.sub("up/")
    in_b.sub("side/")
    site.wait_stored(2)
    a.wait_metric(RELAY_METRICS, INTEREST, 2)
    upgraded = run_cli("upgrade", "-a", site.socket, timeout=60)
    assert upgraded.returncode == 0, upgraded.stderr
    old, new = map(int, re.findall(r"pid (\d+)", upgraded.stdout.decode()))
    site.successor = new
    assert old == site.master.proc.pid and new != old
    assert site.master.proc.wait(10) == 0
    in_a.pub("up/after-upgrade", "1")
    in_a.pub("side/after-upgrade", "2")
    assert host.messages(1) == [("up/after-upgrade", "1")]
    assert in_b.messages(1) == [("side/after-upgrade", "2")]
    for relay in (a, b):
        assert relay.events("upstream.lost") == [], relay.logs()
        assert len(relay.events("upstream.connected")) == 1


EXAMPLE_APP = Path(__file__).resolve().parents[2] / "configs/deploy/kubernetes/example-app.yaml"


def test_the_example_pod_runs_as_its_manifest_says(site: Site) -> None:
    """example-app.yaml's two containers with their own args: the relay sidecar
    and the app, sharing /run (the emptyDir) and the relay's PID namespace."""
    pod = yaml.safe_load(EXAMPLE_APP.read_text())["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    (sidecar,) = pod["initContainers"]
    (app_spec,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    bus_dir = host_dir(site.root, "pod-bus")

    def mounts(container: dict[str, Any]) -> list[tuple[Path | str, str, str]]:
        found: list[tuple[Path | str, str, str]] = []
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            source = bus_dir if "emptyDir" in volume else site.master_dir
            found.append((source, mount["mountPath"], "rw"))
        return found

    relay = Container(site.image, "sidecar", sidecar["args"], mounts=mounts(sidecar))
    site.containers.append(relay)
    wait_relay(relay, bus_dir)
    app = Container(site.image, "app", app_spec["args"], mounts=mounts(app_spec), pid_of=relay)
    site.containers.append(app)
    # the app subscribes through the relay; a client of the app's pod sees the
    # app's process by its pid in the pod, and the relay's on the node
    probe = site.agent(app, RELAY_SOCKET)
    relay_cred = cred(IMAGE_UID, IMAGE_UID, relay.host_pid())
    assert probe.whoami() == relay_cred + "/" + cred(IMAGE_UID, IMAGE_UID, probe.pid)
    assert probe.pid not in (0, 1)
    host = site.agent(None, site.socket)
    wait_until(
        lambda: _published_and_printed(host, app), "the app prints a message from the node", WAIT
    )


def _published_and_printed(host: Agent, app: Container) -> bool:
    """Publish on the master; whether the app's log has it (its sub may still be starting)."""
    host.pub("demo/from-the-node", "hello pod")
    for line in app.logs().splitlines():
        if line.startswith("{") and json.loads(line).get("key") == "demo/from-the-node":
            return json.loads(line)["payload"] == "hello pod"
    return False
