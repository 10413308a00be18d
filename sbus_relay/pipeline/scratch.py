"""A private directory for the temporary files of each JVM the pipeline starts.

What it owns: the ``sbus-spark-<pid>-*`` directories: where they are, making one for a
JVM, removing it after, and removing those of processes that are gone.
What it may touch: nothing else.

A JVM left to itself writes into ``/tmp`` whatever ``$TMPDIR`` says: Spark's
``spark-*``, ``blockmgr-*`` and ``artifacts-*`` directories, the native
libraries it unpacks (``liblz4-java-*.so``, snappy's, zstd's), a Connect
server's model cache, and ``hsperfdata_<user>/``.  Each JVM the pipeline
starts (analyze's, the Connect server's, the benchmark's cluster) gets
instead a directory of its own as ``java.io.tmpdir`` and ``spark.local.dir``
(``java_options``, ``spark_conf``), and no performance-data file
(``-XX:-UsePerfData``: its ``hsperfdata`` file is the one thing a JVM writes
into ``/tmp`` whatever its temporary directory; ``jcmd PID`` still works).
The directory is removed when the process that made it is done with the JVM;
one left by a process that was killed is removed by the next one that makes
one (``sweep``: its pid is gone).

It is made in ``$TMPDIR`` when that is set (the tests set it to a directory of
their run's, which must be empty when they end), else in the cache directory
(SCRATCH_DIR): never in ``/tmp`` behind the user's back, so that a run that
is killed leaves nothing there either (unless the cache directory cannot be
written: then the system's temporary directory, rather than no run at all).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sbus_relay.ops import children
from sbus_relay.ops.cachedir import cache_dir

#: Names of the directories: the prefix, then the pid of the process that made it.
PREFIX = "sbus-spark-"
#: The directory under the cache directory that holds them when $TMPDIR is not set.
SCRATCH_DIR = "scratch"
#: The JVM option that keeps its performance data out of /tmp.
NO_PERF_DATA = "-XX:-UsePerfData"


def root() -> Path:
    """Where the directories are made: ``$TMPDIR``, else the cache's SCRATCH_DIR."""
    given = os.environ.get("TMPDIR")
    return Path(given) if given else cache_dir() / SCRATCH_DIR


def sweep(where: Path | None = None) -> None:
    """Remove the directories of processes that are gone (killed before they could)."""
    where = root() if where is None else where
    try:
        entries = list(os.scandir(where))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        pid = entry.name[len(PREFIX) :].split("-", 1)[0]
        status = children.process_status(int(pid)) if pid.isdigit() else ("?", 0)
        if status is None or status[0] == "Z":
            shutil.rmtree(entry.path, ignore_errors=True)


def make() -> Path:
    """A new directory for a JVM of this process (those of gone processes swept
    first); in the system's temporary directory when the cache directory
    cannot be written (a home that is not there, read-only)."""
    where = root()
    try:
        where.mkdir(parents=True, exist_ok=True)
        sweep(where)
        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=where))
    except OSError:
        where = Path(tempfile.gettempdir())
        sweep(where)
        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=where))


def remove(directory: Path | None) -> None:
    """Remove a directory ``make`` made (nothing if None)."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def directory() -> Iterator[Path]:
    """A directory for a JVM while the block runs; removed after."""
    made = make()
    try:
        yield made
    finally:
        remove(made)


def java_options(directory: Path) -> str:
    """The JVM options that keep its temporary files in ``directory``."""
    return f"-Djava.io.tmpdir={directory} {NO_PERF_DATA}"


def spark_conf(directory: Path) -> dict[str, str]:
    """Spark's own scratch (shuffle files, spills, broadcast pieces) in ``directory``."""
    return {"spark.local.dir": str(directory)}
