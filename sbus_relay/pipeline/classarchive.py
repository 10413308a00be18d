"""A JVM class-data-sharing archive, so that Spark's JVM starts faster.

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
(a lock file holding its pid), and one archive kept: a new one removes those of
other Javas or pysparks.  With ``SBUS_CLASS_ARCHIVE=0`` none is built or used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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
#: Seconds the whole builder run may take.
BUILD_TIMEOUT_SECONDS = 600.0


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/sbus-relay``, or ``~/.cache/sbus-relay``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base, "sbus-relay")


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.realpath(os.path.join(home, "bin", "java"))
    found = shutil.which("java")
    return os.path.realpath(found) if found else None


def digest() -> str | None:
    """Names this Java and this pyspark: the java binary (path, size, mtime) and
    pyspark's jars (directory, names and sizes); None without a java."""
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
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


def usable(path: Path) -> bool:
    """Whether the archive at ``path`` is whole: its size is the one the builder
    recorded after writing it (a cut archive makes the JVM crash at start)."""
    try:
        return int(_size_file(path).read_text()) == path.stat().st_size
    except (OSError, ValueError):
        return False


def discard() -> None:
    """Remove the archive (and its size record), e.g. when a JVM failed with it."""
    path = archive_path()
    if path is not None:
        for p in (path, _size_file(path)):
            with contextlib.suppress(OSError):
                p.unlink()


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
        log = open(path.parent / LOG_NAME, "wb")  # noqa: SIM115 (the child's)
    except OSError:
        return False
    with log:
        subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
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
        with tempfile.TemporaryDirectory(prefix="sbus-class-archive-") as work:
            from .synth import generate

            generate(Path(work, "captures"), BUILD_MESSAGES, seconds=3600.0)
            command = [sys.executable, "-m", "sbus_relay", "analyze"]
            command += [str(Path(work, "captures")), "--out", str(Path(work, "out"))]
            env = {**os.environ, ENV_SWITCH: f"{WRITE_MODE}{tmp}"}
            try:
                done = subprocess.run(command, env=env, timeout=BUILD_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                print("class archive: the analysis run timed out")
                return 1
            if done.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
                print(f"class archive: the analysis run failed (status {done.returncode})")
                return 1
        for old in path.parent.glob(f"{PREFIX}*{SUFFIX}*"):
            if not old.name.endswith(".tmp") or not _alive(_pid_of(old)):
                with contextlib.suppress(OSError):
                    old.unlink()
        size = tmp.stat().st_size
        os.replace(tmp, path)
        size_tmp = tmp.with_name(tmp.name + ".size")
        size_tmp.write_text(str(size))
        os.replace(size_tmp, _size_file(path))
        print(f"class archive: wrote {path} ({path.stat().st_size / 2**20:.0f} MiB)")
        return 0
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        with contextlib.suppress(OSError):
            lock.unlink()


def _pid_of(tmp: Path) -> int:
    """The writer's pid in a temporary archive's name (0 when there is none)."""
    pid = tmp.name.removesuffix(".tmp").rpartition(".")[2]
    return int(pid) if pid.isdigit() else 0


if __name__ == "__main__":
    sys.exit(build())
