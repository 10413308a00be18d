"""Real containers for the tests: podman, as root, running the project's image.

A ``Container`` is one ``podman run -d`` of the image with the hardening a
pod gets from the manifests (read-only root filesystem, every capability
dropped, no new privileges, a network namespace of its own with only ``lo``)
and the bind mounts a test gives it.  Its process is the image's entrypoint,
the CLI, so a relay container's pid 1 is the relay itself.  ``agent`` runs
tests/namespaces/agent.py inside it (``podman exec``), a client of the
container's bus whose pid is the container's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.namespaces.helpers import Agent

PODMAN = shutil.which("podman")
REPO = Path(__file__).resolve().parents[2]
AGENT_SOURCE = REPO / "tests" / "namespaces" / "agent.py"
#: Where the agent is mounted in a container, and the image's Python.
AGENT_IN_CONTAINER = "/agent/agent.py"
IMAGE_PYTHON = "/opt/sbus-relay/bin/python"
#: The image's user (configs/deploy/Dockerfile).
IMAGE_UID = 10001
#: Seconds a podman command may take (a run, a stop, an exec).
PODMAN_TIMEOUT = 60
#: Tries to remove a container before its failure fails the test.
REMOVE_TRIES = 3
#: A relay's count of the patterns its upstream wants (it sends up only what matches).
INTEREST = "sbus_upstream_interest_patterns"
#: A bus's count of the patterns its clients hold.
STORED = "sbus_patterns_stored"
#: The metrics port of configs/relay.yaml, inside each container.
RELAY_METRICS = 9801
#: Seconds to wait for a container's bus or a log line.
WAIT = 60.0


#: What every container here gets, as the manifests' securityContext says: a
#: read-only root, no capability, no new privileges; and only ``lo``.
HARDENED = ("--read-only", "--cap-drop=all", "--security-opt=no-new-privileges", "--network=none")


def run_once(
    image: str,
    command: Sequence[str],
    *,
    mounts: Sequence[tuple[Path | str, str, str]] = (),
    user: str | None = None,
    cap_add: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (not the entrypoint: an init container's ``command``) to its end."""
    assert PODMAN is not None
    argv = [PODMAN, "run", "--rm", *HARDENED, *(["--user", user] if user else [])]
    argv += [f"--cap-add={cap}" for cap in cap_add]
    for source, target, options in mounts:
        argv += ["-v", f"{source}:{target}:{options}"]
    argv += ["--entrypoint", command[0], image, *command[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=PODMAN_TIMEOUT, check=False)


def container_problem() -> str | None:
    """Why containers cannot run here, or None."""
    if PODMAN is None:
        return "podman is not installed (.ci/system-deps.sh installs it, as root)"
    if os.geteuid() != 0:
        return f"the container tests run podman as root; this is uid {os.geteuid()}"
    return None


def podman(*args: str, check: bool = True, timeout: float = PODMAN_TIMEOUT) -> str:
    assert PODMAN is not None
    result = subprocess.run(
        [PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.returncode}\n{result.stderr}")
    return result.stdout


def runtime_problem(image: str) -> str | None:
    """Why a container of ``image`` does not start here (the OCI runtime's one line), or None."""
    assert PODMAN is not None
    result = subprocess.run(
        [PODMAN, "run", "--rm", "--network=none", "--entrypoint", "true", image],
        capture_output=True, text=True, timeout=PODMAN_TIMEOUT, check=False,
    )  # fmt: skip
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
    return lines[-1]


def usable_image(make: Callable[[str], str], what: str) -> str:
    """The image ``make(podman)`` builds, where containers run here; elsewhere the
    test is skipped with one loud line: ``what`` (was NOT checked) and why."""
    problem = container_problem()
    if problem is not None:
        pytest.skip(f"!!! {what}: {problem} !!!")
    assert PODMAN is not None
    try:
        image = make(PODMAN)
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        first = str(exc).strip().splitlines()[0]
        pytest.skip(f"!!! {what}: no Debian base could be made here: {first} !!!")
    problem = runtime_problem(image)
    if problem is not None:
        pytest.skip(f"!!! {what}: podman cannot start one here: {problem} !!!")
    return image


def host_dir(parent: Path, name: str, owner: int = IMAGE_UID) -> Path:
    """A directory to bind-mount, owned by ``owner`` (the container's user as the host sees it)."""
    path = parent / name
    path.mkdir(mode=0o755)
    os.chown(path, owner, owner)
    path.chmod(0o755)
    return path


class Container:
    """One running container of ``image``; ``remove()`` ends it."""

    def __init__(
        self,
        image: str,
        role: str,
        args: Sequence[str],
        *,
        mounts: Sequence[tuple[Path | str, str, str]] = (),
        pid_host: bool = False,
        pid_of: Container | None = None,
        uid_base: int | None = None,
    ) -> None:
        self.name = f"sbus-test-{role}-{secrets.token_hex(4)}"
        argv = ["run", "-d", "--name", self.name, *HARDENED]
        if pid_host:
            argv.append("--pid=host")
        if pid_of is not None:  # a pod's shareProcessNamespace
            argv.append(f"--pid=container:{pid_of.name}")
        if uid_base is not None:
            # a user namespace: the container's ids 0..65535 are the host's uid_base..
            argv += ["--uidmap", f"0:{uid_base}:65536", "--gidmap", f"0:{uid_base}:65536"]
        argv += ["-v", f"{AGENT_SOURCE}:{AGENT_IN_CONTAINER}:ro"]
        for source, target, options in mounts:
            argv += ["-v", f"{source}:{target}:{options}"]
        podman(*argv, image, *args)

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).strip()

    def host_pid(self) -> int:
        """The host's pid of the container's pid 1 (its bus)."""
        return int(self.inspect("{{.State.Pid}}"))

    def running(self) -> bool:
        return self.inspect("{{.State.Running}}") == "true"

    def exit_code(self) -> int:
        return int(self.inspect("{{.State.ExitCode}}"))

    def logs(self) -> str:
        assert PODMAN is not None
        result = subprocess.run(
            [PODMAN, "logs", self.name], capture_output=True, text=True,
            timeout=PODMAN_TIMEOUT, check=False,
        )  # fmt: skip
        return result.stdout + result.stderr

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log events of the container's bus (stderr)."""
        found = []
        for line in self.logs().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if name is None or event.get("event") == name:
                        found.append(event)
        return found

    def wait_event(self, name: str, count: int = 1, timeout: float = WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.events(name)
            if len(found) >= count:
                return found[count - 1]
            if time.monotonic() > deadline or not self.running():
                raise AssertionError(f"{self.name}: no {count}x {name} in its log:\n{self.logs()}")
            time.sleep(0.1)

    def exec(self, *argv: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        assert PODMAN is not None
        head = [PODMAN, "exec", *(["--user", user] if user else []), self.name]
        return subprocess.run(
            [*head, *argv], capture_output=True, text=True, timeout=PODMAN_TIMEOUT, check=False
        )

    def http_status(self, port: int, path: str = "/healthz") -> int:
        """The HTTP status of ``path`` on the container's own loopback."""
        code = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            f"    url = 'http://127.0.0.1:{port}{path}'\n"
            "    print(urllib.request.urlopen(url, timeout=5).status)\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code)\n"
            "except OSError:\n"
            "    print(0)\n"
        )
        result = self.exec(IMAGE_PYTHON, "-c", code)
        assert result.returncode == 0, result.stderr
        return int(result.stdout.strip())

    def metric(self, port: int, name: str) -> float:
        """The sum of a metric's samples, scraped from inside the container's network."""
        code = (
            "import urllib.request\n"
            f"print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=5)"
            ".read().decode())\n"
        )
        result = self.exec(IMAGE_PYTHON, "-c", code)
        assert result.returncode == 0, result.stderr
        return sum_of(result.stdout, name)

    def wait_metric(self, port: int, name: str, at_least: float, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while self.metric(port, name) < at_least:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {name} below {at_least} after {timeout}s")
            time.sleep(0.1)

    def agent(self, log_dir: Path, address: str, user: str | None = None) -> Agent:
        """A client of the bus at ``address`` running inside this container."""
        assert PODMAN is not None
        agent = Agent.__new__(Agent)
        agent.ns = None
        agent._err_path = log_dir / f"agent-{self.name}-{secrets.token_hex(4)}.err"
        head = [PODMAN, "exec", "-i", *(["--user", user] if user else []), self.name]
        with open(agent._err_path, "wb") as err:
            agent.proc = subprocess.Popen(
                [*head, IMAGE_PYTHON, AGENT_IN_CONTAINER, address],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip
        try:
            hello = agent._answer()
            if "pid" not in hello:
                raise AssertionError(f"agent in {self.name} did not connect: {hello}")
            agent.pid = int(hello["pid"])
            agent.host_pid = 0
        except BaseException:
            agent.close()
            raise
        return agent

    def kill(self, signal: str = "KILL") -> None:
        podman("kill", "-s", signal, self.name)
        podman("wait", self.name, check=False)

    def start(self) -> None:
        podman("start", self.name)

    def stop(self) -> int:
        """SIGTERM, as the kubelet stops a container; its exit status."""
        podman("stop", "-t", "10", self.name)
        return self.exit_code()

    def remove(self) -> None:
        """Remove it (a few tries: an ``exec`` session may be ending); one that
        stays, such as a container another still depends on, fails the test."""
        for _ in range(REMOVE_TRIES - 1):
            if subprocess.run(
                [str(PODMAN), "rm", "-f", "-t", "0", self.name],
                capture_output=True, timeout=PODMAN_TIMEOUT, check=False,
            ).returncode == 0:  # fmt: skip
                return
            time.sleep(1)
        podman("rm", "-f", "-t", "0", self.name)


def sum_of(text: str, name: str) -> float:
    """The sum of the samples of metric ``name`` in a Prometheus text answer."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def remove_all(containers: list[Container]) -> None:
    """Remove every one, the last started first (one sharing another's PID
    namespace before that one); the first failure is raised after all were tried."""
    failure: BaseException | None = None
    for container in reversed(containers):
        try:
            container.remove()
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def host_pid_of(container_pid: int, outer_pid: int) -> int:
    """The host pid of the process numbered ``container_pid`` in the PID
    namespace of host process ``outer_pid`` (from /proc/*/status NSpid)."""
    wanted = os.readlink(f"/proc/{outer_pid}/ns/pid")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/pid") != wanted:
                continue
            with open(f"/proc/{entry}/status") as status:
                for line in status:
                    if line.startswith("NSpid:") and int(line.split()[-1]) == container_pid:
                        return int(entry)
    raise AssertionError(f"no process {container_pid} in the PID namespace of {outer_pid}")
