"""The JVM class archive: built in the background, used by the next runs, never
a reason for a run to fail; and Ctrl-C during analyze."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sbus_relay.bench.synth import generate
from sbus_relay.pipeline import classarchive as C
from sbus_relay.pipeline.session import on_loopback as _on_loopback
from tests.support import VENV_BIN

from .conftest import SPARK_TEST_TIMEOUT

#: Seconds within which Ctrl-C is answered (a loaded machine may delay a signal handler).
SAID_AT_ONCE = 5.0
#: The slow test builds an archive (a Spark run that dumps ~180 MB), then runs twice.
ARCHIVE_TEST_TIMEOUT = 900


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory, with the archive switched on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(C.ENV_SWITCH, raising=False)
    return tmp_path / "cache" / "sbus-relay"


def test_loopback_masters_are_told_apart() -> None:
    assert _on_loopback("spark://127.0.0.1:7077")
    assert _on_loopback("spark://localhost:7077")
    assert _on_loopback("spark://[::1]:7077")
    assert not _on_loopback("spark://head:7077")
    assert not _on_loopback("spark://127.0.0.1:7077,10.0.0.2:7077")
    assert not _on_loopback("local[2]")
    assert not _on_loopback("yarn")


@pytest.mark.timeout(60)
def test_an_archive_is_used_only_whole_and_when_switched_on(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = C.archive_path()
    if path is None:
        pytest.skip("no java")
    assert path.parent == cache
    assert C.java_option() is None  # nothing built yet
    cache.mkdir(parents=True)
    path.write_bytes(b"x" * 1000)
    assert C.java_option() is None  # no size record: not known whole
    Path(f"{path}.size").write_text("999")
    assert C.java_option() is None  # cut
    Path(f"{path}.size").write_text("1000")
    option = C.java_option()
    assert option is not None and f"-XX:SharedArchiveFile={path}" in option
    monkeypatch.setenv(C.ENV_SWITCH, "0")
    assert C.java_option() is None
    assert not C.build_later()
    monkeypatch.setenv(C.ENV_SWITCH, f"{C.WRITE_MODE}/x/y.jsa")
    assert C.java_option() == f"-XX:ArchiveClassesAtExit=/x/y.jsa {C.QUIET}"


@pytest.mark.timeout(60)
def test_one_builder_at_a_time_and_a_dead_ones_lock_is_taken_over(cache: Path) -> None:
    path = C.archive_path()
    if path is None:
        pytest.skip("no java")
    cache.mkdir(parents=True)
    lock = path.with_suffix(C.LOCK_SUFFIX)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(str(holder.pid))
        assert not C.build_later()  # a live builder: nothing started
        assert not C._lock(lock)
    finally:
        holder.kill()
        holder.wait()
    assert C._lock(lock)  # its holder is gone
    assert lock.read_text() == str(os.getpid())


def _analyze(captures: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.path.join(VENV_BIN, "sbus-relay"), "analyze", str(captures), "--out", str(out),
         "--no-report"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SPARK_TEST_TIMEOUT,
        cwd=out.parent,
    )  # fmt: skip


def _java_args_seen(stop: threading.Event, seen: list[str]) -> None:
    """Collect the command lines of java processes until ``stop``."""
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                args = Path("/proc", pid, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args and args[0].endswith(b"java"):
                seen.append(b" ".join(args).decode(errors="replace"))
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(ARCHIVE_TEST_TIMEOUT)
def test_analyze_builds_the_archive_then_uses_it_and_survives_a_broken_one(
    cache: Path, tmp_path: Path
) -> None:
    path = C.archive_path()
    if path is None:
        pytest.skip("no java")
    captures = tmp_path / "captures"
    generate(captures, 5_000, seconds=600.0)

    # No archive: the run works as ever and leaves a builder behind it.
    first = _analyze(captures, tmp_path / "out1")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1].startswith("note: building a class archive"), first
    deadline = time.monotonic() + ARCHIVE_TEST_TIMEOUT / 2
    while not C.usable(path):
        assert time.monotonic() < deadline, (cache / C.LOG_NAME).read_text()[-2000:]
        time.sleep(1)
    assert not path.with_suffix(C.LOCK_SUFFIX).exists()
    assert not list(cache.glob("*.tmp"))

    # The next run's JVM maps it in.
    stop, seen = threading.Event(), []  # type: ignore[var-annotated]
    watcher = threading.Thread(target=_java_args_seen, args=(stop, seen), daemon=True)
    watcher.start()
    try:
        second = _analyze(captures, tmp_path / "out2")
    finally:
        stop.set()
        watcher.join()
    assert second.returncode == 0, second.stderr
    assert "note:" not in second.stdout
    assert any(f"-XX:SharedArchiveFile={path}" in args for args in seen), seen[:3]
    assert C.usable(path)

    # An archive the JVM cannot map (cut, with a size record to match) makes it
    # crash at start: the run starts again without it, quietly, and drops it.
    data = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(data[: len(data) // 50])
    Path(f"{path}.size").write_text(str(len(data) // 50))
    third = _analyze(captures, tmp_path / "out3")
    assert third.returncode == 0, third.stderr
    assert "#" not in third.stdout and not third.stderr.strip(), (third.stdout, third.stderr)
    assert not path.exists()
    assert not list(tmp_path.glob("hs_err*")), "a JVM crash report in the user's directory"
    # it went to the temporary directory (session.py's -XX:ErrorFile): removed here
    for report in Path(tempfile.gettempdir()).glob("sbus-analyze-jvm-crash-*.log"):
        report.unlink()


@pytest.mark.spark
@pytest.mark.timeout(SPARK_TEST_TIMEOUT)
@pytest.mark.parametrize("delay", [1.0, 7.0], ids=["starting", "running"])
def test_ctrl_c_stops_analyze_in_one_line_and_writes_nothing(tmp_path: Path, delay: float) -> None:
    captures = tmp_path / "captures"
    generate(captures, 3_000_000, seconds=3600.0)
    out = tmp_path / "out"
    tag = f"SBUS_TEST_RUN={uuid.uuid4().hex}"  # finds the run's processes by environment
    # --raw: a long run over raw rows, and no line about rolling the captures up first
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbus-relay"), "analyze", str(captures), "--out", str(out),
         "--raw"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, tag.split("=")[0]: tag.split("=")[1]},
        # As from a terminal: SIGINT as Python expects it, to the whole group.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    time.sleep(delay)
    assert proc.poll() is None, "finished before Ctrl-C: the capture is too small"
    os.killpg(proc.pid, signal.SIGINT)
    # Said at once, before the JVM is gone and the output cleaned up.
    assert proc.stderr is not None
    ready = select.select([proc.stderr], [], [], SAID_AT_ONCE)[0]
    first = os.read(proc.stderr.fileno(), 65536).decode() if ready else ""
    assert first.startswith("sbus-relay analyze: stopping (Ctrl-C)..."), first
    stdout, rest = proc.communicate(timeout=SPARK_TEST_TIMEOUT)
    stderr = first + rest
    assert proc.returncode == 130, (stdout, stderr)
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert lines == [
        "sbus-relay analyze: stopping (Ctrl-C)...",
        "sbus-relay analyze: interrupted; nothing written",
    ], stderr
    assert not Path(tempfile.gettempdir(), f"sbus-analyze-{proc.pid}.log").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captures"]  # no output, no staging
    # pyspark's JVM ignores SIGINT and exits when its stdin closes: none outlives the run.
    deadline = time.monotonic() + 30
    while left := _processes_with(tag):
        assert time.monotonic() < deadline, f"left running: {left}"
        time.sleep(0.2)


def _processes_with(tag: str) -> list[str]:
    """Command lines of the live processes whose environment holds ``tag``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if tag.encode() not in Path("/proc", pid, "environ").read_bytes().split(b"\0"):
                continue
            if Path("/proc", pid, "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, not yet reaped
            found.append(Path("/proc", pid, "cmdline").read_bytes().replace(b"\0", b" ")[:200])
        except OSError:
            continue
    return [c.decode(errors="replace") for c in found]


@pytest.mark.timeout(60)
def test_a_builder_pauses_while_an_analysis_runs(cache: Path, tmp_path: Path) -> None:
    """The builder's run is stopped while another analyze marks itself running, and
    goes on once that one is gone (even killed: its mark names a dead pid)."""
    ticks = tmp_path / "ticks"
    script = (
        "import time, pathlib\n"
        f"p = pathlib.Path({str(ticks)!r})\n"
        "for i in range(200):\n"
        "    p.write_text(str(i)); time.sleep(0.05)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    result: list[int | None] = []
    builder = threading.Thread(
        target=lambda: result.append(C._run_pausing([sys.executable, "-c", script], {})),
        daemon=True,
    )
    try:
        with C.running():  # this process, as analyze marks itself: not "another"
            assert (cache / C.RUNNING_DIR / str(os.getpid())).exists()
            assert not C.others_running()
        (cache / C.RUNNING_DIR).mkdir(parents=True, exist_ok=True)
        (cache / C.RUNNING_DIR / str(other.pid)).touch()  # another analysis runs
        builder.start()
        time.sleep(1.0)
        paused_at = ticks.read_text() if ticks.exists() else ""
        time.sleep(1.0)
        assert (ticks.read_text() if ticks.exists() else "") == paused_at, "it ran on"
    finally:
        other.kill()
        other.wait()
    builder.join(30)
    assert result == [0]
    assert ticks.read_text() == "199"
    assert not (cache / C.RUNNING_DIR / str(other.pid)).exists()  # a dead one's mark goes


@pytest.mark.timeout(60)
def test_each_install_keeps_its_own_archive(cache: Path, tmp_path: Path) -> None:
    """Two venvs on one machine: building one's archive removes only that install's
    older archives and those of installs that are gone, never the other's."""
    path = C.archive_path()
    if path is None:
        pytest.skip("no java")
    cache.mkdir(parents=True)
    other_install = tmp_path / "other-venv" / "pyspark" / "jars"
    other_install.mkdir(parents=True)

    def archive(name: str, source: str) -> Path:
        p = cache / f"{C.PREFIX}{name}{C.SUFFIX}"
        p.write_bytes(b"x" * 10)
        Path(f"{p}.size").write_text("10")
        Path(f"{p}.source").write_text(source)
        return p

    others = archive("other", str(other_install))
    gone = archive("gone", str(tmp_path / "removed-venv" / "jars"))
    older = archive("older", str(C._jars()))
    C._remove_stale(path)
    assert others.exists() and C.usable(others)
    assert not gone.exists() and not older.exists()
    assert not Path(f"{older}.source").exists()
    # At most MAX_ARCHIVES: the least recently used go.
    many = [archive(f"n{i}", str(other_install)) for i in range(C.MAX_ARCHIVES + 2)]
    for i, p in enumerate(many):
        os.utime(p, (1_000_000 + i, 1_000_000 + i))
    C._remove_stale(path)
    kept = sorted(cache.glob(f"{C.PREFIX}*{C.SUFFIX}"))
    assert len(kept) == C.MAX_ARCHIVES - 1  # room for the one being written
    assert many[-1] in kept and many[0] not in kept


@pytest.mark.timeout(60)
def test_what_spark_raises_after_a_ctrl_c_is_the_interrupt_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Ctrl-C while the JVM starts is held back; a job Spark then cuts off
    # raises its own error, which must end the run as the interrupt it is.
    from sbus_relay.pipeline import runner

    captures = tmp_path / "captures"
    generate(captures, 1_000, seconds=10.0)

    def start_cut_off(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # held back: the JVM is starting
        raise RuntimeError("Exception thrown in awaitResult")

    said: list[str] = []
    monkeypatch.setattr(runner, "start_spark", start_cut_off)
    request = runner.Request([str(captures)], str(tmp_path / "out"))
    with pytest.raises(KeyboardInterrupt):
        runner.analyze(request, said.append, lambda: said.append("stopping"))
    assert said.count("stopping") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(10)
def test_a_run_ends_as_the_interrupt_only_after_a_ctrl_c() -> None:
    from sbus_relay.pipeline.session import Interrupts

    class Ended:
        def __init__(self) -> None:
            self.how: list[str] = []

        def interrupt(self) -> None:
            self.how.append("interrupted")

        def stop(self) -> None:
            self.how.append("stopped")

    interrupts, session = Interrupts(lambda: None), Ended()
    with pytest.raises(RuntimeError, match="a real failure"):
        interrupts.end(RuntimeError("a real failure"), session)  # type: ignore[arg-type]
    assert session.how == ["stopped"]
    interrupts.seen = 1  # Ctrl-C
    session = Ended()
    with pytest.raises(KeyboardInterrupt):
        interrupts.end(RuntimeError("Exception thrown in awaitResult"), session)  # type: ignore[arg-type]
    assert session.how == ["interrupted"]
