"""The log writer from any thread (``ops.logsetup``): lines written from two
threads at once, and from gevent's hub while another thread logs, are each
written whole or dropped and counted -- never an error in the caller, never
a line lost uncounted.  (One ``select.poll`` shared by threads made CPython
raise ``RuntimeError('concurrent poll() invocation')`` into the caller.)"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import structlog

from sbus_relay.ops import logsetup

pytestmark = pytest.mark.timeout(120)

#: Seconds each writer writes as fast as it can.
HARD_SECONDS = 1.5
LINE = "x" * 200


class PipeReader:
    """Reads a pipe in a thread of its own and counts the lines that arrive."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.lines = 0
        self.broken: list[bytes] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rest = b""
        while chunk := os.read(self.read_fd, 65536):
            rest += chunk
            *whole, rest = rest.split(b"\n")
            self.lines += len(whole)
            self.broken += [w[:40] for w in whole if not w.endswith(b"}") and w != LINE.encode()]

    def close(self) -> None:
        os.close(self.write_fd)
        self._thread.join(30)
        os.close(self.read_fd)


@pytest.fixture
def reader() -> Iterator[PipeReader]:
    r = PipeReader()
    yield r
    r.close()


def hammer(write: Callable[[], None], seconds: float, errors: list[BaseException]) -> int:
    """Call ``write`` for ``seconds``; how many times.  What it raises is kept."""
    n = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            write()
            n += 1
    except BaseException as e:  # the test's point: nothing may escape
        errors.append(e)
    return n


def test_every_line_is_written_or_counted(reader: PipeReader) -> None:
    writer = logsetup.LineWriter(reader.write_fd)
    before = logsetup.dropped_lines()
    errors: list[BaseException] = []
    counts = [0, 0]

    def run(i: int) -> None:
        counts[i] = hammer(lambda: writer.write_line(LINE), HARD_SECONDS, errors)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    os.close(reader.write_fd)
    reader._thread.join(30)
    reader.write_fd = os.open(os.devnull, os.O_WRONLY)  # (closed by the fixture)
    assert errors == []
    assert reader.broken == []  # whole lines only, never two interleaved
    dropped = logsetup.dropped_lines() - before
    assert reader.lines + dropped == sum(counts)


def test_the_hub_logs_while_another_thread_does(reader: PipeReader) -> None:
    """structlog from greenlets on gevent's hub and from a plain thread, to one
    descriptor: every event is a whole line or a counted drop, and the hub's
    loggers never raise."""
    import gevent

    # a file target: the writer owns a descriptor of its own onto the pipe
    logsetup.configure("info", "json", target=f"/proc/self/fd/{reader.write_fd}")
    try:
        before = logsetup.dropped_lines()
        errors: list[BaseException] = []
        log = structlog.get_logger("test")
        counts: dict[str, int] = {}

        def in_thread() -> None:
            counts["thread"] = hammer(lambda: log.info("from.thread", pad=LINE), 2.0, errors)

        def on_hub(i: int) -> None:
            n = 0
            end = time.monotonic() + 1.5
            try:
                while time.monotonic() < end:
                    log.info("from.hub", greenlet=i, pad=LINE)
                    n += 1
                    if n % 100 == 0:
                        gevent.sleep(0)  # the other greenlets' turn
            except BaseException as e:
                errors.append(e)
            counts[f"hub{i}"] = n

        thread = threading.Thread(target=in_thread)
        thread.start()
        gevent.joinall([gevent.spawn(on_hub, i) for i in range(3)], timeout=60)
        thread.join(60)
        assert errors == []
        assert counts["thread"] > 100 and counts["hub0"] > 100
        logsetup.configure("info", "json", target=os.devnull)  # lets go of the pipe
        logsetup.configure("info", "json", target=os.devnull)  # (closed one reload later)
        os.close(reader.write_fd)
        reader._thread.join(30)
        reader.write_fd = os.open(os.devnull, os.O_WRONLY)
        assert reader.broken == []
        dropped = logsetup.dropped_lines() - before
        assert reader.lines + dropped == sum(counts.values())
    finally:
        logsetup.configure("info", "json", target=os.devnull)
