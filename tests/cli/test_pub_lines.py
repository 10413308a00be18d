"""``pub --lines`` sends each line as soon as it is read, without waiting for
the next one (a person typing lines, a program writing one now and then)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sbus_relay.client import Client
from tests.cli.conftest import WAIT
from tests.client.conftest import Master
from tests.support import VENV_BIN

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("target", ["p/k", "-"])
def test_a_line_goes_before_the_next_one_is_written(bus: Master, target: str) -> None:
    with Client(bus.address, timeout=WAIT) as receiver:
        receiver.subscribe("p/")
        receiver.whoami()
        pub = subprocess.Popen(
            [os.path.join(VENV_BIN, "sbus-relay"), "pub", "-a", bus.address, "--lines", target],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert pub.stdin is not None
        try:
            for word in (b"one", b"two", b"three"):
                pub.stdin.write((b"p/k\t" if target == "-" else b"") + word + b"\n")
                pub.stdin.flush()
                message = receiver.receive()  # before anything more is written
                assert (message.key, message.payload) == (b"p/k", word)
            pub.stdin.write(b"p/k\tpart" if target == "-" else b"part")  # no newline yet
            pub.stdin.flush()
            pub.stdin.write(b" and rest\n")
            pub.stdin.close()
            assert pub.wait(WAIT) == 0
            assert pub.stderr is not None and pub.stderr.read() == b""
            assert receiver.receive().payload == b"part and rest"
        finally:
            if pub.poll() is None:
                pub.kill()
                pub.wait()
            assert pub.stderr is not None
            pub.stderr.close()


@pytest.mark.parametrize("args", [("--lines", "p/k"), ("p/k", "-")], ids=str)
def test_a_closed_stdin_is_one_line_not_a_traceback(tmp_path: Path, args: tuple[str, ...]) -> None:
    address = str(tmp_path / "no-bus")  # never reached: stdin is checked first
    pub = [os.path.join(VENV_BIN, "sbus-relay"), "pub", "-a", address, *args]
    done = subprocess.run(
        ["sh", "-c", 'exec "$@" <&-', "sh", *pub],
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"sbus-relay pub: {'--lines' if args[0] == '--lines' else 'a payload of -'}"
        " reads stdin, which is closed"
    ]
