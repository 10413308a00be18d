"""The JVMs' temporary files: in a directory of each JVM's own, never in /tmp
behind the user's back, gone after the run, and after a killed run gone with
the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sbus_relay.pipeline import scratch
from tests.support import VENV_BIN

from .conftest import SPARK_TEST_TIMEOUT


def test_the_directory_is_in_tmpdir_else_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    made = scratch.make()
    assert made.parent == tmp_path / "tmp" and made.name.startswith(f"sbus-spark-{os.getpid()}-")
    options = scratch.java_options(made).split()
    assert f"-Djava.io.tmpdir={made}" in options and "-XX:-UsePerfData" in options
    assert scratch.spark_conf(made) == {"spark.local.dir": str(made)}
    scratch.remove(made)
    assert not made.exists()
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert scratch.root() == tmp_path / "cache" / "sbus-relay" / scratch.SCRATCH_DIR


def test_the_directories_of_gone_processes_are_swept(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"{scratch.PREFIX}{gone.pid}-abc"
    alive = tmp_path / f"{scratch.PREFIX}{os.getpid()}-def"
    other = tmp_path / "sbus-spark-notapid"
    for d in (dead, alive, other):
        (d / "blockmgr-x").mkdir(parents=True)
    scratch.sweep(tmp_path)
    assert not dead.exists() and alive.exists() and other.exists()


def jvm_of(pid: int) -> int | None:
    """The Java process analyze ``pid`` started, once it runs."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    for kid in map(int, kids):
        try:
            if os.path.basename(os.readlink(f"/proc/{kid}/exe")) == "java":
                return kid
        except OSError:
            continue
    return None


def gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
def test_a_killed_analyze_leaves_its_jvm_s_files_for_the_next_run_only(tmp_path: Path) -> None:
    """``kill -9`` of analyze while its JVM runs: the JVM (told so on its
    command line) kept its files in its own directory in $TMPDIR and ends with
    analyze; the next run, its own files gone after it, removes that one too."""
    from sbus_relay.bench.synth import generate

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    captures = tmp_path / "captures"
    generate(captures, 20_000, seconds=600.0)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    env["TMPDIR"] = str(tmp)
    argv = [os.path.join(VENV_BIN, "sbus-relay"), "analyze", str(captures), "--no-report"]
    proc = subprocess.Popen([*argv, "--out", str(tmp_path / "a")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + SPARK_TEST_TIMEOUT / 2
    java = None
    while java is None and time.monotonic() < deadline and proc.poll() is None:
        java = jvm_of(proc.pid)
        time.sleep(0.1)
    assert java is not None, "no JVM seen"
    options = Path(f"/proc/{java}/cmdline").read_bytes().decode().split("\0")
    assert f"-Djava.io.tmpdir={tmp}/{scratch.PREFIX}{proc.pid}-" in " ".join(options)
    assert scratch.NO_PERF_DATA in options
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert gone(java, 60), "the JVM outlived analyze"
    left = [p.name for p in tmp.iterdir()]
    assert left == [p for p in left if p.startswith(f"{scratch.PREFIX}{proc.pid}-")], left
    again = subprocess.run([*argv, "--out", str(tmp_path / "b")], env=env, capture_output=True,
                           text=True, timeout=SPARK_TEST_TIMEOUT / 2)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert list(tmp.iterdir()) == []
