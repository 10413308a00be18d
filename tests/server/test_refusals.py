"""A client the bus refuses or cuts off is told why, and the commands say so.

The server sends ``CMSG disconnect\\0<reason>`` before it closes a client for a
reason of its own (docs/protocol.md); ``Client`` turns it into ``BusClosed``
with that reason, ``pub`` exits 1 naming it, ``sub`` prints it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sbus_relay.client import Client
from sbus_relay.protocol.errors import BusClosed
from tests.server.rawclient import RawClient
from tests.support import VENV_BIN, run_cli, start_bus, wait_for_text

pytestmark = pytest.mark.timeout(60)

NOBODY = 65534
#: Seconds any single wait in these tests may take.
WAIT = 15.0


def refusals(stderr_text: str) -> list[dict[str, object]]:
    """The server's ``client.refused`` log events."""
    events = []
    for line in stderr_text.splitlines():
        if '"client.refused"' in line:
            events.append(json.loads(line))
    return events


def test_pub_refused_for_too_many_clients_exits_1_with_the_reason(tmp_path: Path) -> None:
    bus = start_bus(tmp_path, "--max-clients", "1", command="serve")
    try:
        with RawClient(bus.address) as holder:
            holder.sync()  # the one allowed client is in
            result = run_cli("pub", "-a", bus.address, "k", "lost?")
        err = result.stderr.decode()
        assert result.returncode == 1, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "too_many_clients" in err
        events = refusals(bus.stderr_text())
        assert events and events[0]["reason"] == "too_many_clients"
        assert events[0]["uid"] == os.geteuid() and isinstance(events[0]["pid"], int)
    finally:
        bus.stop()


def test_pub_confirms_an_accepted_message(tmp_path: Path) -> None:
    bus = start_bus(tmp_path)
    try:
        with RawClient(bus.address) as sub:
            sub.sub(b"k")
            result = run_cli("pub", "-a", bus.address, "k", "taken")
            assert result.returncode == 0, result.stderr
            assert result.stderr == b""
            assert sub.recv_packet() == b"MSG k\0taken"
    finally:
        bus.stop()


def pub_as_nobody(address: str) -> tuple[int, str]:
    """``sbus-relay pub`` run as uid/gid 65534: its exit status and stderr.

    The interpreter may live where uid 65534 cannot read it, so a forked child
    drops its ids and runs the command's own entry point with stderr on a pipe.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        status = 99
        try:
            os.close(read_end)
            os.dup2(write_end, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (pytest replaced it)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            from sbus_relay.cli import main

            status = main(["pub", "-a", address, "k", "x"])
        except BaseException as exc:
            os.write(2, f"child-error {exc!r}\n".encode())
        finally:
            sys.stderr.flush()
            os._exit(status)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as stream:
        while chunk := stream.read(4096):
            chunks.append(chunk)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status), b"".join(chunks).decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run pub as uid 65534")
def test_pub_by_a_user_refused_by_u_exits_1_and_the_server_logs_it(tmp_path: Path) -> None:
    bus = start_bus(tmp_path, "-o", "-u", "root")
    try:
        os.chmod(os.path.dirname(bus.address), 0o755)  # let uid 65534 reach the socket
        status, err = pub_as_nobody(bus.address)
        assert status == 1, err
        assert "user_not_allowed" in err and "Traceback" not in err
        events = refusals(bus.stderr_text())
        assert [(e["reason"], e["uid"]) for e in events] == [("user_not_allowed", NOBODY)]
    finally:
        bus.stop()


def test_sub_says_why_it_was_cut_off(tmp_path: Path) -> None:
    bus = start_bus(tmp_path)
    try:
        result = run_cli("sub", "-a", bus.address, "!/")  # a reserved pattern
        err = result.stderr.decode()
        assert result.returncode == 1
        assert "reserved_pattern" in err and "Traceback" not in err
    finally:
        bus.stop()


def test_sub_says_the_server_stopped(tmp_path: Path) -> None:
    bus = start_bus(tmp_path)
    err_path = tmp_path / "sub.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [
                *(os.path.join(VENV_BIN, "sbus-relay"), "sub", "-v", "--no-reconnect"),
                *("-a", bus.address, "k"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for_text(str(err_path), "subscribed", WAIT, proc)
        assert bus.stop(signal.SIGTERM) == 0
        assert proc.wait(WAIT) == 1
        assert "server_stopping" in err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_client_raises_busclosed_with_the_reason(tmp_path: Path) -> None:
    bus = start_bus(tmp_path)
    try:
        with Client(bus.address, timeout=WAIT) as client:
            client.subscribe(b"!/")
            with pytest.raises(BusClosed) as info:
                client.whoami()
        assert info.value.reason.startswith("reserved_pattern")
    finally:
        bus.stop()
