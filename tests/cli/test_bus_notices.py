"""What ``sub`` and ``pub --lines`` tell a person when their bus goes away:
plain lines on stderr (never log lines, JSON or not), on a file as on a
terminal, saying what happened and what the command does next."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import threading
from pathlib import Path

import pytest

from sbus_relay.client import Client
from tests.cli.conftest import WAIT
from tests.client.conftest import Master
from tests.support import VENV_BIN, run_cli, wait_for_text

pytestmark = pytest.mark.timeout(90)

#: What a log line has and a person's line has not: JSON, a timestamp, a level.
LOG_LINE = re.compile(r"[{}]|\d{4}-\d\d-\d\dT|\[\s*(warning|info)|\x1b\[")


def start_sub(bus: Master, stderr: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "sub", "-v", "-a", bus.address, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )


def person_lines(text: str, prog: str) -> list[str]:
    lines = text.replace("\r\n", "\n").splitlines()
    for line in lines:
        assert line.startswith(f"{prog}: ") and not LOG_LINE.search(line), text
    return lines


def follow_a_restart(bus: Master, err: Path, proc: subprocess.Popen[bytes]) -> str:
    """Stop the bus under a ``sub``, start it again; what ``sub`` said, once it
    printed a message sent after."""
    wait_for_text(str(err), "subscribed to s/ at", WAIT, proc)
    bus.stop()
    wait_for_text(str(err), "went away", WAIT, proc)
    bus.start()
    wait_for_text(str(err), "is back, after", WAIT, proc)
    assert run_cli("pub", "-a", bus.address, "s/1", "one").returncode == 0
    out, _ = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0 and out == b"s/1\tone\n"
    return err.read_text(errors="replace")


def test_sub_says_in_plain_lines_that_its_bus_went_away_and_came_back(
    bus: Master, tmp_path: Path
) -> None:
    err = tmp_path / "sub.err"
    with open(err, "wb") as stream:
        proc = start_sub(bus, stream.fileno(), "s/", "--count", "1")
    try:
        lines = person_lines(follow_a_restart(bus, err, proc), "sbus-relay sub")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert lines[0] == f"sbus-relay sub: subscribed to s/ at {bus.address}"
    assert lines[1].startswith(f"sbus-relay sub: the bus at {bus.address} went away")
    assert "connecting again" in lines[1]
    assert lines[2].startswith(f"sbus-relay sub: the bus at {bus.address} is back, after ")
    assert len(lines) == 3


def test_sub_on_a_terminal_says_the_same_plain_lines(bus: Master, tmp_path: Path) -> None:
    """stderr a terminal: no colours, no timestamps either."""
    parent, child = pty.openpty()
    err = tmp_path / "sub.err"
    try:
        proc = start_sub(bus, child, "s/", "--count", "1")
        os.close(child)
        child = -1
        heard = bytearray()

        def copy() -> None:  # what the terminal shows, into a file to wait on
            while True:
                try:
                    chunk = os.read(parent, 4096)
                except OSError:
                    return
                if not chunk:
                    return
                heard.extend(chunk)
                err.write_bytes(bytes(heard))

        reader = threading.Thread(target=copy, daemon=True)
        err.write_bytes(b"")
        reader.start()
        try:
            text = follow_a_restart(bus, err, proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(WAIT)
        lines = person_lines(bytes(heard).decode(errors="replace"), "sbus-relay sub")
        assert len(lines) == 3 and "went away" in lines[1] and "is back" in lines[2], text
    finally:
        os.close(parent)
        if child >= 0:
            os.close(child)


def test_sub_without_reconnect_says_it_gives_up_and_exits_1(bus: Master, tmp_path: Path) -> None:
    err = tmp_path / "sub.err"
    with open(err, "wb") as stream:
        proc = start_sub(bus, stream.fileno(), "s/", "--no-reconnect")
    try:
        wait_for_text(str(err), "subscribed to s/ at", WAIT, proc)
        bus.stop()
        assert proc.wait(WAIT) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = person_lines(err.read_text(errors="replace"), "sbus-relay sub")
    assert len(lines) == 2 and lines[1].endswith("; giving up (--no-reconnect)"), lines


def test_pub_lines_says_its_bus_went_away_and_came_back(bus: Master, tmp_path: Path) -> None:
    """Lines written while the bus is away wait, and go once it is back."""
    err = tmp_path / "pub.err"
    receiver = Client(bus.address, timeout=WAIT, reconnect=False)
    receiver.subscribe("p/")
    receiver.whoami()
    with open(err, "wb") as stream:
        pub = subprocess.Popen(
            [os.path.join(VENV_BIN, "sbus-relay"), "pub", "-a", bus.address, "--lines", "p/k"],
            stdin=subprocess.PIPE,
            stderr=stream,
        )
    assert pub.stdin is not None
    try:
        pub.stdin.write(b"before\n")
        pub.stdin.flush()
        assert receiver.receive().payload == b"before"
        receiver.close()
        bus.stop()
        pub.stdin.write(b"while away\n")  # the send that meets the closed bus
        pub.stdin.flush()
        wait_for_text(str(err), "went away", WAIT, pub)
        bus.start()
        receiver = Client(bus.address, timeout=WAIT, reconnect=False)
        receiver.subscribe("p/")
        receiver.whoami()
        pub.stdin.write(b"after\n")
        pub.stdin.close()
        assert pub.wait(WAIT) == 0
        assert [receiver.receive().payload for _ in range(2)] == [b"while away", b"after"]
    finally:
        receiver.close()
        if pub.poll() is None:
            pub.kill()
            pub.wait()
    lines = person_lines(err.read_text(errors="replace"), "sbus-relay pub")
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"sbus-relay pub: the bus at {bus.address} went away")
    assert "lines wait until it answers" in lines[0]
    assert lines[1].startswith(f"sbus-relay pub: the bus at {bus.address} is back, after ")
