"""What a newcomer's first mistakes get: a forgotten payload is refused with a
hint, an address that is no socket says what it is, and ``serve`` without
``-f`` says where it went (``sbusd``, like the reference daemon, says nothing)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sbus_relay.client import Client
from tests.cli.conftest import WAIT
from tests.client.conftest import Master
from tests.support import VENV_BIN, is_listening, run_cli, running, short_dir

pytestmark = pytest.mark.timeout(90)


def one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.strip()


def test_pub_without_a_payload_is_refused_with_a_hint_and_publishes_nothing(bus: Master) -> None:
    with Client(bus.address, timeout=WAIT) as sub:
        sub.subscribe("first/")
        sub.whoami()
        done = run_cli("pub", "-a", bus.address, "first/forgot")
        line = one_line(done)
        assert done.returncode == 2, line
        assert "no payload for 'first/forgot'" in line and "-n" in line and "stdin" in line
        # nothing went out: the next message is the first one this subscriber sees
        assert run_cli("pub", "-a", bus.address, "first/next", "x").returncode == 0
        assert sub.receive().key == b"first/next"


@pytest.mark.parametrize("argv", [("-n", "first/empty"), ("first/empty", "")], ids=["-n", "''"])
def test_an_empty_payload_asked_for_is_published(bus: Master, argv: tuple[str, ...]) -> None:
    with Client(bus.address, timeout=WAIT) as sub:
        sub.subscribe("first/")
        sub.whoami()
        done = run_cli("pub", "-a", bus.address, *argv)
        assert done.returncode == 0, done.stderr
        message = sub.receive()
        assert (message.key, message.payload) == (b"first/empty", b"")


def test_pub_n_with_a_payload_is_refused(bus: Master) -> None:
    done = run_cli("pub", "-a", bus.address, "-n", "first/k", "payload")
    assert done.returncode == 2
    assert "-n publishes an empty payload" in one_line(done)


@pytest.mark.parametrize("what", ["directory", "regular file"])
def test_an_address_that_is_no_socket_says_what_it_is(tmp_path: Path, what: str) -> None:
    target = tmp_path / "sbus"
    if what == "directory":
        target.mkdir()
    else:
        target.write_text("not a bus\n")
    for argv in (("pub", "-a", str(target), "k", "v"), ("sub", "-a", str(target), "k/")):
        done = run_cli(*argv)
        line = one_line(done)
        assert done.returncode == 1, line
        assert f"{target} is a {what}, not a socket" in line, line
        assert "refused" not in line


def _daemon(command: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], str]:
    """Start ``command`` without -f, its stderr a pipe (a terminal's stand-in):
    what it printed, and its socket's path."""
    folder = short_dir()
    address = os.path.join(folder, "bus")
    done = subprocess.run(
        [*command, "-a", address, "-p", os.path.join(folder, "pid")],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    return done, address


def _stop(pid: int, address: str) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + WAIT
    while running(pid) or os.path.exists(address):
        assert time.monotonic() < deadline, f"the daemon {pid} did not stop"
        time.sleep(0.05)
    os.rmdir(os.path.dirname(address))


def test_serve_without_f_says_in_one_line_where_it_went(tmp_path: Path) -> None:
    log = tmp_path / "bus.log"
    done, address = _daemon(
        [os.path.join(VENV_BIN, "sbus-relay"), "serve", "--log-file", str(log)], tmp_path
    )
    line = one_line(done)
    assert done.returncode == 0 and done.stdout == b"", line
    pid = int(Path(address).with_name("pid").read_text())
    try:
        assert is_listening(address)
        said = re.fullmatch(
            r"sbus-relay serve: in the background as pid (\d+), pid file (\S+), serving (\S+),"
            r" logging to (\S+); stop it with kill (\d+) \(-f keeps a bus in the foreground\)",
            line,
        )
        assert said is not None, line
        assert said.groups() == (str(pid), str(Path(address).with_name("pid")), address,
                                 str(log), str(pid))  # fmt: skip
        assert '"event": "listening"' in log.read_text()  # where it logs, it does
    finally:
        _stop(pid, address)


def test_serve_without_a_log_file_names_syslog(tmp_path: Path) -> None:
    done, address = _daemon([os.path.join(VENV_BIN, "sbus-relay"), "serve"], tmp_path)
    line = one_line(done)
    pid = int(Path(address).with_name("pid").read_text())
    try:
        assert "logging to syslog (journalctl -t sbus-relay)" in line, line
    finally:
        _stop(pid, address)


def test_sbusd_daemonises_silently_as_the_reference_does(tmp_path: Path) -> None:
    done, address = _daemon([os.path.join(VENV_BIN, "sbusd")], tmp_path)
    pid = int(Path(address).with_name("pid").read_text())
    try:
        assert done.returncode == 0
        assert (done.stdout, done.stderr) == (b"", b"")
        assert is_listening(address)
    finally:
        _stop(pid, address)
