"""analyze on a Spark Connect server (``sbus-relay spark-server``, started by the
shipped systemd unit's command in conftest): byte-identical tables to a local
run, through --remote and $SPARK_REMOTE, batch and --follow; and a Spark that is
not there is one line at once, not minutes of retries."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sbus_relay.bench.synth import generate
from sbus_relay.pipeline.analyze import TABLES
from tests.support import VENV_BIN, free_port

from .conftest import SPARK_SERVICE, SPARK_TEST_TIMEOUT, ConnectServer
from .follower import Follower, add_capture

pytestmark = [pytest.mark.spark, pytest.mark.timeout(SPARK_TEST_TIMEOUT)]

#: Rows of the test capture: every kind of task, a second or two of work.
ROWS = 40_000
#: Seconds a refusal may take: a probe (3 s) and Python's start, with room for
#: a loaded machine; far below the minute Spark's own retries take.
REFUSAL_TIMEOUT = 45


def analyze(
    *args: str, env: dict[str, str] | None = None, timeout: float = SPARK_TEST_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "analyze", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        env=env if env is not None else {k: v for k, v in os.environ.items()
                                          if k != "SPARK_REMOTE"},
    )  # fmt: skip


def output(out: Path) -> dict[str, bytes]:
    """Every table's Parquet file and summary.json, as bytes."""
    files = {name: (out / name / "part-00000.parquet").read_bytes() for name in TABLES}
    files["summary.json"] = (out / "summary.json").read_bytes()
    return files


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("connect-captures") / "cap"
    generate(directory, ROWS, seconds=3600.0)
    return directory


def test_remote_tables_are_byte_identical_to_a_local_run(
    connect_server: ConnectServer, captures: Path, tmp_path: Path
) -> None:
    local = analyze(str(captures), "--out", str(tmp_path / "local"), "--no-report")
    assert local.returncode == 0, local.stderr
    remote = analyze(
        str(captures), "--out", str(tmp_path / "remote"), "--remote", connect_server.url
    )
    assert remote.returncode == 0, remote.stderr
    assert "(connected " in remote.stdout.splitlines()[-1], remote.stdout
    assert (tmp_path / "remote" / "report.html").is_file()
    env = {**os.environ, "SPARK_REMOTE": connect_server.url}
    from_env = analyze(str(captures), "--out", str(tmp_path / "env"), "--no-report", env=env)
    assert from_env.returncode == 0, from_env.stderr
    assert "(connected " in from_env.stdout, from_env.stdout
    expected = output(tmp_path / "local")
    assert output(tmp_path / "remote") == expected
    assert output(tmp_path / "env") == expected
    # --master beats $SPARK_REMOTE: a local run, not the server.
    forced = analyze(
        str(captures), "--out", str(tmp_path / "forced"), "--no-report", "--master", "local[1]",
        env=env,
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert "(Spark start " in forced.stdout, forced.stdout
    assert output(tmp_path / "forced") == expected


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_spark_that_is_not_there_is_one_line_at_once(captures: Path, tmp_path: Path) -> None:
    port = free_port()
    for option, url, says in (
        ("--remote", f"sc://127.0.0.1:{port}", "cannot reach the Spark Connect server"),
        ("--master", f"spark://127.0.0.1:{port}", "cannot reach the Spark master"),
    ):
        result = analyze(
            str(captures), "--out", str(tmp_path / "out"), option, url, timeout=REFUSAL_TIMEOUT
        )
        assert result.returncode == 1, result
        line = one_line(result)
        assert says in line and url in line, line
        assert "--skip-bad-files" not in line
        assert not (tmp_path / "out").exists()
    empty = analyze(
        str(captures), "--out", str(tmp_path / "out"),
        env={**os.environ, "SPARK_REMOTE": ""}, timeout=REFUSAL_TIMEOUT,
    )  # fmt: skip
    assert empty.returncode == 2
    assert "SPARK_REMOTE is set but empty" in one_line(empty)
    wrong = analyze(
        str(captures), "--out", str(tmp_path / "out"), "--remote", "http://127.0.0.1:1",
        timeout=REFUSAL_TIMEOUT,
    )  # fmt: skip
    assert wrong.returncode == 2
    assert "not a Spark Connect URL" in one_line(wrong)


@pytest.mark.timeout(60)
def test_spark_server_refuses_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [os.path.join(VENV_BIN, "sbus-relay"), "spark-server", "--port", str(port)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=50,
        )  # fmt: skip
    assert result.returncode == 1
    assert f"something already listens on 127.0.0.1:{port}" in one_line(result)


def test_follow_on_the_connect_server_equals_a_batch_run(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    cap = tmp_path / "cap"
    add_capture(cap, "first", 20_000, seed=1)
    out = tmp_path / "report"
    with Follower(cap, out, "--remote", connect_server.url) as follower:
        follower.wait_for_files(1)
        add_capture(cap, "second", 30_000, seed=2)
        follower.wait_for_files(2)
        lines = follower.stop()
    assert any(line.startswith("batch ") for line in lines), lines
    batch = analyze(str(cap), "--out", str(tmp_path / "batch"), "--remote", connect_server.url)
    assert batch.returncode == 0, batch.stderr
    assert output(out) == output(tmp_path / "batch")


#: A Spark Connect client that prints the server's settings as JSON.
READ_SETTINGS = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print(json.dumps({k: spark.conf.get(k) for k in sys.argv[2:]}))
"""
#: The settings the Connect server is started with (``connect.server_conf``).
SERVER_SETTINGS = (
    "spark.driver.memory",
    "spark.sql.shuffle.partitions",
    "spark.default.parallelism",
    "spark.driver.extraJavaOptions",
    "spark.pyspark.python",
)


def jvm_argv(server: ConnectServer) -> list[str]:
    """The command line of the server's JVM (the spark-server command's child)."""
    pid = server.proc.pid
    (child,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0")


def test_the_server_runs_with_the_unit_s_memory_cores_python_and_class_archive(
    connect_server: ConnectServer,
) -> None:
    from tests.deploy.shipped import load

    unit = shlex.split(load(SPARK_SERVICE).value("Service", "ExecStart"))
    memory = unit[unit.index("--memory") + 1]
    result = subprocess.run(
        [sys.executable, "-P", "-c", READ_SETTINGS, connect_server.url, *SERVER_SETTINGS],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    conf = json.loads(result.stdout.splitlines()[-1])
    cores = str(os.cpu_count())
    assert conf["spark.driver.memory"] == memory
    assert conf["spark.sql.shuffle.partitions"] == conf["spark.default.parallelism"] == cores
    assert os.path.dirname(conf["spark.pyspark.python"]) == VENV_BIN
    argv = jvm_argv(connect_server)
    assert f"-Xmx{memory}" in argv, argv
    options = conf["spark.driver.extraJavaOptions"].split()
    assert "-XX:+UseParallelGC" in options and "-XX:+UseParallelGC" in argv
    # The class archive, when this install had one at the server's start, is
    # mapped by its JVM; one being written is never handed to the server.
    archives = [o for o in options if o.startswith("-XX:SharedArchiveFile=")]
    assert not any(o.startswith("-XX:ArchiveClassesAtExit=") for o in options), options
    for option in archives:
        assert option in argv and Path(option.partition("=")[2]).is_file(), argv


def test_the_server_settings_take_the_class_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    from sbus_relay.pipeline import classarchive, connect
    from sbus_relay.pipeline.session import DRIVER_OPTIONS, SparkSettings

    archive = "-XX:SharedArchiveFile=/var/cache/spark.jsa -Xlog:cds*=error"
    monkeypatch.setattr(classarchive, "java_option", lambda: archive)
    opts = connect.ServerOptions(settings=SparkSettings(master="local[3]", memory="2g"))
    conf = connect.server_conf(opts)
    assert conf[DRIVER_OPTIONS].endswith(f" {archive}")
    assert conf["spark.driver.memory"] == "2g" and conf["spark.master"] == "local[3]"
    assert conf["spark.sql.shuffle.partitions"] == conf["spark.default.parallelism"] == "3"
    given = SparkSettings(conf={DRIVER_OPTIONS: "-Dmine=1"})  # --conf wins over the archive
    assert connect.server_conf(connect.ServerOptions(settings=given))[DRIVER_OPTIONS] == "-Dmine=1"


#: A line of Spark's log4j2 layout at INFO (``26/11/27 07:00:00 INFO SparkContext: ...``).
INFO_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ", re.M)


def test_the_server_logs_no_info_line_even_while_it_starts(
    connect_server: ConnectServer,
) -> None:
    text = connect_server.log.read_text(errors="replace")
    found = INFO_LINE.findall(text)
    assert not found, text[:2000]


#: Releases the Connect session whose id is given, as the server does to one idle too long.
RELEASE_SESSION = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(f"{sys.argv[1]}/;session_id={sys.argv[2]}").create()
spark.range(1).collect()
spark.stop()  # releases the session: the server closes it
"""


def test_runs_share_one_session_which_a_new_one_replaces_once_closed(
    connect_server: ConnectServer, captures: Path, tmp_path: Path
) -> None:
    """Two runs on one server share a session (its id kept in the cache
    directory), a run given --conf gets one of its own, and a run after the
    server closed the shared session opens a new one: the same tables each time."""
    from sbus_relay.pipeline.session import SESSIONS_DIR

    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    env["XDG_CACHE_HOME"] = str(cache)
    sessions = cache / "sbus-relay" / SESSIONS_DIR

    def run(name: str, *more: str) -> dict[str, bytes]:
        done = analyze(str(captures), "--out", str(tmp_path / name), "--no-report",
                       "--remote", connect_server.url, *more, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return output(tmp_path / name)

    first = run("first")
    (kept,) = sessions.iterdir()
    shared = kept.read_text().strip()
    assert run("second") == first and kept.read_text().strip() == shared
    assert run("own", "--conf", "spark.sql.shuffle.partitions=3") == first
    assert kept.read_text().strip() == shared  # --conf: a session of its own
    released = subprocess.run(
        [sys.executable, "-P", "-c", RELEASE_SESSION, connect_server.url, shared],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert released.returncode == 0, released.stderr
    assert run("after") == first
    assert kept.read_text().strip() != shared
