"""Logging never touches the bus, and a detached daemon never logs to a terminal.

A log line that cannot be written (the reader of a pipe exited, or stopped
reading) is dropped and counted in ``sbus_log_lines_dropped_total``; clients
are served as before, and every stop signal still stops the server within a
second, removing its socket and pid files.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from sbus_relay.client import Client
from tests.server.rawclient import wait_accepting
from tests.support import VENV_BIN, free_port, running

pytestmark = pytest.mark.timeout(60)

#: The contract: every stop signal ends the server within this many seconds.
STOP_WITHIN = 1.0
#: Seconds any other single wait may take.
WAIT = 15.0


def pids_in_group(pgid: int) -> list[int]:
    """The pids of process group ``pgid`` (the shell pipeline's members)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except ProcessLookupError:
                pass
    return pids


def serve_pid(pgid: int) -> int:
    for pid in pids_in_group(pgid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone, or going (ESRCH)
            continue
        if b"serve" in cmdline and b"bash" not in cmdline.split(b"\0")[0]:
            return pid
    raise AssertionError("no serve process in the pipeline")


def dropped_lines(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("sbus_log_lines_dropped_total "):
            return float(line.split()[1])
    raise AssertionError("sbus_log_lines_dropped_total is not exported")


def stop_within(pid: int, sig: int, paths: list[str]) -> float:
    """Send ``sig`` to ``pid``; seconds until it and its files are gone."""
    start = time.monotonic()
    os.kill(pid, sig)
    while time.monotonic() - start < WAIT:
        gone = not running(pid)
        if gone and not any(os.path.exists(p) for p in paths):
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} still running or left {paths} after {WAIT}s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=str)
def test_a_closed_log_pipe_never_touches_the_bus(sig: int, short_tmp: Path) -> None:
    directory = str(short_tmp)
    address = os.path.join(directory, "S")
    port = free_port()
    serve = os.path.join(VENV_BIN, "sbus-relay")
    shell = subprocess.Popen(
        [
            "bash",
            "-c",
            f'"{serve}" serve -a "{address}" -f --metrics 127.0.0.1:{port} 2>&1 | head -1',
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_accepting(address, None, timeout=WAIT)
        assert shell.stdout is not None
        first = shell.stdout.readline()  # head prints one line, then exits
        assert first.startswith(b"{"), first
        pid = serve_pid(shell.pid)
        # head is gone: every further line fails to write; clients must not notice.
        for i in range(5):
            with Client(address, timeout=WAIT) as sub, Client(address, timeout=WAIT) as pub:
                sub.subscribe("k")
                sub.whoami()
                pub.publish("k", f"m{i}")
                assert sub.receive().payload == f"m{i}".encode()
        done = subprocess.run(
            [serve, "pub", "-a", address, "k", "confirmed"],
            capture_output=True,
            timeout=WAIT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert dropped_lines(port) > 0
        os.kill(pid, signal.SIGHUP)  # serve reloads (its lines are lost too) and serves on
        with Client(address, timeout=WAIT) as client:
            assert client.whoami()
        assert stop_within(pid, sig, [address]) < STOP_WITHIN
    finally:
        for pid in pids_in_group(shell.pid):
            os.kill(pid, signal.SIGKILL)
        shell.wait(WAIT)
        if shell.stdout is not None:
            shell.stdout.close()


def test_a_log_reader_that_stopped_reading_never_stalls_the_bus(
    tmp_path: Path, short_tmp: Path
) -> None:
    # A pipe nobody reads fills up; a blocking write would freeze the bus.
    directory = str(short_tmp)
    address = os.path.join(directory, "S")
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-a", address, "-f",
         "--log-level", "debug"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=write_end,
    )  # fmt: skip
    os.close(write_end)
    try:
        wait_accepting(address, proc, timeout=WAIT)
        # Each connection logs lines; 2,000 of them overfill a 64 KiB pipe.
        started = time.monotonic()
        for _ in range(2000):
            Client(address).close()
        with Client(address, timeout=WAIT) as client:
            assert client.whoami()
        assert time.monotonic() - started < WAIT
        assert stop_within(proc.pid, signal.SIGTERM, [address]) < STOP_WITHIN
        assert proc.wait(WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(read_end)


def test_a_daemon_never_logs_to_the_terminal_it_left(tmp_path: Path, short_tmp: Path) -> None:
    directory = str(short_tmp)
    address = os.path.join(directory, "S")
    pidfile = os.path.join(directory, "pid")
    master, slave = pty.openpty()
    try:
        done = subprocess.run(
            [os.path.join(VENV_BIN, "sbusd"), "-a", address, "-p", pidfile],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, timeout=WAIT, check=False,
        )  # fmt: skip
        assert done.returncode == 0
        os.close(slave)
        slave = -1
        pid = int(Path(pidfile).read_text())
        _drain(master, 0.3)  # whatever it said while still on the terminal
        with Client(address, timeout=WAIT) as client:  # logs client.connected
            client.subscribe("!/")  # ... and a refusal, at warning level
            with pytest.raises(Exception):  # noqa: B017 (BusClosed, any reason)
                client.whoami()
        assert _drain(master, 0.5) == b""
        assert stop_within(pid, signal.SIGTERM, [address, pidfile]) < STOP_WITHIN
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)


def test_a_daemon_logs_to_the_configured_file(tmp_path: Path, short_tmp: Path) -> None:
    directory = str(short_tmp)
    address = os.path.join(directory, "S")
    pidfile = os.path.join(directory, "pid")
    log_file = tmp_path / "bus.log"
    done = subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-a", address, "-p", pidfile,
         "--log-file", str(log_file)],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # nothing of the log on the caller's stderr: only serve's line of where it went
    said = done.stderr.decode().splitlines()
    assert len(said) == 1 and f"logging to {log_file};" in said[0], said
    pid = int(Path(pidfile).read_text())
    try:
        Client(address, timeout=WAIT).close()
        deadline = time.monotonic() + WAIT
        while '"client.connected"' not in log_file.read_text():
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
    finally:
        assert stop_within(pid, signal.SIGTERM, [address, pidfile]) < STOP_WITHIN


def test_an_unwritable_log_file_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-f", "-a", str(tmp_path / "S"),
         "--log-file", str(tmp_path / "no" / "such" / "dir.log")],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "log_file" in lines[0], lines


def _drain(fd: int, quiet: float) -> bytes:
    """Everything readable on ``fd`` until it has been quiet for ``quiet`` seconds."""
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], quiet)
        if not ready:
            return b"".join(chunks)
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: no process has the terminal open any more
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
