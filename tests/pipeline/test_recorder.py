"""The recorder against a live bus: every published message is in the files, exactly."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
import pyarrow.parquet as pq

from sbus_relay.client import Client
from sbus_relay.pipeline.capture import RotatingCaptureWriter, capture_files
from sbus_relay.pipeline.recorder import Recorder
from tests.support import VENV_BIN, BusProcess

pytestmark = pytest.mark.timeout(60)

#: Seconds to wait for the recorder to catch up or start.
WAIT = 15.0
#: Largest payload sent: under the default kernel socket buffer (net.core.wmem_default).
BIG_PAYLOAD = 150_000


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def messages() -> list[tuple[bytes, bytes]]:
    """Keys of several families and payload sizes from 0 to the packet limit."""
    out = []
    for i in range(300):
        size = [0, 1, 17, 4096, 65_000][i % 5]
        out.append((f"fam{i % 3}/sub{i % 4}/{i}".encode(), os.urandom(size)))
    key = b"big/one"
    # A big one: the kernel's default socket buffer (about 208 KiB), not
    # MAX_PACKET, is what limits a SEQPACKET send here.
    out.append((key, b"z" * BIG_PAYLOAD))
    out.append(("médias/é".encode(), b"utf-8 key"))
    return out


def read_rows(directory: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for f in capture_files([str(directory)]):
        rows += pq.read_table(f).to_pylist()
    return rows


def test_every_published_message_is_recorded(sbusd: BusProcess, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    # Small rotation size: the capture spans several files, and none is lost.
    writer = RotatingCaptureWriter(
        out, instance="test-bus", rotate_bytes=1 << 20, row_group_rows=64, row_group_bytes=1 << 18
    )
    recorder = Recorder(sbusd.address, [""], writer)
    stop = threading.Event()
    ready = threading.Event()
    thread = threading.Thread(target=recorder.run, args=(stop,), kwargs={"on_ready": ready.set})
    thread.start()
    try:
        assert ready.wait(WAIT)
        sent = messages()
        t_before = time.time_ns()
        with Client(sbusd.address, timeout=WAIT) as pub:
            for key, payload in sent:
                pub.publish(key, payload)
            # Secret keys never reach the default "" pattern (docs/protocol.md).
            pub.publish(b"!/cred/0/0/0/secret", b"hidden")
        wait_for(lambda: writer.stats.messages >= len(sent), "the recorder to catch up")
        time.sleep(0.3)  # anything extra (the secret) would have arrived by now
    finally:
        stop.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    t_after = time.time_ns()

    rows = read_rows(out)
    assert len(capture_files([str(out)])) > 1
    assert not list(out.glob("*.partial"))
    assert [(r["key"].encode(), r["payload"]) for r in rows] == sent  # type: ignore[union-attr]
    assert [r["size"] for r in rows] == [len(p) for _, p in sent]
    times = [r["time_ns"] for r in rows]
    assert times == sorted(times)
    assert t_before <= times[0] and times[-1] <= t_after  # type: ignore[operator]
    assert {r["instance"] for r in rows} == {"test-bus"}


def test_record_command_stops_cleanly_on_sigterm(sbusd: BusProcess, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "record", "-a", sbusd.address, "--out", str(out),
         "--no-payload", "--instance", "cmd", "fam/"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], WAIT)
        assert ready, "record never said it was recording"
        assert b"recording" in proc.stderr.readline()
        with Client(sbusd.address, timeout=WAIT) as pub:
            pub.subscribe("fam/end")
            for i in range(100):
                pub.publish(f"fam/{i}", b"p" * i)
            pub.publish("other/x", b"not subscribed")
            # A round trip: once our own "fam/end" is back, the server has routed
            # everything before it; the recorder drains in-flight messages on stop.
            pub.publish("fam/end", b"")
            assert pub.receive().key == b"fam/end"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"recorded 101 messages" in err
    rows = read_rows(out)
    assert not list(out.glob("*.partial"))
    assert [(r["key"], r["size"], r["payload"], r["instance"]) for r in rows] == [
        *[(f"fam/{i}", i, None, "cmd") for i in range(100)],
        ("fam/end", 0, None, "cmd"),
    ]


def start_record(address: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``sbus-relay record`` in the background, once it says it is recording."""
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "record", "-a", address, "--out", str(out),
         "--instance", "cmd", *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], WAIT)
    assert ready, "record never said it was recording"
    assert b"recording" in proc.stderr.readline()
    return proc


def stop_record(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode()


def test_messages_the_bus_drops_are_counted_logged_and_fail_the_exit_status(
    sbusd: BusProcess, tmp_path: Path
) -> None:
    """A recorder that falls behind: every message is either recorded or counted lost."""
    out = tmp_path / "cap"
    proc = start_record(sbusd.address, out, "flood/")
    published = 12_000  # 24 MB: over the server's hard limit (16 MiB) for the recorder
    try:
        proc.send_signal(signal.SIGSTOP)  # the recorder falls behind, as under a flood
        with Client(sbusd.address, timeout=WAIT) as pub:
            for i in range(published):
                pub.publish(f"flood/{i}", b"x" * 2000)
            pub.whoami()  # every message above is routed (delivered, queued or dropped)
    finally:
        proc.send_signal(signal.SIGCONT)
    time.sleep(1.5)  # at least one drop query while recording
    status, err = stop_record(proc)
    assert status == 3, err
    (line,) = [x for x in err.splitlines() if x.startswith("recorded")]
    recorded = len(read_rows(out))
    lost = published - recorded
    assert lost > 0
    assert f"recorded {recorded:,} messages" in line and f"LOST {lost:,} messages" in line

    from sbus_relay.pipeline.capture import loss_files, read_losses

    losses = read_losses(loss_files([str(out)]))
    assert (losses.sessions, losses.unfinished, losses.known) == (1, 0, True)
    assert losses.dropped == lost and losses.events


def test_nothing_lost_exits_zero_and_says_so(sbusd: BusProcess, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    proc = start_record(sbusd.address, out)
    with Client(sbusd.address, timeout=WAIT) as pub:
        for i in range(500):
            pub.publish(f"calm/{i}", b"y")
        pub.whoami()  # all 500 routed before the recorder unsubscribes
    status, err = stop_record(proc)
    assert status == 0, err
    assert "recorded 500 messages" in err and "nothing lost" in err


def test_kill_9_loses_at_most_the_last_second(sbusd: BusProcess, tmp_path: Path) -> None:
    """Defaults only: rows older than a second survive a kill -9; the next run recovers them."""
    out = tmp_path / "cap"
    proc = start_record(sbusd.address, out)
    sent_at: list[float] = []
    try:
        with Client(sbusd.address, timeout=WAIT) as pub:
            end = time.monotonic() + 4.0
            i = 0
            while time.monotonic() < end:
                for _ in range(100):
                    pub.publish(f"steady/{i % 10}", b"%d" % i)
                    i += 1
                sent_at.append(time.monotonic())
                time.sleep(0.01)
        killed_at = time.monotonic()
        proc.kill()
        proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert capture_files([str(out)]) == []  # nothing rotated: all of it is in the journal
    # The next run says what it found, in one line, and recovers it.
    again = subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "record", "-a", sbusd.address, "--out", str(out),
         "--duration", "0.2", "-q"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT * 2,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    notes = [x for x in again.stderr.decode().splitlines() if "recovered" in x]
    assert len(notes) == 1, again.stderr
    rows = read_rows(out)
    safe = 100 * sum(1 for t in sent_at if t <= killed_at - 1.0)
    assert len(rows) >= safe, f"{len(rows)} rows survived; {safe} were sent over 1 s before"
    assert [int(r["payload"]) for r in rows] == list(range(len(rows)))  # type: ignore[call-overload]


def fake_bus(path: str, messages: int, stop: threading.Event) -> None:
    """A bus that, like the reference sbusd, ignores control messages it does not know."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as srv:
        srv.bind(path)
        srv.listen(1)
        srv.settimeout(WAIT)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(0.1)
            while not stop.is_set():
                try:
                    packet = conn.recv(1000)
                except TimeoutError:
                    continue
                if not packet:
                    return
                if packet == b"CMSG !/cred/whoami":
                    for i in range(messages):
                        conn.send(b"MSG k/%d\0p" % i)
                    messages = 0
                    conn.send(b"CMSG !/cred/whoami\0!/cred/1/2/3")


def test_a_bus_without_the_drop_query_makes_loss_unknown(short_tmp: Path, tmp_path: Path) -> None:
    address = str(short_tmp / "fake")
    stop = threading.Event()
    bus = threading.Thread(target=fake_bus, args=(address, 7, stop))
    bus.start()
    try:
        wait_for(lambda: os.path.exists(address), "the fake bus")
        out = tmp_path / "cap"
        proc = start_record(address, out)
        assert proc.stderr is not None
        note = proc.stderr.readline().decode()  # said once, right after "recording"
        status, err = stop_record(proc)
    finally:
        stop.set()
        bus.join(WAIT)
    assert status == 0, err
    assert "does not answer the drop query (CMSG drops/count)" in note
    assert "drops/count" not in err, err
    assert "recorded 7 messages" in err and "loss unknown" in err
    from sbus_relay.pipeline.capture import loss_files, read_losses

    assert not read_losses(loss_files([str(out)])).known
