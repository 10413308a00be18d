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
        out, instance="test-bus", rotate_bytes=1 << 20, row_group_rows=64
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
            # Secret keys never reach the default "" pattern (SPEC §3).
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
