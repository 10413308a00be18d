"""What a new user runs into with ``record`` and then ``analyze``: a pattern the
bus refuses, an --out that is a file, no bus, one message, a second session in
the same directory, and a recorder killed before analyze reads its files."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from sbus_relay.client import Client
from tests.support import VENV_BIN, BusProcess

from .conftest import SPARK_TEST_TIMEOUT, ConnectServer

pytestmark = pytest.mark.timeout(90)

#: Seconds a record command may take here.
RECORD_TIMEOUT = 30


def record(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "record", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RECORD_TIMEOUT,
    )  # fmt: skip


def lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [("!/cred/", "secret_refused"), ("!/x", "reserved_pattern")],
    ids=["secret-prefix", "reserved"],
)
def test_a_pattern_the_bus_refuses_is_said_in_its_words(
    sbusd: BusProcess, tmp_path: Path, pattern: str, reason: str
) -> None:
    out = tmp_path / "cap"
    result = record("-a", sbusd.address, pattern, "--out", str(out), "--duration", "5")
    assert result.returncode == 1
    (line,) = lines(result.stderr)
    assert line.startswith("sbus-relay record: the bus closed the connection: " + reason), line
    assert "Broken pipe" not in line
    assert not out.exists(), list(out.iterdir())  # no empty loss log, no directory


def test_out_a_file_and_no_bus_are_one_line_and_leave_nothing(
    sbusd: BusProcess, tmp_path: Path
) -> None:
    a_file = tmp_path / "notes"
    a_file.write_text("mine")
    result = record("-a", sbusd.address, "--out", str(a_file), "--duration", "1")
    assert result.returncode == 2
    (line,) = lines(result.stderr)
    assert "is a file, not a directory" in line and "Errno" not in line
    assert a_file.read_text() == "mine"
    nowhere = record("-a", str(tmp_path / "no-bus"), "--out", str(tmp_path / "cap"))
    assert nowhere.returncode == 1
    assert "cannot connect" in nowhere.stderr
    assert not (tmp_path / "cap").exists()
    for option, value in (("--count", "0"), ("--duration", "-1"), ("--rotate-seconds", "x")):
        refused = record("-a", sbusd.address, "--out", str(tmp_path / "cap"), option, value)
        assert refused.returncode == 2, refused.stderr
        assert lines(refused.stderr)[-1].startswith("sbus-relay record: error: argument ")
        assert not (tmp_path / "cap").exists()


def test_one_message_and_a_second_session_in_the_same_directory(
    sbusd: BusProcess, tmp_path: Path
) -> None:
    out = tmp_path / "cap"
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "record", "-a", sbusd.address, "--out", str(out),
         "-n", "1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + RECORD_TIMEOUT
    with Client(sbusd.address, timeout=5) as pub:
        while proc.poll() is None and time.monotonic() < deadline:
            pub.publish("a/b", b"x")  # until the recorder has subscribed and taken one
            time.sleep(0.2)
    _, err = proc.communicate(timeout=RECORD_TIMEOUT)
    assert proc.returncode == 0, err
    assert "recorded 1 message (1 payload byte) in 1 file under" in err, err
    again = record("-a", sbusd.address, "--out", str(out), "--duration", "0.3", "-q")
    assert again.returncode == 0, again.stderr
    said = [x for x in lines(again.stderr) if "already holds" in x]
    assert len(said) == 1 and "1 earlier recording session (1 file," in said[0], again.stderr
    # no bus there: the connect error alone, no word of the sessions it would join
    away = record("-a", str(tmp_path / "none.sock"), "--out", str(out), "--duration", "0.3")
    assert away.returncode != 0 and "already holds" not in away.stderr, away.stderr


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_analyze_of_a_killed_recording_does_not_say_nothing_lost(
    sbusd: BusProcess, connect_server: ConnectServer, tmp_path: Path
) -> None:
    out = tmp_path / "cap"
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "record", "-a", sbusd.address, "--out", str(out),
         "-q"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        with Client(sbusd.address, timeout=5) as pub:
            deadline = time.monotonic() + RECORD_TIMEOUT
            while not list(out.glob("*.arrow.partial")):
                assert time.monotonic() < deadline
                pub.publish("steady/x", b"1")
                time.sleep(0.05)
            for i in range(2000):
                pub.publish(f"steady/{i % 7}", b"%d" % i)
        # Killed once rows are in the journal (a fixed wait for its flush
        # failed on a loaded machine: nothing to recover, no capture file).
        from sbus_relay.pipeline.capture import read_journal

        (journal,) = out.glob("*.arrow.partial")
        while not sum(b.num_rows for b in read_journal(journal)[0]):
            assert time.monotonic() < deadline, "no rows in the journal"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    result = subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "analyze", str(out), "--out",
         str(tmp_path / "report"), "--remote", connect_server.url, "--no-report"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SPARK_TEST_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    assert "nothing lost" not in last, last
    assert "1 recorder session killed" in last, last
    assert "recovered" in result.stderr  # the journal, said in one line
