"""Resident memory of benchmark processes: peaks sampled from /proc, and an
idle relay's floor (what the libraries it imports cost in a fresh interpreter).

What it owns: how resident memory is sampled and an idle relay's floor
measured.  What it may touch: /proc, the interpreters it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping

#: Seconds between memory samples.
SAMPLE_SECONDS = 0.2


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rss_mib(pid: int) -> tuple[float, bool]:
    """(resident MiB, is a JVM) of one process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(x.split()[1]) for x in f if x.startswith("VmRSS:")), 0)
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, StopIteration):
        return 0.0, False
    return rss / 1024, os.path.basename(exe) == "java"


def _tree(root: int, kids: dict[int, list[int]]) -> list[int]:
    todo, found = [root], []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(kids.get(pid, []))
    return found


class Sampler:
    """Peak RSS of a command's process tree (its JVMs apart from the rest), of
    the executors under a cluster worker (the worker's descendants, not itself),
    and of a server's process tree (a Connect server's JVM, counted as the
    driver's: it is the driver of the runs it serves)."""

    def __init__(self, root: int, worker: int | None = None, server: int | None = None) -> None:
        self.root = root
        self.worker = worker
        self.server = server
        self.driver_jvm = self.executor_jvm = self.other = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            kids = _children()
            jvm = other = executors = 0.0
            roots = [self.root] + ([self.server] if self.server is not None else [])
            for pid in (p for r in roots for p in _tree(r, kids)):
                mib, is_jvm = _rss_mib(pid)
                if is_jvm:
                    jvm += mib
                else:
                    other += mib
            if self.worker is not None:
                for pid in _tree(self.worker, kids)[1:]:
                    mib, is_jvm = _rss_mib(pid)
                    executors += mib if is_jvm else 0.0
            self.driver_jvm = max(self.driver_jvm, jvm)
            self.other = max(self.other, other)
            self.executor_jvm = max(self.executor_jvm, executors)


#: An idle relay's floor: a fresh interpreter, then with each library a relay
#: cannot run without, one on top of the other, then with the whole server.
FLOOR = (
    ("python", ""),
    ("+ gevent", "import gevent"),
    ("+ gevent + structlog", "import gevent, structlog"),
    ("+ the whole server (sbus_relay.bus.server)", "import sbus_relay.bus.server"),
)
#: Libraries a relay imports only when asked to, each alone over python.
ON_DEMAND = (
    ("yaml (with a config file)", "import yaml"),
    ("prometheus_client (with --metrics)", "import prometheus_client"),
)
#: Seconds a fresh interpreter gets to import and report.
IMPORT_TIMEOUT = 60.0
_RSS_OF_SELF = (
    "\nfor line in open('/proc/self/status'):\n"
    "    if line.startswith('VmRSS:'): print(int(line.split()[1]) * 1024)"
)


def import_rss(code: str, env: Mapping[str, str]) -> int:
    """The RSS in bytes of a fresh interpreter after ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", code + _RSS_OF_SELF],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT,
        check=True,
    )
    return int(out.stdout.split()[-1])


def import_floor(env: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """``{"floor": {step: RSS}, "on_demand": {library: RSS over python}}``."""
    floor = {name: import_rss(code, env) for name, code in FLOOR}
    python = floor["python"]
    extra = {name: import_rss(code, env) - python for name, code in ON_DEMAND}
    return {"floor": floor, "on_demand": extra}
