"""``sub`` and ``pub`` on the client library: pub --lines KEY|-, batches, and a
sub that follows its bus across a restart."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sbus_relay.client import Client
from tests.client.conftest import WAIT, Master
from tests.support import VENV_BIN, run_cli, wait_for_text

pytestmark = pytest.mark.timeout(60)


def sub_process(address: str, err: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(err, "wb") as stream:
        proc = subprocess.Popen(
            [os.path.join(VENV_BIN, "sbus-relay"), "sub", "-v", "-a", address, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stream,
        )
    wait_for_text(str(err), "subscribed to ", WAIT, proc)
    return proc


def test_pub_lines_to_one_key_arrive_in_order_packed(master: Master) -> None:
    lines = b"".join(b"line %d\n" % i for i in range(1000))
    with Client(master.address, timeout=WAIT) as sub:
        sub.subscribe("l/")
        sub.whoami()
        done = run_cli("pub", "-a", master.address, "--lines", "l/k", input=lines)
        assert done.returncode == 0, done.stderr
        got = [sub.receive() for _ in range(1000)]
    assert [m.payload for m in got] == [b"line %d" % i for i in range(1000)]
    assert {m.key for m in got} == {b"l/k"}


def test_pub_lines_dash_reads_what_sub_prints(master: Master, tmp_path: Path) -> None:
    """sub ... | pub --lines - replays: keys, tabs, newlines and bytes that are not
    UTF-8 come through unchanged."""
    sent = [(b"r/a", b"plain"), (b"r/b", b"tab\there\nnewline"), (b"r/c", b"\xff\x00\\x")]
    proc = sub_process(master.address, tmp_path / "sub.err", "r/", "--count", "3")
    with Client(master.address, timeout=WAIT) as pub:
        pub.publish_many(sent)
    printed, _ = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0
    with Client(master.address, timeout=WAIT) as sub:
        sub.subscribe("r/")
        sub.whoami()
        done = run_cli("pub", "-a", master.address, "--lines", "-", input=printed)
        assert done.returncode == 0, done.stderr
        assert [(m.key, m.payload) for m in (sub.receive() for _ in sent)] == sent


def test_pub_lines_refuses_a_line_without_a_key_naming_it(master: Master) -> None:
    """The lines before the bad one are sent all the same, and confirmed."""
    with Client(master.address, timeout=WAIT) as sub:
        sub.subscribe("k/")
        sub.whoami()
        done = run_cli(
            "pub", "-a", master.address, "--lines", "-", input=b"k/1\tv1\nk/2\tv2\nno tab\n"
        )
        err = done.stderr.decode()
        assert done.returncode == 1 and "line 3" in err and "Traceback" not in err
        got = [sub.receive() for _ in range(2)]
        assert [(m.key, m.payload) for m in got] == [(b"k/1", b"v1"), (b"k/2", b"v2")]
    both = run_cli("pub", "-a", master.address, "--lines", "k", "extra")
    assert both.returncode == 2 and "--lines" in both.stderr.decode()


def test_pub_lines_against_the_reference_falls_back(reference_bus: str) -> None:
    with Client(reference_bus, timeout=WAIT) as sub:
        sub.subscribe("f/")
        sub.whoami()
        done = run_cli("pub", "-a", reference_bus, "--lines", "f/k", input=b"1\n2\n3\n")
        assert done.returncode == 0, done.stderr
        assert [sub.receive().payload for _ in range(3)] == [b"1", b"2", b"3"]


def test_sub_follows_its_bus_across_a_restart(master: Master, tmp_path: Path) -> None:
    err = tmp_path / "sub.err"
    proc = sub_process(master.address, err, "s/", "--count", "2")
    try:
        assert run_cli("pub", "-a", master.address, "s/1", "one").returncode == 0
        master.restart()
        wait_for_text(str(err), "is back, after", WAIT, proc)
        assert run_cli("pub", "-a", master.address, "s/2", "two").returncode == 0
        out, _ = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0
        assert out == b"s/1\tone\ns/2\ttwo\n"
        text = err.read_text()
        assert "went away" in text and "Traceback" not in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_pub_lines_refuses_a_line_too_long_for_a_packet(master: Master) -> None:
    data = b"short\n" + b"x" * 500_000 + b"\n"
    done = run_cli("pub", "-a", master.address, "--lines", "k", input=data)
    err = done.stderr.decode()
    assert done.returncode == 1 and "line 2" in err and "409600" in err, err
