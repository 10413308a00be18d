"""``analyze --follow`` as a test drives it: a process, capture files that appear
whole (renamed into place, as ``record`` closes them), and its report read back."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType

from sbus_relay.bench.synth import generate
from tests.support import VENV_BIN

#: Seconds a followed report may take to show a new file (a JVM start included).
SHOW_TIMEOUT = 150.0
#: Seconds --follow may take to stop after Ctrl-C.
STOP_TIMEOUT = 60.0


def add_capture(directory: Path, name: str, rows: int, seed: int) -> Path:
    """A capture file of ``rows`` synthetic messages, renamed into ``directory``."""
    work = directory.parent / f".{name}.work"
    (files,) = [generate(work, rows, seconds=600.0, seed=seed, keys_per_family=20)]
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.parquet"
    os.rename(files[0], target)
    shutil.rmtree(work)
    return target


def files_in_report(out: Path) -> int:
    """The capture files the report in ``out`` covers (-1 before the first)."""
    try:
        return int(json.loads((out / "summary.json").read_text())["inputs"]["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


class Follower:
    """``sbus-relay analyze CAP --out OUT --follow ARGS...`` in its own process group."""

    def __init__(self, cap: Path, out: Path, *args: str) -> None:
        self.argv = [os.path.join(VENV_BIN, "sbus-relay"), "analyze", str(cap), "--out",
                     str(out), "--follow", "--trigger", "0.5", *args]  # fmt: skip
        self.out = out
        self.lines: list[str] = []
        self.err = out.parent / f"{out.name}.follow-{time.monotonic_ns()}.err"
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Follower:
        env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                text=True, start_new_session=True, env=env,
            )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_for_files(self, n: int) -> None:
        """Until the report covers ``n`` capture files."""
        assert self.proc is not None
        deadline = time.monotonic() + SHOW_TIMEOUT
        while files_in_report(self.out) != n:
            assert self.proc.poll() is None, (self.lines, self.stderr())
            assert time.monotonic() < deadline, (n, self.lines, self.stderr())
            time.sleep(0.1)

    def stop(self) -> list[str]:
        """Ctrl-C, as from a terminal: exit status 0 and a line saying where it stopped."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)
        assert self.proc.wait(STOP_TIMEOUT) == 0, (self.lines, self.stderr())
        assert "stopped; " in self.stderr(), self.stderr()
        return self.lines

    def kill(self) -> None:
        """kill -9 of the command and its JVM, as a crash of the machine would end them."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        # what a crash leaves behind, and only a crash: the JVM's log, in the checkpoint

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
