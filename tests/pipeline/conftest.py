"""Shared fixtures of the pipeline tests: one SparkSession and one Spark Connect
server for the whole run.

Starting Spark costs 6 to 20 s, so every Spark test shares one session
(``local[2]``, UI off, 2 shuffle partitions, as in CI), and every test of
``--remote`` one Connect server, started by the shipped systemd unit's own
command (configs/deploy/sbus-spark.service) on a free port.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Seconds every Spark test may take: JVM start, plus a few small jobs.
SPARK_TEST_TIMEOUT = 300
#: The systemd unit whose command starts the tests' Connect server.
SPARK_SERVICE = "sbus-spark.service"
#: Seconds the Connect server may take to say it is ready.
SERVER_START_TIMEOUT = 240.0


def need_java() -> None:
    """Skip without a JDK on a workstation, but fail in CI (.ci/run sets CI), where
    a silently skipped Spark suite would be a test that cannot fail."""
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        if os.environ.get("CI"):
            pytest.fail("no Java found (JAVA_HOME or java on PATH): Spark needs OpenJDK 17")
        pytest.skip("no Java (JAVA_HOME or java on PATH) for Spark")


def server_argv(port: int, tmp: Path) -> list[str]:
    """The shipped unit's ExecStart, runnable here (this venv), on ``port``."""
    from tests.deploy.shipped import exec_argv, load

    argv = exec_argv(load(SPARK_SERVICE), tmp)
    assert argv[1] == "spark-server", argv
    argv[argv.index("--port") + 1] = str(port)
    return argv


@dataclass
class ConnectServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """The test run's one Spark Connect server (``sbus-relay spark-server``)."""
    pytest.importorskip("pyspark")
    need_java()
    from tests.support import free_port

    tmp = tmp_path_factory.mktemp("connect")
    log = tmp / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            server_argv(free_port(), tmp),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    assert proc.stdout is not None
    ready = select.select([proc.stdout], [], [], SERVER_START_TIMEOUT)[0]
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("Spark Connect server ready: sc://"):
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"no Connect server: {line!r}; {log.read_text()[-3000:]}")
    server = ConnectServer(line.split()[4], proc, log)
    yield server
    os.killpg(proc.pid, signal.SIGTERM)  # as systemd stops it
    try:
        status = proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert status == 0, log.read_text()[-3000:]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The test run's one SparkSession."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    need_java()

    from sbus_relay.pipeline import scratch

    # Python workers must be this interpreter (it has pyarrow and sbus_relay).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    tmp = scratch.make()  # the JVM's temporary files, in the run's own directory
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("sbus-relay-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", scratch.java_options(tmp))
    )
    for key, value in scratch.spark_conf(tmp).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    scratch.remove(tmp)
