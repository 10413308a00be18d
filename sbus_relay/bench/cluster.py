"""A standalone Spark cluster (one master, one worker) from the installed pyspark.

What it owns: a standalone Spark master and worker, their ports and logs.
What it may touch: java, pyspark's jars, the processes it starts.

    with standalone_cluster(cores=2, memory="2g") as cluster:
        ... analyze --master cluster.url ...

No download: the master and worker are the JVM classes in pyspark's own ``jars/``
directory, started with ``java -cp "<pyspark>/jars/*"``; pyspark's directory is
the SPARK_HOME the worker builds executor commands from.  Both bind to
127.0.0.1 on free ports, log into ``work_dir``, and are stopped (the worker's
executors with them) when the block ends.  Used by the cluster test and the
benchmark; on a real cluster use Spark's own scripts.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sbus_relay.ops import children
from sbus_relay.pipeline import scratch
from sbus_relay.pipeline.classarchive import spark_home

#: Seconds the master and the worker get to start and register.
START_TIMEOUT = 90.0
#: Seconds each gets to stop after SIGTERM before it is killed.
STOP_TIMEOUT = 15.0
#: Scala version of pyspark 4's jars (scala-library-2.13.*.jar).
SCALA_VERSION = "2.13"
#: JVM heap of the master and worker daemons themselves (not the executors).
DAEMON_HEAP = "256m"


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the log to read."""


@dataclass
class Cluster:
    """A running standalone cluster."""

    url: str
    master: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]
    work_dir: Path

    @property
    def pids(self) -> list[int]:
        return [self.master.pid, self.worker.pid]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise ClusterError("no Java found (JAVA_HOME or java on PATH): Spark needs a JDK 17")
    return java


def _start(
    cls: str, args: list[str], log: Path, env: dict[str, str], tmp: Path
) -> subprocess.Popen[bytes]:
    cmd = [_java(), f"-Xmx{DAEMON_HEAP}", *scratch.java_options(tmp).split()]
    cmd += ["-cp", f"{spark_home() / 'jars'}/*", cls, *args]
    # Its own process group: stopped with its executors.
    return children.spawn(cmd, log=log, append=False, stdout="log", new_session=True, env=env)


def _wait_for(log: Path, needle: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while needle not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise ClusterError(f"{log.stem} {children.how_it_ended(proc.returncode)}; see {log}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{log.stem} not ready after {START_TIMEOUT:g} s; see {log}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    children.stop(proc, STOP_TIMEOUT, group=True)


@contextmanager
def standalone_cluster(
    cores: int = 2, memory: str = "2g", work_dir: str | os.PathLike[str] | None = None
) -> Iterator[Cluster]:
    """Start a master and a worker (``cores``, ``memory`` for executors); stop them after."""
    own_dir = work_dir is None
    wd = scratch.make() if work_dir is None else Path(work_dir)
    wd.mkdir(parents=True, exist_ok=True)
    tmp = wd / "tmp"  # the daemons' and executors' temporary files (``scratch``)
    tmp.mkdir(exist_ok=True)
    # SPARK_SCALA_VERSION: the worker's launcher looks for a build tree without it.
    env = dict(
        os.environ,
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_SCALA_VERSION=SCALA_VERSION,
        SPARK_LOCAL_DIRS=str(tmp),
    )
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _start(
        "org.apache.spark.deploy.master.Master",
        ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())],
        wd / "master.log",
        env,
        tmp,
    )
    worker: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(wd / "master.log", "I have been elected leader", master)
        worker = _start(
            "org.apache.spark.deploy.worker.Worker",
            [url, "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
             "--webui-port", str(_free_port()), "--work-dir", str(wd / "work")],
            wd / "worker.log",
            env,
            tmp,
        )  # fmt: skip
        _wait_for(wd / "worker.log", "Successfully registered with master", worker)
        yield Cluster(url, master, worker, wd)
    finally:
        if worker is not None:
            _stop(worker)
        _stop(master)
        if own_dir:
            shutil.rmtree(wd, ignore_errors=True)
