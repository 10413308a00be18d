"""A JVM class-data-sharing archive, so that Spark's JVM starts faster.

What it owns: the JVM class-data-sharing archive and when it is rebuilt.  What
it may touch: java, the cache directory.

    python -m sbus_relay.pipeline.classarchive     # build it now (analyze does it itself)

Starting Spark loads some 15,000 classes; reading and verifying them is most
of the JVM's start and part of the first job.  The JVM can dump the classes a
run loaded into an archive (``-XX:ArchiveClassesAtExit``) and map it in at the
next start (``-XX:SharedArchiveFile``): Spark's start falls from about 5 s to
3 s here, and the first job gains a second or more.

The archive belongs to one Java and one pyspark (the JVM also checks the class
path itself and ignores an archive that no longer fits), so its name carries a
digest of both.  It lives in the user's cache directory.  Writing one makes the
JVM slower (it records every class, then dumps about 180 MB at exit), so no
user's run pays for it: when ``analyze`` finds no archive, it starts this
module in the background once it is done, and the builder runs a small
analysis of synthetic captures with the archive being written, to a temporary
name renamed into place only when that run succeeded.  One builder at a time
(a lock file holding its pid), and it pauses (SIGSTOP of its analysis run)
while any other analyze runs on this machine (each marks itself in
``running/<pid>``): the user's run gets the cores.

The JVM maps an archive only for the class path it was written with, so each
install (a venv's pyspark) has its own: the digest holds the jars' directory,
and a ``.source`` file beside the archive names it.  A new archive removes only
the older ones of the same install and those of installs that are gone; at most
MAX_ARCHIVES are kept (the least recently used go).  With
``SBUS_CLASS_ARCHIVE=0`` none is built or used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from sbus_relay.ops import children
from sbus_relay.ops.cachedir import cache_dir

from . import scratch

#: Environment variable: ``0`` turns the archive off; ``write:<path>`` (set by the
#: builder for its own analysis run) makes that run's JVM write the archive there.
ENV_SWITCH = "SBUS_CLASS_ARCHIVE"
WRITE_MODE = "write:"
#: File names: ``spark-<digest>.jsa``, its lock while being built, its log (and
#: ``<archive>.size``, the size it was written with).
PREFIX, SUFFIX, LOCK_SUFFIX = "spark-", ".jsa", ".lock"
LOG_NAME = "class-archive.log"
#: Messages in the builder's synthetic capture: enough for every kind of task.
BUILD_MESSAGES = 20_000
#: The JVM's class-sharing messages go to its stdout (the user's terminal): errors only.
QUIET = "-Xlog:cds*=error"
#: Seconds to wait, after Spark stopped, for the JVM to write the archive and exit.
DUMP_WAIT_SECONDS = 180.0
#: Seconds of running (pauses not counted) the builder's analysis may take.
BUILD_TIMEOUT_SECONDS = 600.0
#: Archives kept in the cache, one per install: two venvs on one machine keep theirs.
MAX_ARCHIVES = 4
#: Subdirectory of the cache where each running analyze leaves a file named by its pid.
RUNNING_DIR = "running"
#: Seconds between the builder's looks for running analyses.
PAUSE_POLL_SECONDS = 0.25


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.realpath(os.path.join(home, "bin", "java"))
    found = shutil.which("java")
    return os.path.realpath(found) if found else None


def spark_home() -> Path:
    """The installed pyspark's directory: its ``jars/`` and ``bin/spark-submit``."""
    import pyspark

    return Path(pyspark.__file__).parent


def _jars() -> Path:
    return spark_home() / "jars"


def digest() -> str | None:
    """Names this Java and this pyspark: the java binary (path, size, mtime) and
    pyspark's jars (directory, names and sizes); None without a java."""
    java = _java()
    if java is None:
        return None
    jars = _jars()
    h = hashlib.sha256()
    st = os.stat(java)
    h.update(f"{java}\0{st.st_size}\0{st.st_mtime_ns}\0{jars}\0".encode())
    with contextlib.suppress(OSError):
        for jar in sorted(os.scandir(jars), key=lambda e: e.name):
            h.update(f"{jar.name}\0{jar.stat().st_size}\0".encode())
    return h.hexdigest()[:16]


def archive_path() -> Path | None:
    """Where this Java and pyspark's archive is (or goes); None when turned off."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    name = digest()
    if name is None:
        return None
    try:
        return cache_dir() / f"{PREFIX}{name}{SUFFIX}"
    except RuntimeError:  # no $HOME and no passwd entry: nowhere to keep it
        return None


def writing() -> Path | None:
    """The archive this run's JVM must write (the builder's run), else None."""
    value = os.environ.get(ENV_SWITCH, "")
    return Path(value[len(WRITE_MODE) :]) if value.startswith(WRITE_MODE) else None


def _size_file(path: Path) -> Path:
    return path.with_name(path.name + ".size")


def _source_file(path: Path) -> Path:
    return path.with_name(path.name + ".source")


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Mark this process as a running analysis while the block runs: a builder
    pauses meanwhile.  (The builder's own run does not mark itself.)"""
    marker = None
    if writing() is None:
        with contextlib.suppress(OSError, RuntimeError):
            directory = cache_dir() / RUNNING_DIR
            directory.mkdir(parents=True, exist_ok=True)
            marker = directory / str(os.getpid())
            marker.touch()
    try:
        yield
    finally:
        if marker is not None:
            with contextlib.suppress(OSError):
                marker.unlink()


def others_running() -> bool:
    """Whether an analysis other than this process runs (dead ones' marks are removed)."""
    try:
        entries = list(os.scandir(cache_dir() / RUNNING_DIR))
    except (OSError, RuntimeError):
        return False
    found = False
    for entry in entries:
        pid = int(entry.name) if entry.name.isdigit() else 0
        if pid == os.getpid():
            continue
        if _alive(pid):
            found = True
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    return found


def usable(path: Path) -> bool:
    """Whether the archive at ``path`` is whole: its size is the one the builder
    recorded after writing it (a cut archive makes the JVM crash at start)."""
    try:
        return int(_size_file(path).read_text()) == path.stat().st_size
    except (OSError, ValueError):
        return False


def discard() -> None:
    """Remove the archive (and its records), e.g. when a JVM failed with it."""
    path = archive_path()
    if path is not None:
        _remove(path)


def java_option() -> str | None:
    """The option for a Spark JVM about to start: write the archive (the builder's
    run), use it (when built), or nothing."""
    target = writing()
    if target is not None:
        return f"-XX:ArchiveClassesAtExit={target} {QUIET}"
    path = archive_path()
    if path is not None and usable(path):
        return f"-XX:SharedArchiveFile={path} {QUIET}"
    return None


def wait_for_dump(jvm: subprocess.Popen[bytes] | None) -> bool:
    """In the builder's run, once Spark stopped: end the JVM (pyspark's gateway exits
    when its stdin closes) and wait while it writes the archive.  True on success."""
    if jvm is None:
        return False
    with contextlib.suppress(OSError):
        if jvm.stdin is not None:
            jvm.stdin.close()
    try:
        return jvm.wait(DUMP_WAIT_SECONDS) == 0
    except subprocess.TimeoutExpired:
        jvm.kill()
        return False


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def _holder(lock: Path) -> int:
    """The pid in a builder's lock file (0 when there is none)."""
    try:
        return int(lock.read_text() or "0")
    except (OSError, ValueError):
        return 0


def _lock(path: Path) -> bool:
    """Take the builder's lock (a file holding the pid); a dead holder's is taken over."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _alive(_holder(path)):
                return False
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def build_later() -> bool:
    """Start the builder in the background when there is no archive and none is
    being built; it outlives this process.  True when started."""
    path = archive_path()
    if path is None or usable(path):
        return False
    if _alive(_holder(path.with_suffix(LOCK_SUFFIX))):
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A session of its own, and not stopped when this run ends.
        children.spawn(
            [sys.executable, "-m", __name__],
            log=path.parent / LOG_NAME,
            append=False,
            stdout="log",
            new_session=True,
            outlive_parent=True,
        )
    except OSError:
        return False
    return True


def build() -> int:
    """Build the archive: a small analysis whose JVM writes it, then the rename."""
    path = archive_path()
    if path is None:
        print("class archive: turned off, or no java found")
        return 1
    if usable(path):
        print(f"class archive: {path} is there already")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_suffix(LOCK_SUFFIX)
    if not _lock(lock):
        print("class archive: another builder is running")
        return 0
    with contextlib.suppress(OSError):
        os.nice(10)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        # Where scratch directories go, never /tmp behind the user's back
        # (``scratch``: one left by a killed builder goes with the next one made).
        with scratch.directory() as work:
            sample_capture(Path(work, "captures"))
            command = [sys.executable, "-m", "sbus_relay", "analyze"]
            command += [str(Path(work, "captures")), "--out", str(Path(work, "out"))]
            env = {**os.environ, ENV_SWITCH: f"{WRITE_MODE}{tmp}"}
            status = _run_pausing(command, env)
            if status is None:
                print("class archive: the analysis run timed out")
                return 1
            if status != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
                print(f"class archive: the analysis run failed ({children.how_it_ended(status)})")
                return 1
        _remove_stale(path)
        size = tmp.stat().st_size
        os.replace(tmp, path)
        for sidecar, text in ((_size_file(path), str(size)), (_source_file(path), str(_jars()))):
            side_tmp = sidecar.with_name(f"{sidecar.name}.{os.getpid()}.tmp")
            side_tmp.write_text(text)
            os.replace(side_tmp, sidecar)
        print(f"class archive: wrote {path} ({path.stat().st_size / 2**20:.0f} MiB)")
        return 0
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        with contextlib.suppress(OSError):
            lock.unlink()


def sample_capture(directory: Path) -> None:
    """BUILD_MESSAGES messages an hour long, on a few key families, three instances
    and varied sizes, written by the capture writer: enough for every kind of task."""
    from .capture import RotatingCaptureWriter

    t0 = 1_700_000_000 * 10**9
    step = 3600 * 10**9 // BUILD_MESSAGES
    for n in range(3):
        with RotatingCaptureWriter(directory, instance=f"host{n}") as writer:
            for i in range(n, BUILD_MESSAGES, 3):
                key = f"family{i % 7}/topic{i % 11}/{i % 97}"
                writer.append(t0 + i * step, key, b"x" * (i * 37 % 1500))


def _run_pausing(command: list[str], env: dict[str, str]) -> int | None:
    """Run the builder's analysis, stopped (SIGSTOP to its process group) while
    another analysis runs; its exit status, or None after BUILD_TIMEOUT_SECONDS
    of running."""
    # Its own process group, which SIGSTOP and SIGCONT reach whole; its errors
    # go where the builder's output goes (its log, or the terminal).
    proc = children.spawn(command, new_session=True, env=env)
    ran = 0.0
    paused = False
    try:
        while True:
            try:
                return proc.wait(PAUSE_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            busy = others_running()
            if busy != paused:
                os.killpg(proc.pid, signal.SIGSTOP if busy else signal.SIGCONT)
                paused = busy
            if not paused:
                ran += PAUSE_POLL_SECONDS
                if ran > BUILD_TIMEOUT_SECONDS:
                    return None
    finally:
        children.stop(proc, 0.0, group=True, sig=signal.SIGKILL)  # stopped or not


def _remove_stale(path: Path) -> None:
    """Before ``path`` is written: remove the archives of this install's earlier
    pysparks or Javas, those of installs that are gone, temporary ones whose
    writer is dead, and the least recently used beyond MAX_ARCHIVES."""
    jars = str(_jars())
    kept = []
    for old in path.parent.glob(f"{PREFIX}*{SUFFIX}*"):
        if old.name.endswith(".tmp"):
            if not _alive(_pid_of(old)):
                with contextlib.suppress(OSError):
                    old.unlink()
            continue
        if not old.name.endswith(SUFFIX) or old == path:
            continue
        try:
            source = _source_file(old).read_text()
        except OSError:
            source = ""
        if source == jars or (source and not os.path.isdir(source)):
            _remove(old)
        else:
            kept.append(old)
    kept.sort(key=lambda p: p.stat().st_atime if p.exists() else 0.0, reverse=True)
    for old in kept[MAX_ARCHIVES - 1 :]:
        _remove(old)


def _remove(archive: Path) -> None:
    for p in (archive, _size_file(archive), _source_file(archive)):
        with contextlib.suppress(OSError):
            p.unlink()


def _pid_of(tmp: Path) -> int:
    """The writer's pid in a temporary archive's name (0 when there is none)."""
    pid = tmp.name.removesuffix(".tmp").rpartition(".")[2]
    return int(pid) if pid.isdigit() else 0


if __name__ == "__main__":
    sys.exit(build())
