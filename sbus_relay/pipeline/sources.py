"""What a run reads for each capture file: its rollup, or its raw rows.

What it owns: whether a run reads a capture's rollup or its raw rows.  What it
may touch: the capture files and the rollups it writes beside them.

Rollups (``rollup``) are read wherever one serves the report: the prefixes at
a depth it holds, windows that are a multiple of its own.  A capture without
one (written before rollups, by another tool, or by a recorder killed before
it closed the file: ``recover`` writes one) is rolled up here, on the driver
with pyarrow, before Spark starts, and the rollup is kept for the next run:
beside its capture file where this user may write, else under the output
directory, ``<out>/rollups/`` (carried over from one run's output to the next).
Raw rows are read only where they must be: ``--raw``, a deeper ``--depth`` or
a ``--window`` that is not a multiple of the rollup's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .rollup import (
    ROLLUP_DEPTH,
    SCANNED,
    RollupInfo,
    roll_up,
    rollup_path,
    usable,
    write_rollup,
)

#: The directory under analyze's output that keeps the rollups it could not
#: write beside their captures.
ROLLUPS_DIR = "rollups"
#: Hex digits of the capture's path in the name of a rollup kept in the output:
#: captures of the same name in different directories keep apart.
NAME_DIGEST = 12


@dataclass
class Sources:
    """The files one run reads."""

    #: Rollup files read instead of their captures.
    rollups: list[str] = field(default_factory=list)
    #: Capture files read row by row.
    raw: list[str] = field(default_factory=list)
    #: Rollups made by this run, the rows they hold, and how many of them went
    #: into the output (their capture's directory was not writable).
    made: int = 0
    made_rows: int = 0
    in_output: int = 0
    seconds: float = 0.0

    def line(self) -> str | None:
        """What was rolled up, for the operator; None when nothing was."""
        if not self.made:
            return None
        where = "beside the captures"
        if self.in_output:
            where = (
                f"{self.in_output} of them in the output's {ROLLUPS_DIR}/ (the capture "
                "directory is not writable)"
                if self.in_output < self.made
                else f"in the output's {ROLLUPS_DIR}/ (the capture directory is not writable)"
            )
        files = "file" if self.made == 1 else "files"
        return (
            f"rolled up {self.made} capture {files} without a rollup ({self.made_rows:,} rows) "
            f"in {self.seconds:.1f} s, kept {where}: the next run reads the rollups"
        )


def kept_name(capture: Path) -> str:
    """The name of ``capture``'s rollup under ``<out>/rollups/``."""
    digest = hashlib.sha256(str(capture.resolve()).encode()).hexdigest()[:NAME_DIGEST]
    beside = rollup_path(capture).name
    return f"{beside[: -len('.rollup')]}-{digest}.rollup"


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def _keep(found: RollupInfo, out: Path) -> RollupInfo:
    """A rollup from the previous output, linked (else copied) into this run's."""
    target = out / ROLLUPS_DIR / Path(found.path).name
    target.parent.mkdir(exist_ok=True)
    if not target.exists():
        try:
            os.link(found.path, target)
        except OSError:
            shutil.copyfile(found.path, target)
    return RollupInfo(str(target), found.depth, found.window_ns, found.rows)


def plan(
    files: dict[str, int],
    depth: int,
    window_ns: int,
    *,
    raw: bool = False,
    out: Path | None = None,
    previous: Path | None = None,
) -> Sources:
    """The sources of a report at ``depth`` in windows of ``window_ns`` over the
    capture ``files`` (path: rows).  ``out`` is where this run writes (rollups
    that cannot go beside their captures go under it), ``previous`` the output
    it replaces (its rollups are read and carried over)."""
    sources = Sources()
    if raw:
        sources.raw = sorted(files)
        return sources
    t0 = time.monotonic()
    for path, rows in sorted(files.items()):
        capture = Path(path)
        info = usable(rollup_path(capture), rows)
        if info is None and previous is not None:
            info = usable(previous / ROLLUPS_DIR / kept_name(capture), rows)
            if info is not None and out is not None:
                info = _keep(info, out)
        if info is None and depth <= ROLLUP_DEPTH:
            info = _make(capture, rows, out, sources)
        if info is not None and info.serves(depth, window_ns):
            sources.rollups.append(info.path)
        else:
            sources.raw.append(path)
    sources.seconds = time.monotonic() - t0
    return sources


def _make(capture: Path, rows: int, out: Path | None, sources: Sources) -> RollupInfo | None:
    """Roll up ``capture`` beside it, else under ``out``; None when it cannot be
    read (Spark then reads it, and says what is wrong with it or skips it) or
    the rollup cannot be written anywhere."""
    try:
        table = pq.read_table(capture, columns=SCANNED)
    except (OSError, pa.ArrowException):
        return None
    rollup = roll_up(table, capture.name)
    made: Path | None = None
    if _writable(capture.parent):
        try:
            made = write_rollup(rollup, rollup_path(capture))
        except OSError:
            made = None
    if made is None and out is not None:
        (out / ROLLUPS_DIR).mkdir(exist_ok=True)
        made = write_rollup(rollup, out / ROLLUPS_DIR / kept_name(capture))
        sources.in_output += 1
    if made is None:
        return None
    sources.made += 1
    sources.made_rows += rows
    return usable(made, rows)
