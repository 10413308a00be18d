"""The compose file and the Dockerfile: validated, wired to files that exist,
and the container's command run here.

Validation is Debian's ``docker-compose`` (``config -q``: the Compose schema
plus the references between services and volumes); it needs no Docker daemon.
No image is built and no container started: the relay container's command and
its health check are run here as the image would run them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sbus_relay.ops.config import load_config
from tests.deploy.shipped import (
    CONFIGS,
    DEPLOY,
    MASTER_SOCKET,
    REPO,
    healthy,
    listening_inode,
    load,
    scrape,
    stop,
    write_config,
)
from tests.relay.helpers import Peer, identity, wait_until
from tests.support import VENV_BIN, free_port, start_bus

COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
#: Files of the repository named in the deployment files' text (comments included).
REPO_PATH = re.compile(r"\b(?:configs|docs)/[\w.@/-]*\w")


def find_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.skip(
            "!!! docker-compose NOT FOUND: the compose file was NOT validated.  Install "
            "Debian's 'docker-compose' package (.ci/system-deps.sh does, as root). !!!"
        )
    return path


def compose_config(compose: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``docker-compose -f PATH config -q``: exit 0 and silence when valid."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    return subprocess.run(
        [compose, "-f", str(path), "config", "-q"],
        capture_output=True, text=True, timeout=60, check=False, env=env, cwd=path.parent,
    )  # fmt: skip


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as ``(INSTRUCTION, arguments)``, a
    backslash-continued instruction joined into one (comments inside it dropped)."""
    instructions = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    return instructions


def copies() -> dict[str, list[str]]:
    """COPY destination -> its sources (relative to the build context)."""
    found: dict[str, list[str]] = {}
    for word, rest in dockerfile():
        if word == "COPY":
            *sources, destination = shlex.split(rest)
            if sources[0].startswith("--from="):
                continue  # from an earlier stage, not from the build context
            assert not any(s.startswith("--") for s in sources), f"COPY flags: {rest}"
            found[destination] = sources
    return found


def copied_from(path: str) -> str | None:
    """The build context's file that the image has at ``path``, if one is copied there."""
    for destination, sources in copies().items():
        if destination == path and len(sources) == 1:
            return sources[0]
        if destination.endswith("/") and os.path.dirname(path) + "/" == destination:
            for source in sources:
                if os.path.basename(source) == os.path.basename(path):
                    return source
    return None


def container_command() -> list[str]:
    """The image's command: its ENTRYPOINT (the CLI), then its CMD."""
    argv = []
    for instruction in ("ENTRYPOINT", "CMD"):
        (text,) = [rest for word, rest in dockerfile() if word == instruction]
        words = json.loads(text)  # the exec form: no shell in between
        assert isinstance(words, list), text
        argv += [str(a) for a in words]
    return argv


def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """A service's short-syntax volumes as ``(source, target)``."""
    pairs = []
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        pairs.append((source, target))
    return pairs


@pytest.mark.timeout(90)
def test_compose_file_is_valid() -> None:
    result = compose_config(find_compose(), COMPOSE)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


#: Broken copies: (text replaced, replacement, what docker-compose must say).
BREAKAGES = [
    pytest.param(
        "    restart: unless-stopped\n", "    restart: unless-stopped\n    restrat: always\n",
        "Unsupported config option", id="unknown-key",
    ),
    pytest.param(
        "condition: service_healthy", "condition: service_happy", "condition",
        id="bad-depends-on-condition",
    ),
    pytest.param(
        'pid: "service:relay"', 'pid: "service:relya"', "undefined", id="pid-of-no-service",
    ),
    pytest.param("\nvolumes:\n  bus:\n", "\n", "no declaration", id="undeclared-volume"),
    pytest.param("context: ../..", "context: ../../nowhere", "build path", id="no-build-context"),
]  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("old", "new", "said"), BREAKAGES)
def test_compose_validator_rejects_a_broken_copy(
    old: str, new: str, said: str, tmp_path: Path
) -> None:
    validator = find_compose()
    # The copy sits where the original does relative to its build context.
    copy = tmp_path / "configs" / "deploy" / COMPOSE.name
    copy.parent.mkdir(parents=True)
    text = COMPOSE.read_text()
    copy.write_text(text)
    assert compose_config(validator, copy).returncode == 0  # valid until broken
    assert old in text, f"{COMPOSE.name} no longer contains {old!r}: update this breakage"
    copy.write_text(text.replace(old, new))
    result = compose_config(validator, copy)
    assert result.returncode != 0
    assert said in result.stderr, result.stderr


@pytest.mark.timeout(10)
def test_compose_and_dockerfile_name_only_files_that_exist() -> None:
    build = compose()["services"]["relay"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE
    for destination, sources in copies().items():
        for source in sources:
            if source.startswith("dist/"):  # what `make dist` builds: a target of the Makefile
                assert re.search(r"^dist:", (REPO / "Makefile").read_text(), re.M)
                continue
            assert list(context.glob(source)), f"COPY {source} {destination}: no such file"
    named = set()
    for path in (
        COMPOSE,
        DOCKERFILE,
        *sorted(DEPLOY.glob("sbus-*")),
        DEPLOY / "relay-example.yaml",
    ):
        for name in REPO_PATH.findall(path.read_text()):
            assert (REPO / name).exists(), f"{path.name} names {name}, which does not exist"
            named.add(name)
    assert {"configs/relay.yaml", "configs/master.yaml", "docs/relays.md"} <= named


@pytest.mark.timeout(10)
def test_compose_wiring_matches_relay_yaml_and_the_socket_unit() -> None:
    services = compose()["services"]
    relay, app = services["relay"], services["app"]
    # The image's command reads the config the Dockerfile copies from configs/relay.yaml.
    command = container_command()
    config_path = command[command.index("-C") + 1]
    assert copied_from(config_path) == "configs/relay.yaml"
    config = load_config(str(CONFIGS / "relay.yaml"))
    # The host's master socket (the socket unit's) is mounted where the relay looks upstream.
    master = load(MASTER_SOCKET).value("Socket", "ListenSequentialPacket")
    assert (master, config.upstream) in mounts(relay)
    # The relay's socket is on the volume the app mounts at the same place.
    run_dir = os.path.dirname(config.address)
    (volume,) = [source for source, target in mounts(relay) if target == run_dir]
    assert (volume, run_dir) in mounts(app)
    assert volume in compose()["volumes"]
    assert app["pid"] == "service:relay"
    # Prometheus reaches the relay's metrics port through the published one.
    assert config.metrics is not None
    host, port = config.metrics.rsplit(":", 1)
    assert host == "0.0.0.0"  # a container's 127.0.0.1 is not reachable from outside
    published = [p.rsplit(":", 1)[1] for p in relay["ports"]]
    assert port in published
    assert f"127.0.0.1:{port}/healthz" in " ".join(relay["healthcheck"]["test"])


@pytest.mark.timeout(90)
def test_container_command_runs_the_relay_and_its_healthcheck_tells(
    tmp_path: Path, short_tmp: Path
) -> None:
    config = load_config(str(CONFIGS / "relay.yaml"))
    assert config.metrics is not None
    shipped_port = config.metrics.rsplit(":", 1)[1]
    command = container_command()
    assert command[0] == "sbus-relay"  # on the image's PATH: pip installs it there
    config_path = command[command.index("-C") + 1]
    port = free_port()
    with start_bus(tmp_path, command="serve") as master:
        relay_path = str(short_tmp / "relay.sock")
        local_config = short_tmp / "relay.yaml"
        write_config(
            CONFIGS / "relay.yaml", local_config,
            address=relay_path, upstream=master.address, metrics=f"127.0.0.1:{port}",
        )  # fmt: skip
        argv = [os.path.join(VENV_BIN, command[0])]
        argv += [str(local_config) if a == config_path else a for a in command[1:]]
        with open(tmp_path / "relay.err", "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=err)
        try:
            # No -f on the command line: relay.yaml keeps the container's pid 1 in
            # the foreground, so the process started is the one serving.
            wait_until(lambda: proc.poll() is None and healthy(port), "the relay's /healthz")
            assert listening_inode(relay_path) is not None
            wait_until(lambda: scrape(port).get("sbus_upstream_connected") == 1, "upstream")
            peer = Peer(relay_path)
            try:
                assert peer.whoami() == identity(proc.pid, os.getpid())
            finally:
                peer.close()
            health = relay_healthcheck(shipped_port, port)
            assert health.returncode == 0, health.stderr
            assert stop(proc) == 0, (tmp_path / "relay.err").read_text()
            # With the relay gone the same check fails: it can tell.
            assert relay_healthcheck(shipped_port, port).returncode != 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def relay_healthcheck(shipped_port: str, port: int) -> subprocess.CompletedProcess[str]:
    """The compose health check's command, on this test's port."""
    test = compose()["services"]["relay"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"], test
    args = [a.replace(f":{shipped_port}/", f":{port}/") for a in test[2:]]
    assert args != test[2:], f"the health check does not name port {shipped_port}"
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=30, check=False
    )
