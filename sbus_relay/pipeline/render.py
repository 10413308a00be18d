"""A report's charts and page drawn at the same time, in warm worker processes.

What it owns: the warm drawing processes and the parts they draw.  What it may
touch: those processes, the report's files.

``--follow`` rewrites the whole report after every capture file, and drawing
it (matplotlib's PNGs, plotly's page) is most of an update's CPU.  A
``Renderer`` keeps RENDER_WORKERS processes that have imported matplotlib and
plotly, and drawn a first figure, once; each update hands them the report's
parts (``report.draw_part``: the same code a batch run draws with in its own
process, so the files are the same), one part per idle worker until all are
drawn.

The workers are new interpreters (``python -m sbus_relay.pipeline.render``),
not forks (the driver holds Spark's gRPC and JVM threads), with a socket to the
driver as their standard input; they run in a process group of their own and
ignore Ctrl-C (the driver stops them), and end when that socket closes: the
driver ended, even by ``kill -9``.  A worker that dies is
replaced, and its part drawn by the driver itself; an update that is
interrupted stops the workers still drawing, so nothing is written into its
directory afterwards.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection, wait
from pathlib import Path

from .analyze import AnalysisResult

#: Processes drawing a report: its largest parts (two time series and the page)
#: each in one, the smaller charts spread over whichever is free first.  More
#: than the two cores of a small machine: a shared one gives each runnable
#: process its share.
RENDER_WORKERS = 3
#: Seconds a worker gets to end once its pipe is closed, before it is killed.
STOP_SECONDS = 5.0


def serve(conn: Connection) -> None:
    """A worker: draw the parts the driver sends until its socket closes."""
    from . import report

    report.warm_up()
    while True:
        try:
            result, out, part = conn.recv()
        except (EOFError, OSError):
            return
        try:
            report.draw_part(result, Path(out), part)
            reply: BaseException | None = None
        except Exception as exc:
            reply = exc
        try:
            conn.send(reply)
        except (OSError, ValueError):  # the driver has gone
            return
        except (pickle.PicklingError, TypeError, AttributeError):
            # an exception that does not pickle: its words do
            conn.send(RuntimeError(f"drawing {part}: {reply!r}"))


class Renderer:
    """RENDER_WORKERS warm worker processes drawing reports' parts (``PartDrawer``)."""

    def __init__(self, workers: int = RENDER_WORKERS) -> None:
        self._workers: list[tuple[subprocess.Popen[bytes], Connection] | None] = [None] * workers
        for i in range(workers):
            self._workers[i] = self._start()

    def _start(self) -> tuple[subprocess.Popen[bytes], Connection]:
        mine, theirs = socket.socketpair()
        with theirs:
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=theirs.fileno(), process_group=0
            )
        return proc, Connection(mine.detach())

    def draw(self, result: AnalysisResult, out: Path, parts: list[str]) -> None:
        """Draw ``parts`` of the report into ``out``, at the same time; the first
        failure is raised once every part is done."""
        from . import report

        todo = list(parts)
        busy: dict[Connection, tuple[int, str]] = {}
        failures: list[BaseException] = []

        def give(i: int) -> None:
            worker = self._workers[i]
            if worker is None:
                worker = self._workers[i] = self._start()
            part = todo.pop(0)
            try:
                worker[1].send((result, str(out), part))
            except (OSError, ValueError):  # it died since: the driver draws it
                self._drop(i)
                report.draw_part(result, out, part)
                return
            busy[worker[1]] = (i, part)

        try:
            for i in range(len(self._workers)):
                if todo:
                    give(i)
            while busy:
                for conn in wait(list(busy)):
                    assert isinstance(conn, Connection)
                    i, part = busy.pop(conn)
                    try:
                        reply = conn.recv()
                    except (EOFError, OSError):  # it died: the driver draws its part
                        self._drop(i)
                        report.draw_part(result, out, part)
                        reply = None
                    if reply is not None:
                        failures.append(reply)
                    if todo:
                        give(i)
        except BaseException:
            # Interrupted: the parts being drawn are stopped, not written later.
            for i, _ in list(busy.values()):
                self._drop(i, kill=True)
            raise
        if failures:
            raise failures[0]

    def _drop(self, i: int, kill: bool = False) -> None:
        """End worker ``i`` (killed when ``kill``); a new one is started when needed."""
        worker, self._workers[i] = self._workers[i], None
        if worker is None:
            return
        proc, conn = worker
        conn.close()
        if kill:
            proc.kill()
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """End every worker: their pipes closed at once, then each waited for."""
        for worker in self._workers:
            if worker is not None:
                with contextlib.suppress(OSError):
                    worker[1].close()
        for i in range(len(self._workers)):
            self._drop(i)

    def __enter__(self) -> Renderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's, which stops us
    serve(Connection(0))
