"""The README's first commands on a fresh Debian 12, as a new user types them.

The machine is a container of the tests' Debian base with every package
removed that a minimal Debian 12 lacks (tests/containers/images.py,
``stripped_image("fresh")``: no Python, venv, compiler, make or git).  In it:

1. as root, the README's line of system packages, as written;
2. as a user who is not root, a clone of this checkout's committed HEAD and
   the README's ``make run``, which creates the venv, downloads the
   dependencies from PyPI, compiles the hot path and serves (as root too, in
   ``make test-slow``: the same steps, the same Makefile rules but for the
   venv's, which the packages line makes unneeded);
3. the README's ``sub`` and ``pub`` against that bus, from a second and third
   shell of that user, until the message arrives; the bus runs compiled.

The container reaches Debian's mirror and PyPI as a new machine would.  This
machine reaches HTTPS through a proxy whose certificate authority only it
trusts, so the container is given this machine's CA bundle for pip
(``PIP_CERT``, as this machine's own pip has it) -- nothing else of its
settings, none of its package indexes.  Where the container reaches neither
mirror, the test skips, saying so (CONTRIBUTING.md, "The first run, checked").
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers import images
from tests.containers.podman import PODMAN, usable_image
from tests.firstrun.test_first_run import line_starting, readme_block

#: make run's install (a download and a compile of the hot path) on a loaded machine.
pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parents[2]
#: The user who is not root, who types the README's commands (root types them too).
USER = "newcomer"
UID = 1000
#: Each one's home; the clone goes there.
HOMES = {USER: f"/home/{USER}", "root": "/root"}
CLONE = "sbus_relay"
#: This machine's CA bundle (pip's PIP_CERT here), and where the container sees it.
HOST_CA = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
CONTAINER_CA = "/etc/sbus-test-ca.crt"
#: Seconds for a step that downloads or compiles (the package lines, make run's install).
SLOW = 1200.0
#: Seconds for any other step.
WAIT = 60.0
#: What the container must reach: Debian's mirror and PyPI.
MIRRORS = (("deb.debian.org", 80), ("pypi.org", 443), ("files.pythonhosted.org", 443))


class Machine:
    """A running container of the fresh image; commands run in it with ``podman exec``."""

    def __init__(self, image: str, clone: Path, logs: Path, who: str) -> None:
        assert PODMAN is not None
        self.name = f"sbus-test-fresh-{secrets.token_hex(4)}"
        self.who = who
        self.logs = logs
        self.cloned = False
        self._count = 0
        mounts = ["-v", f"{clone}:/src:ro"]
        if HOST_CA.is_file():
            mounts += ["-v", f"{HOST_CA}:{CONTAINER_CA}:ro"]
        subprocess.run(
            [PODMAN, "run", "-d", "--name", self.name, *mounts, image, "sleep", "infinity"],
            check=True, capture_output=True, timeout=WAIT,
        )  # fmt: skip

    def _argv(self, line: str, user: str | None) -> list[str]:
        assert PODMAN is not None
        head = [PODMAN, "exec", "-e", "DEBIAN_FRONTEND=noninteractive"]
        if user is not None:
            # in the clone, once there is one, as a user who has just typed `cd`
            home = HOMES[user]
            where = f"{home}/{CLONE}" if self.cloned else home
            head += ["--user", user, "-w", where, "-e", f"HOME={home}"]
            if HOST_CA.is_file():
                head += ["-e", f"PIP_CERT={CONTAINER_CA}"]
        return [*head, self.name, "bash", "-c", line]

    def _files(self, name: str) -> tuple[Path, Path]:
        self._count += 1
        stem = f"{self._count:02d}-{name}"
        return self.logs / f"{stem}.out", self.logs / f"{stem}.err"

    def run(self, line: str, name: str, *, user: str | None = None, timeout: float = WAIT) -> str:
        """Run ``line`` to its end (as root, or ``user``); its stdout; a failure is one."""
        out, err = self._files(name)
        with open(out, "wb") as o, open(err, "wb") as e:
            done = subprocess.run(
                self._argv(line, user), stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                timeout=timeout, check=False,
            )  # fmt: skip
        said = out.read_text(errors="replace")
        assert done.returncode == 0, (
            f"{line!r} as {user or 'root'}: exit {done.returncode}\n{said[-2000:]}"
            f"{err.read_text(errors='replace')[-3000:]}"
        )
        return said

    def start(self, line: str, name: str, *, user: str) -> tuple[subprocess.Popen[bytes], Path]:
        """Start ``line`` in a shell of ``user`` that stays; the process and its stdout."""
        out, err = self._files(name)
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(
                self._argv(line, user), stdin=subprocess.DEVNULL, stdout=o, stderr=e
            )
        return proc, out

    def remove(self) -> None:
        assert PODMAN is not None
        subprocess.run(
            [PODMAN, "rm", "-f", "-t", "0", self.name], capture_output=True, timeout=WAIT,
            check=False,
        )  # fmt: skip


def unreachable(machine: Machine) -> list[str]:
    """The mirrors the container cannot open a connection to."""
    missing = []
    for host, port in MIRRORS:
        probe = f"exec 3<>/dev/tcp/{host}/{port}"
        with contextlib.suppress(AssertionError):
            machine.run(f"timeout 20 bash -c {shlex.quote(probe)}", f"reach-{host}")
            continue
        missing.append(f"{host}:{port}")
    return missing


@pytest.fixture(params=[USER, pytest.param("root", marks=pytest.mark.slow)])
def machine(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Machine]:
    image = usable_image(
        lambda podman: images.stripped_image(podman, "fresh"),
        "the fresh-Debian first run NOT checked",
    )
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=WAIT)
    if request.param == USER:
        # the user's own, as a repository one clones from is (git refuses another's)
        subprocess.run(["chown", "-R", f"{UID}:{UID}", str(clone)], check=True, timeout=WAIT)
    logs = tmp_path / "logs"
    logs.mkdir()
    running = Machine(image, clone, logs, request.param)
    try:
        missing = unreachable(running)
        if missing:
            pytest.skip(
                "!!! the fresh-Debian first run NOT checked: the container reaches no "
                f"{', '.join(missing)} (CONTRIBUTING.md says what else checks the README) !!!"
            )
        yield running
    finally:
        running.remove()


def test_the_readme_s_first_commands_on_a_fresh_debian_12(machine: Machine) -> None:
    readme = (ROOT / "README.md").read_text()
    top = readme_block(readme, "## Two commands")
    packages = line_starting(top, "apt-get ")
    assert "sudo" not in packages  # a fresh Debian has no sudo; root types it
    run_line = line_starting(top, "make run")
    tour = readme_block(readme, "### Publish and subscribe")
    address = line_starting(tour, "export SBUS_ADDRESS=").split("#")[0].split("=", 1)[1].strip()
    sub_line = line_starting(tour, ".venv/bin/sbus-relay sub 'sensors").split("   #")[0]
    pub_line = line_starting(tour, ".venv/bin/sbus-relay pub sensors").split("#")[0].strip()

    # 1. Nothing of what the README's commands need is there; then the one line, as root.
    assert machine.run("command -v python3 make git gcc || true", "before") == ""
    machine.run(packages, "packages", timeout=SLOW)
    who = machine.who
    if who == USER:
        machine.run(f"useradd --create-home --shell /bin/bash --uid {UID} {USER}", "useradd")

    # 2. As that user: a clone, and `make run`, which must listen within the deadline.
    machine.run(f"git clone -q /src {CLONE}", "clone", user=who)
    machine.cloned = True
    started = time.monotonic()
    bus, _ = machine.start(run_line, "make-run", user=who)
    # listening: the bus has taken a message (an empty one, -n)
    probe = f"test -S {address} && .venv/bin/sbus-relay pub -a {address} -n first-run/probe"
    while True:
        with contextlib.suppress(AssertionError):
            machine.run(probe, "listening?", user=who)
            break
        assert bus.poll() is None, f"make run ended ({bus.returncode}): {_tail(machine)}"
        assert time.monotonic() - started < SLOW, f"make run not listening: {_tail(machine)}"
        time.sleep(2)
    print(f"make run listened after {time.monotonic() - started:.0f} s")

    # 3. sub and pub as the README shows, with its SBUS_ADDRESS.
    export = f"export SBUS_ADDRESS={address}; "
    sub, sub_out = machine.start(export + sub_line, "sub", user=who)
    deadline = time.monotonic() + WAIT
    while "sensors/kitchen/temp\t21.5" not in sub_out.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"sub printed {sub_out.read_text()!r}"
        assert sub.poll() is None, _tail(machine)
        machine.run(export + pub_line, "pub", user=who)
        time.sleep(0.5)
    mode = machine.run(
        ".venv/bin/python -c 'import sbus_relay.accel as a; print(a.mode())'", "mode", user=who
    )
    assert mode.strip() == "compiled (Cython)", mode
    for proc in (sub, bus):
        proc.kill()
        proc.wait(WAIT)
    tracebacks = [p.name for p in machine.logs.iterdir() if "Traceback" in p.read_text("utf-8")]
    assert tracebacks == []


def _tail(machine: Machine) -> str:
    """The end of make run's output, for a failure's message."""
    found = sorted(machine.logs.glob("*-make-run.*"))
    return "\n".join(re.sub(r"\s+$", "", p.read_text(errors="replace")[-3000:]) for p in found)
