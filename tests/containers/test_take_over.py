"""A rolling update of the master's pod, in real containers: the DaemonSet's
command (``serve --take-over -C /etc/sbus/master.yaml``) with the shipped
Kubernetes master.yaml, in two containers that share the socket directory as
the node's hostPath, each in the host's PID namespace (``hostPID``) and a
network namespace of its own, as two pods are.

The old container serves a relay container and a client; the new one starts
beside it and takes the bus over; the old one answers ``/healthz`` until it is
stopped (SIGTERM, as the kubelet deletes the old pod), and exits 0.  Nobody is
disconnected, and messages flow both ways before, during and after.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sbus_relay.ops.config import load_config
from sbus_relay.protocol.errors import ConfigError
from tests.containers.podman import (
    IMAGE_UID,
    INTEREST,
    RELAY_METRICS,
    STORED,
    Container,
    host_dir,
    remove_all,
    run_once,
)
from tests.namespaces.helpers import Agent

pytestmark = pytest.mark.timeout(1200)  # the first run makes the base and the image

KUBERNETES = Path(__file__).resolve().parents[2] / "configs" / "deploy" / "kubernetes"
DAEMONSET = KUBERNETES / "master-daemonset.yaml"
RELAY_SOCKET = "/run/sbus.socket"


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    return spec


def daemonset_master() -> tuple[list[str], str, str, int]:
    """The master container's args, its socket directory's mount path, its
    config's mount path and its metrics port, from the DaemonSet."""
    (master,) = pod_spec()["containers"]
    mounts = {m["name"]: m["mountPath"] for m in master["volumeMounts"]}
    port = next(p["containerPort"] for p in master["ports"] if p["name"] == "metrics")
    return master["args"], mounts["socket-dir"], mounts["config"], port


def shipped_master_config(target: Path) -> list[str]:
    """configs/deploy/kubernetes/master.yaml into ``target``; the top-level keys
    this version's config does not know yet are left out and returned."""
    document = yaml.safe_load((KUBERNETES / "master.yaml").read_text())
    dropped: list[str] = []
    while True:
        target.write_text(yaml.safe_dump(document))
        try:
            load_config(str(target))
            return dropped
        except ConfigError as exc:
            unknown = [k for k in document if f"{k}: unknown key" in str(exc)]
            if not unknown:
                raise
            dropped.append(unknown[0])
            del document[unknown[0]]


@pytest.fixture
def node(image: str) -> Iterator[Path]:
    root = Path("/tmp") / f"sbus-node-{os.urandom(4).hex()}"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_rolling_update_of_the_master_pod_disconnects_nobody(
    image: str, node: Path, tmp_path: Path
) -> None:
    args, socket_mount, config_mount, port = daemonset_master()
    # the node's /run/sbus as the kubelet makes it (root's), given to the
    # image's user by the init container, run as the DaemonSet says
    socket_dir = node / "run-sbus"
    socket_dir.mkdir(mode=0o755)
    (init,) = pod_spec()["initContainers"]
    context = init["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"]
    done = run_once(
        image, init["command"], user=str(context["runAsUser"]),
        cap_add=context["capabilities"]["add"],
        mounts=[(socket_dir, m["mountPath"], "rw") for m in init["volumeMounts"]],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (socket_dir.stat().st_uid, socket_dir.stat().st_gid) == (IMAGE_UID, IMAGE_UID)
    config_dir = node / "config"
    config_dir.mkdir()
    dropped = shipped_master_config(config_dir / "master.yaml")
    if dropped:
        print(f"left out of master.yaml, unknown to this version's config: {dropped}")
    master_socket = socket_dir / "sbus.socket"
    mounts = [(socket_dir, socket_mount, "rw"), (config_dir, config_mount, "ro")]
    containers: list[Container] = []
    agents: list[Agent] = []
    try:
        old = Container(image, "master-old", args, mounts=mounts, pid_host=True)
        containers.append(old)
        old.wait_event("listening")
        run = host_dir(node, "run-app")
        relay = Container(
            image, "relay", ["serve", "-C", "/etc/sbus/relay.yaml"],
            mounts=[(socket_dir, "/run/sbus-master", "rw"), (run, "/run", "rw")],
        )  # fmt: skip
        containers.append(relay)
        relay.wait_event("upstream.connected")
        app = relay.agent(tmp_path, RELAY_SOCKET)
        agents.append(app)
        # a client of the master on the node, as the image's user (master.yaml's users)
        host = Agent(tmp_path, str(master_socket), user=(IMAGE_UID, IMAGE_UID))
        agents.append(host)
        host.sub("up/")
        app.sub("down/")
        old.wait_metric(port, STORED, 2)
        relay.wait_metric(RELAY_METRICS, INTEREST, 1)
        app.pub("up/before", "0")
        assert host.messages(1) == [("up/before", "0")]

        new = Container(image, "master-new", args, mounts=mounts, pid_host=True)
        containers.append(new)
        took = new.wait_event("upgrade.took_over")
        assert took["clients"] == 2  # the relay and the node's client
        handed = old.wait_event("upgrade.handed_over")
        print(f"hand-over between the containers: {handed['seconds'] * 1000:.0f} ms")
        old.wait_event("upgrade.lingering")
        assert old.events("upgrade.lingering")[0]["healthz"] is True  # its own network
        assert old.http_status(port) == 200
        assert new.http_status(port) == 200
        app.pub("up/during", "1")
        host.pub("down/during", "2")
        assert host.messages(1) == [("up/during", "1")]
        assert app.messages(1) == [("down/during", "2")]

        assert old.stop() == 0  # the kubelet deletes the old pod
        assert new.running()
        app.pub("up/after", "3")
        host.pub("down/after", "4")
        assert host.messages(1) == [("up/after", "3")]
        assert app.messages(1) == [("down/after", "4")]
        assert relay.events("upstream.lost") == [], relay.logs()
        assert len(relay.events("upstream.connected")) == 1
        assert new.events("client.disconnected") == []
        assert master_socket.exists()
        assert new.stop() == 0
    finally:
        for agent in agents:
            agent.close()
        remove_all(containers)
