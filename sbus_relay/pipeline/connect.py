"""A Spark Connect server from the installed pyspark: ``sbus-relay spark-server``.

What it owns: a Spark Connect server's process and settings.  What it may
touch: pyspark's spark-submit, the process it starts.

No download: pyspark's own ``jars/`` hold the Connect server
(``spark-connect_*.jar``), and its ``bin/spark-submit`` starts it in the
foreground (``--class org.apache.spark.sql.connect.service.SparkConnectServer``,
what ``sbin/start-connect-server.sh`` does as a daemon).  One long-lived JVM
then runs every ``analyze --remote`` (and ``--follow``): no JVM start per run,
and code the JIT has already compiled.

Settings (``server_conf``), on top of analyze's own (``session.BASE_CONF`` and
``DRIVER_CONF``: collector, crash report path, no web UI):

- the driver heap, ``--memory`` (default DEFAULT_MEMORY): every run's
  aggregates and every followed stream share it;
- cores and shuffle partitions: ``--master`` (default ``local[*]``), and for a
  local master ``spark.default.parallelism`` and ``spark.sql.shuffle.partitions``
  set to its cores (a client reads the first to size its partitions; each run
  still sets its own shuffle partitions from its input);
- the class archive (``classarchive``), when this install has built one: it was
  written by the same pyspark's ``spark-submit`` class path;
- Python workers (``foreachBatch`` of ``--follow``) on this interpreter, which
  has sbus_relay; Spark's log at WARN from the JVM's start (LOG_CONFIG); times
  in UTC; the gRPC port bound to
  ``--host`` (default 127.0.0.1: the server has no authentication unless
  $SPARK_CONNECT_AUTHENTICATE_TOKEN is set, so it is not offered to the network
  by default).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sbus_relay.ops import children

from . import classarchive, scratch
from .classarchive import spark_home
from .defaults import CONNECT_HOST, CONNECT_MEMORY, CONNECT_PORT
from .session import (
    BASE_CONF,
    DRIVER_CONF,
    DRIVER_OPTIONS,
    SESSION_TIME_ZONE,
    SparkFailed,
    SparkSettings,
    probe,
)

#: The Connect server's main class (what start-connect-server.sh submits).
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_HOST = CONNECT_HOST
DEFAULT_PORT = CONNECT_PORT
DEFAULT_MEMORY = CONNECT_MEMORY
#: Spark's own log level on the server (its INFO lines are several per job).
LOG_LEVEL = "WARN"
#: The server JVM's log4j2 configuration, at LOG_LEVEL from its first line:
#: ``spark.log.level`` alone takes effect only once the session is up, after
#: a screenful of INFO lines.
LOG_CONFIG = Path(__file__).with_name("log4j2-server.properties")
#: Seconds the server may take to start listening (about 15 s on an idle machine).
START_TIMEOUT = 180.0
#: Seconds it gets to stop after SIGTERM before it is killed.
STOP_TIMEOUT = 30.0
#: Seconds between looks at whether it listens yet.
READY_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class ServerOptions:
    """Where the server listens and the Spark it runs."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    settings: SparkSettings = field(default_factory=SparkSettings)

    @property
    def reach(self) -> str:
        """The host clients reach the server on (a wildcard address: loopback)."""
        return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)

    @property
    def url(self) -> str:
        """The URL clients give to --remote."""
        host = f"[{self.reach}]" if ":" in self.reach else self.reach
        return f"sc://{host}:{self.port}"


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port free on ``host`` now (for a server started right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def local_cores(master: str) -> int | None:
    """The cores of a ``local``, ``local[N]`` or ``local[*]`` master; None for others."""
    if master == "local":
        return 1
    inside = master[len("local[") : -1] if master.startswith("local[") else ""
    if inside == "*":
        return os.cpu_count() or 1
    return int(inside) if inside.isdigit() and int(inside) > 0 else None


def server_conf(opts: ServerOptions, tmp: Path | None = None) -> dict[str, str]:
    """Every setting the server starts with (see the module docstring), --conf
    last; with ``tmp``, its temporary files there (``scratch``: the JVM options
    first, those of --conf after them)."""
    settings = opts.settings
    master = settings.master or "local[*]"
    conf = {
        **BASE_CONF,
        **DRIVER_CONF,
        **SESSION_TIME_ZONE,
        "spark.master": master,
        "spark.driver.memory": settings.memory or DEFAULT_MEMORY,
        "spark.connect.grpc.binding.address": opts.host,
        "spark.connect.grpc.binding.port": str(opts.port),
        "spark.log.level": LOG_LEVEL,
        "spark.pyspark.python": sys.executable,
    }
    cores = local_cores(master)
    if cores is not None:
        conf["spark.default.parallelism"] = str(cores)
        conf["spark.sql.shuffle.partitions"] = str(cores)
    conf[DRIVER_OPTIONS] += f" -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    archive = classarchive.java_option()
    if archive is not None and DRIVER_OPTIONS not in settings.conf:
        conf[DRIVER_OPTIONS] = f"{conf[DRIVER_OPTIONS]} {archive}"
    if tmp is None:
        return {**conf, **settings.conf}
    ours = f"{scratch.java_options(tmp)} {conf[DRIVER_OPTIONS]}"
    conf.update(scratch.spark_conf(tmp))
    conf = {**conf, **settings.conf}
    conf[DRIVER_OPTIONS] = " ".join(o for o in (ours, settings.conf.get(DRIVER_OPTIONS)) if o)
    return conf


def command(opts: ServerOptions, tmp: Path | None = None) -> list[str]:
    """The server's command line: pyspark's spark-submit with our settings."""
    argv = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    argv += ["--name", "sbus-relay Spark Connect server"]
    for key, value in server_conf(opts, tmp).items():
        argv += ["--conf", f"{key}={value}"]
    return argv


def environment() -> dict[str, str]:
    """The server's environment: pyspark's directory as SPARK_HOME, workers on this Python."""
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_CONNECT_MODE": "0",
    }


def start(
    opts: ServerOptions, log: str | None = None, tmp: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start the server in a session of its own, its output appended to ``log``
    (without one: stderr stays ours), its temporary files in ``tmp`` (made by
    ``scratch``, removed by the caller once the server is stopped); SparkFailed
    if the port is taken."""
    if (
        probe(opts.host if opts.host not in ("0.0.0.0", "::", "") else "127.0.0.1", opts.port)
        is None
    ):
        raise SparkFailed(
            f"something already listens on {opts.host}:{opts.port} (a Spark Connect server "
            f"running? analyze --remote {opts.url} uses it); give another --port"
        )
    # Its own session: a Ctrl-C reaches the caller, which stops it in turn.
    return children.spawn(
        command(opts, tmp),
        log=log,
        stdout="null" if log is None else "log",
        new_session=True,
        env=environment(),
    )


def wait_ready(proc: subprocess.Popen[bytes], opts: ServerOptions, where: str) -> None:
    """Return once the server accepts connections; SparkFailed if it exits or
    takes longer than START_TIMEOUT (``where`` says where its log is)."""
    deadline = time.monotonic() + START_TIMEOUT
    while probe(opts.reach, opts.port) is not None:
        if proc.poll() is not None:
            ended = children.how_it_ended(proc.returncode)
            raise SparkFailed(f"the Spark Connect server {ended}; {where}")
        if time.monotonic() > deadline:
            stop(proc)
            raise SparkFailed(f"the Spark Connect server did not start in {START_TIMEOUT:g} s")
        time.sleep(READY_POLL_SECONDS)


def stop(proc: subprocess.Popen[bytes]) -> int:
    """Stop the server (its whole process group); its exit status."""
    children.stop(proc, STOP_TIMEOUT, group=True)
    return proc.returncode


@contextmanager
def connect_server(opts: ServerOptions, log_path: str) -> Iterator[subprocess.Popen[bytes]]:
    """A running server for the block (tests and the benchmark); stopped after,
    its temporary files removed."""
    with scratch.directory() as tmp:
        proc = start(opts, log_path, tmp)
        try:
            wait_ready(proc, opts, f"see {log_path}")
            yield proc
        finally:
            stop(proc)
