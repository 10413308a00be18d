"""Containers without Docker: real Linux namespaces for the relay tests.

A *namespace* here is one ``unshare --pid --fork --mount --mount-proc --uts
[--net]`` whose pid 1 is a small reaper; everything else enters it with
``nsenter --target <that pid 1>``, the way a container runtime's ``exec`` does.
A *container* is such a namespace laid out as docs/deploy.md ("Containers as
Linux namespaces") describes:

* a private tmpfs on ``/run`` (and one on ``/tmp``, hiding the host's), so the
  relay listens at the container's own ``/run/sbus.socket``;
* the host master's socket **directory** bind-mounted at ``/run/sbus-master``;
* the relay config written to ``/run/sbus-relay.yaml`` (by default the shipped
  ``configs/relay.yaml``, unchanged);
* its own hostname (the relay's default instance name) and, with ``net``, its
  own network namespace with only ``lo`` up (metrics bind inside it).

Mounts made inside are private to the namespace's mount namespace and vanish
with its last process; every tmpfs is named ``sbus-ns-<name>-<token>`` so that a
test can check the host's mount table for leftovers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

import yaml

from tests.relay.helpers import WAIT, Peer, _without_instance, wait_until
from tests.support import VENV_BIN, read_line

#: The repository's root (configs/ and the agent live below it).
ROOT = Path(__file__).resolve().parents[2]
#: The shipped relay config, used verbatim inside containers.
RELAY_YAML = (ROOT / "configs" / "relay.yaml").read_text()
#: Where a container's relay and clients find things (configs/relay.yaml).
RELAY_SOCKET = "/run/sbus.socket"
MASTER_DIR_IN_NS = "/run/sbus-master"
CONFIG_IN_NS = "/run/sbus-relay.yaml"
#: The master's socket file name in its directory (what configs/relay.yaml expects).
MASTER_SOCKET_NAME = "sbus.socket"
#: The relay's metrics port in configs/relay.yaml (inside each container's network).
RELAY_METRICS_PORT = int(str(yaml.safe_load(RELAY_YAML)["metrics"]).rpartition(":")[2])
SBUS_RELAY = os.path.join(VENV_BIN, "sbus-relay")
AGENT = str(Path(__file__).with_name("agent.py"))
#: Seconds a namespace gets to set itself up, and to vanish after SIGKILL.
NS_TIMEOUT = 10.0
#: What a namespace's processes run from; kept visible under its private /tmp.
_NEEDED_PATHS = sorted({str(ROOT), sys.prefix, os.path.dirname(os.path.realpath(sys.executable))})

#: pid 1 of every namespace: set up mounts, then reap whatever is re-parented to it.
_INIT = r"""
set -eu
name=$1 token=$2 master_dir=$3 net=$4 config=$5 python=$6 keep=$7
mount --make-rprivate /
hostname "$name"
if [ -n "$master_dir" ]; then
    mount -t tmpfs -o mode=0755,size=16m "sbus-ns-$name-$token" /run
    mkdir /run/sbus-master
    mount --bind "$master_dir" /run/sbus-master
    printf '%s' "$config" > /run/sbus-relay.yaml
    # A private /tmp, as a container has; what the tests run from (a checkout
    # or a venv under /tmp) is bound back in at the same path.
    mkdir /run/host-tmp
    mount --bind /tmp /run/host-tmp
    mount -t tmpfs -o mode=1777,size=16m "sbus-ns-$name-$token" /tmp
    printf '%s\n' "$keep" | while IFS= read -r path; do
        case "$path" in
        /tmp/?*)
            mkdir -p "$path"
            mount --bind "/run/host-tmp/${path#/tmp/}" "$path"
            ;;
        esac
    done
    umount -l /run/host-tmp
    rmdir /run/host-tmp
fi
if [ "$net" = 1 ]; then
    ip link set lo up
fi
echo ready
exec "$python" -c '
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
'
"""

#: The base namespace flags; ``--net`` is added per namespace.
UNSHARE = ["unshare", "--pid", "--fork", "--mount", "--mount-proc", "--uts"]


def unshare_problem() -> str | None:
    """Why namespace tests cannot run here, or None: the failing command and its stderr."""
    if os.geteuid() != 0:
        return f"namespace tests need root (euid {os.geteuid()}): unshare --pid --mount"
    for tool in ("unshare", "nsenter", "mount", "ip", "hostname"):
        if shutil.which(tool) is None:
            return f"namespace tests need {tool!r} on PATH"
    probe = [*UNSHARE, "--net", "sh", "-c", "mount -t tmpfs sbus-probe /mnt && ip link set lo up"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=NS_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{' '.join(probe)}` failed: {exc}"
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        return f"`{' '.join(probe)}` failed with exit {done.returncode}: {err}"
    return None


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (host pids)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # gone, or going (ESRCH)
        return []


def ns_pids(host_pid: int) -> list[int]:
    """``NSpid`` of a process: its pid in each pid namespace, outermost first."""
    with open(f"/proc/{host_pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(p) for p in line.split()[1:]]
    raise AssertionError(f"no NSpid for {host_pid}")


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def kill_child(parent: subprocess.Popen[bytes], pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid`` only while it is still ``parent``'s child (never a reused pid)."""
    if parent_of(pid) == parent.pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def host_mounts() -> str:
    """The host's mount table (this test process is in the host mount namespace)."""
    return Path("/proc/self/mountinfo").read_text()


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as ``{'name{labels}': value}`` without the instance label."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[_without_instance(name)] = float(value)
    return samples


def clients(port: int, query: str = "") -> dict[str, Any]:
    """A server's ``/clients`` document (its metrics server on 127.0.0.1:``port``)."""
    url = f"http://127.0.0.1:{port}/clients{query}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return cast(dict[str, Any], json.load(response))


def relay_rows(port: int) -> dict[str, dict[str, Any]]:
    """The relay connections in ``/clients``, by the name each relay announced."""
    return {row["relay"]: row for row in clients(port)["clients"] if row["is_relay"]}


def host_messages(peer: Peer, expected: int) -> list[tuple[str, str]]:
    """A raw host client's MSG packets (``Peer.messages``) as sorted (key, payload)."""
    got = []
    for packet in peer.messages(expected):
        key, _, payload = packet.removeprefix(b"MSG ").partition(b"\0")
        got.append((key.decode(), payload.decode()))
    return sorted(got)


def log_events(text: str, name: str | None = None) -> list[dict[str, Any]]:
    """The JSON log lines of a server's log (those of event ``name``)."""
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
    return found


def _child_of(launcher: subprocess.Popen[bytes], what: str) -> int:
    """The process ``nsenter``/``unshare`` forked: the one inside the namespace."""

    def found() -> int:
        if launcher.poll() is not None:
            raise AssertionError(f"{what}: launcher exited with {launcher.returncode}")
        kids = children(launcher.pid)
        return kids[0] if kids else 0

    return wait_until(found, f"the process of {what}", NS_TIMEOUT)


class Namespace:
    """One ``unshare``: pid, mount and UTS namespaces (+ net), entered by ``nsenter``."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        *,
        net: bool,
        master_dir: str | None = None,
        config: str = RELAY_YAML,
    ) -> None:
        self.name = name
        self.net = net
        self.token = secrets.token_hex(4)
        self.log_dir = log_dir
        argv = [*UNSHARE, *(["--net"] if net else [])]
        argv += ["sh", "-c", _INIT, "init", name, self.token, master_dir or "", str(int(net))]
        argv += [config, sys.executable, "\n".join(_NEEDED_PATHS)]
        self._err_path = log_dir / f"ns-{name}-{self.token}.err"
        with open(self._err_path, "wb") as err:
            self.unshare: subprocess.Popen[bytes] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
            )
        try:
            assert self.unshare.stdout is not None
            line = read_line(self.unshare.stdout.fileno(), NS_TIMEOUT)
            if line != b"ready\n":
                raise AssertionError(
                    f"namespace {name} did not start ({line!r}): {self._err_path.read_text()}"
                )
            #: pid 1 of the namespace, as the host sees it
            self.init_pid = _child_of(self.unshare, f"namespace {name}")
        except BaseException:
            self.destroy()
            raise

    @property
    def tmpfs_source(self) -> str:
        """The source name of this namespace's tmpfs mounts (to find leftovers)."""
        return f"sbus-ns-{self.name}-{self.token}"

    def enter(self, *argv: str) -> list[str]:
        """``argv`` run inside this namespace (as ``docker exec`` would)."""
        flags = ["--pid", "--mount", "--uts", *(["--net"] if self.net else [])]
        return ["nsenter", "--target", str(self.init_pid), *flags, "--", *argv]

    def run(self, *argv: str, timeout: float = 20.0) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` inside to completion, output captured; ``SBUS_ADDRESS`` is
        unset, so programs use the default address as they would in a container."""
        env = {k: v for k, v in os.environ.items() if k != "SBUS_ADDRESS"}
        return subprocess.run(
            self.enter(*argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )

    def http_get(self, url: str) -> str:
        """GET ``url`` from inside this namespace's network (its own ``lo``)."""
        code = (
            "import sys, urllib.request\n"
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\n"
        )
        done = self.run(sys.executable, "-c", code, url)
        if done.returncode != 0:
            raise OSError(f"GET {url} in {self.name}: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode()

    def alive(self) -> bool:
        return self.unshare.poll() is None

    def destroy(self) -> None:
        """SIGKILL pid 1: the kernel kills every process in the namespace with it."""
        init = getattr(self, "init_pid", None)
        if init is not None:
            kill_child(self.unshare, init)
        elif self.unshare.poll() is None:
            self.unshare.kill()
        try:
            self.unshare.wait(NS_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.unshare.kill()
            self.unshare.wait()
        if self.unshare.stdout is not None:
            self.unshare.stdout.close()


class NsServer:
    """``sbus-relay serve`` running inside a namespace; ``pid`` is its host pid."""

    def __init__(self, ns: Namespace, *args: str, ready: tuple[str, ...]) -> None:
        self.ns = ns
        self.log_path = ns.log_dir / f"serve-{ns.name}-{secrets.token_hex(4)}.log"
        with open(self.log_path, "wb") as err:
            self.launcher: subprocess.Popen[bytes] = subprocess.Popen(
                ns.enter(SBUS_RELAY, "serve", *args),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            self.pid = _child_of(self.launcher, f"serve in {ns.name}")
            for event in ready:
                self.wait_event(event)
        except BaseException:
            self.kill()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines so far (those of event ``name``)."""
        return log_events(self.log(), name)

    def wait_event(self, name: str, count: int = 1, timeout: float = WAIT) -> dict[str, Any]:
        """Wait for the ``count``-th log event ``name``; returns it."""

        def check() -> dict[str, Any] | None:
            got = self.events(name)
            if len(got) >= count:
                return got[count - 1]
            if self.launcher.poll() is not None:
                raise AssertionError(f"serve in {self.ns.name} exited:\n{self.log()}")
            return None

        try:
            return cast(dict[str, Any], wait_until(check, f"{name!r} in {self.ns.name}", timeout))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()[-3000:]}") from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the server (SIGKILL: a crash, its socket file stays) and reap it."""
        pid = getattr(self, "pid", None)
        if pid is not None:
            kill_child(self.launcher, pid, sig)
        try:
            self.launcher.wait(NS_TIMEOUT)
        except subprocess.TimeoutExpired:
            if pid is not None:
                kill_child(self.launcher, pid)
            self.launcher.kill()
            self.launcher.wait()


class Agent:
    """A client program (tests/namespaces/agent.py) on the host or inside a namespace."""

    def __init__(
        self,
        log_dir: Path,
        address: str,
        *,
        ns: Namespace | None = None,
        user: tuple[int, int] | None = None,
    ) -> None:
        argv = [sys.executable, AGENT, address]
        if user is not None:
            argv += [str(user[0]), str(user[1])]
        self.ns = ns
        where = ns.name if ns is not None else "host"
        self._err_path = log_dir / f"agent-{where}-{secrets.token_hex(4)}.err"
        with open(self._err_path, "wb") as err:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                ns.enter(*argv) if ns is not None else argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        try:
            hello = self._answer()
            if "pid" not in hello:
                raise AssertionError(f"agent in {where} did not connect: {hello}")
            #: the agent's own os.getpid(): its pid in its namespace
            self.pid = int(hello["pid"])
            #: its pid as the host sees it
            self.host_pid = _child_of(self.proc, f"agent in {where}") if ns else self.proc.pid
        except BaseException:
            self.close()
            raise

    def _answer(self, timeout: float = WAIT + 5) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = read_line(self.proc.stdout.fileno(), timeout)
        except TimeoutError as exc:
            raise AssertionError(f"agent silent: {exc}\n{self._err_path.read_text()}") from None
        if not line:
            raise AssertionError(f"agent exited:\n{self._err_path.read_text()}")
        return cast(dict[str, Any], json.loads(line))

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        self.proc.stdin.flush()
        return self._answer(float(fields.get("timeout", 0)) + WAIT)

    def _ok(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = self.call(op, **fields)
        if not answer.get("ok"):
            raise AssertionError(f"{op} {fields} -> {answer}")
        return answer

    def whoami(self) -> str:
        return str(self._ok("whoami")["value"])

    def sub(self, pattern: str) -> None:
        self._ok("sub", pattern=pattern)

    def pub(self, key: str, payload: str = "") -> None:
        self._ok("pub", key=key, payload=payload)

    def recv(self, timeout: float = WAIT) -> dict[str, Any]:
        """The next packet's fields, ``{"timeout": true}`` or ``{"closed": reason}``."""
        return self.call("recv", timeout=timeout)

    def messages(self, expected: int, drain: float = 0.3) -> list[tuple[str, str]]:
        """(key, payload) of MSG packets: ``expected`` of them, then ``drain`` seconds more."""
        got: list[tuple[str, str]] = []
        deadline = time.monotonic() + WAIT
        while len(got) < expected and time.monotonic() < deadline:
            answer = self.recv(max(0.01, deadline - time.monotonic()))
            if not answer.get("ok"):
                break
            if not answer["control"]:
                got.append((answer["key"], answer["payload"]))
        while True:
            answer = self.recv(drain)
            if not answer.get("ok"):
                break
            if not answer["control"]:
                got.append((answer["key"], answer["payload"]))
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "close"}\n')
                self.proc.stdin.flush()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class Container(Namespace):
    """A namespace laid out as a container with a relay of the host's master."""

    def __init__(
        self, name: str, log_dir: Path, master_dir: str, *, net: bool, config: str = RELAY_YAML
    ) -> None:
        super().__init__(name, log_dir, net=net, master_dir=master_dir, config=config)
        self.relay: NsServer | None = None
        self.agents: list[Agent] = []

    def start_relay(self) -> NsServer:
        """``sbus-relay serve -C /run/sbus-relay.yaml``; returns once its upstream answered."""
        self.relay = NsServer(self, "-C", CONFIG_IN_NS, ready=("listening", "upstream.ready"))
        return self.relay

    def agent(self, user: tuple[int, int] | None = None, address: str = RELAY_SOCKET) -> Agent:
        """A client inside, of the container's relay by default (uid, gid: drop root)."""
        agent = Agent(self.log_dir, address, ns=self, user=user)
        self.agents.append(agent)
        return agent

    def relay_metrics(self) -> dict[str, float]:
        """The relay's /metrics on port 9801 of this container's own network."""
        return parse_metrics(self.http_get(f"http://127.0.0.1:{RELAY_METRICS_PORT}/metrics"))

    def wait_relay_metric(self, name: str, value: float, timeout: float = WAIT) -> None:
        """Wait until one of the relay's samples equals ``value``."""
        last: list[float] = []

        def check() -> bool:
            last[:] = [self.relay_metrics().get(name, 0.0)]
            return last[0] == value

        try:
            wait_until(check, f"{name} == {value} on the relay of {self.name}", timeout)
        except AssertionError as exc:
            relay_log = self.relay.log()[-3000:] if self.relay else ""
            raise AssertionError(f"{exc}; last value {last}\n{relay_log}") from None

    def destroy(self) -> None:
        """Tear the container down at once (SIGKILL of pid 1), then reap what ran in it."""
        super().destroy()
        for agent in self.agents:
            agent.close()
        if self.relay is not None:
            self.relay.kill()
