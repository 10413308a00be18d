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
a ``--window`` that is not a multiple of the rollup's.  The captures under a
directory the user names are read through its merged rollup (``merged``), made
or extended here first when it is not current: one file for the whole
directory, whatever the number of its capture files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import merged as M
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

    #: Rollup files read instead of their captures (merged rollups among them).
    rollups: list[str] = field(default_factory=list)
    #: Capture files read row by row.
    raw: list[str] = field(default_factory=list)
    #: Rollups made by this run, the rows they hold, and how many of them went
    #: into the output (their capture's directory was not writable).
    made: int = 0
    made_rows: int = 0
    in_output: int = 0
    seconds: float = 0.0
    #: Capture files this run added to merged rollups (``merged``), their rows,
    #: the merged rollups written, and the seconds that took.
    merged: int = 0
    merged_rows: int = 0
    merged_into: list[str] = field(default_factory=list)
    merge_seconds: float = 0.0
    #: (depth, window) of the rows read when they are one rollup's (a capture
    #: file's or a merged one): each set is then summed already, at that grain,
    #: and the job sums only what the report's depth or window asks of it.
    grain: tuple[int, int] | None = None

    def lines(self) -> list[str]:
        """What was rolled up and merged, for the operator (nothing when nothing was)."""
        said = []
        if self.made:
            where = "beside the captures"
            if self.in_output:
                where = (
                    f"{self.in_output} of them in the output's {ROLLUPS_DIR}/ (the capture "
                    "directory is not writable)"
                    if self.in_output < self.made
                    else f"in the output's {ROLLUPS_DIR}/ (the capture directory is not writable)"
                )
            files = "file" if self.made == 1 else "files"
            said.append(
                f"rolled up {self.made} capture {files} without a rollup ({self.made_rows:,} "
                f"rows) in {self.seconds:.1f} s, kept {where}: the next run reads the rollups"
            )
        if self.merged:
            files = "file" if self.merged == 1 else "files"
            into = ", ".join(self.merged_into)
            said.append(
                f"merged the rollups of {self.merged} capture {files} ({self.merged_rows:,} "
                f"rows) into {into} in {self.merge_seconds:.1f} s: the next run reads "
                f"{'that file' if len(self.merged_into) == 1 else 'those files'}"
            )
        return said


def kept_name(capture: Path) -> str:
    """The name of ``capture``'s rollup under ``<out>/rollups/``."""
    digest = hashlib.sha256(str(capture.resolve()).encode()).hexdigest()[:NAME_DIGEST]
    beside = rollup_path(capture).name
    return f"{beside[: -len('.rollup')]}-{digest}.rollup"


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def _keep(found: str, out: Path) -> str:
    """A rollup from the previous output, linked (else copied) into this run's."""
    target = out / ROLLUPS_DIR / Path(found).name
    target.parent.mkdir(exist_ok=True)
    if not target.exists():
        try:
            os.link(found, target)
        except OSError:
            shutil.copyfile(found, target)
    return str(target)


def plan(
    files: dict[str, int],
    depth: int,
    window_ns: int,
    *,
    raw: bool = False,
    out: Path | None = None,
    previous: Path | None = None,
    directories: Sequence[str] = (),
) -> Sources:
    """The sources of a report at ``depth`` in windows of ``window_ns`` over the
    capture ``files`` (path: rows).  The captures under each of ``directories``
    (those the user named) are read through the directory's merged rollup
    (``merged``: made or extended here when it is not current); the others
    through their own rollups where those serve, else row by row.  ``out`` is
    where this run writes (rollups that cannot go beside their captures go
    under it), ``previous`` the output it replaces (its rollups are read and
    carried over)."""
    sources = Sources()
    if raw:
        sources.raw = sorted(files)
        return sources
    t0 = time.monotonic()
    known: dict[str, RollupInfo | None] = {}

    def rollup_of(path: str) -> RollupInfo | None:
        if path not in known:
            known[path] = _rollup_of(Path(path), files[path], depth, out, previous, sources)
        return known[path]

    grains: list[tuple[int, int]] = []
    left = dict(files)
    elsewhere = None if out is None else out / ROLLUPS_DIR
    for directory in sorted({Path(d) for d in directories}, key=lambda d: len(d.parts)):
        kept = None
        if previous is not None and (previous / ROLLUPS_DIR / M.kept_name(directory)).is_file():
            kept = previous / ROLLUPS_DIR / M.kept_name(directory)
        merging = time.monotonic()
        cover = M.cover(
            directory, left, rollup_of, depth=depth, window_ns=window_ns,
            writable=_writable(directory), kept=kept, elsewhere=elsewhere,
        )  # fmt: skip
        if cover.merged is None:
            continue
        path = cover.merged.path
        if kept is not None and path == str(kept) and out is not None:
            path = _keep(path, out)
        sources.rollups.append(path)
        grains.append((cover.merged.depth, cover.merged.window_ns))
        for member in cover.merged.members:
            left.pop(member, None)
        if cover.added:
            sources.merged += cover.added
            sources.merged_rows += cover.added_rows
            sources.merged_into.append(path)
            sources.merge_seconds += time.monotonic() - merging
    for path, _ in sorted(left.items()):
        info = rollup_of(path)
        if info is not None and info.serves(depth, window_ns):
            sources.rollups.append(info.path)
            grains.append((info.depth, info.window_ns))
        else:
            sources.raw.append(path)
    if len(grains) == 1 and not sources.raw:
        sources.grain = grains[0]
    sources.seconds = time.monotonic() - t0 - sources.merge_seconds
    return sources


def _rollup_of(
    capture: Path, rows: int, depth: int, out: Path | None, previous: Path | None, sources: Sources
) -> RollupInfo | None:
    """``capture``'s own rollup: beside it, or kept by the previous output
    (carried into this one), or made now (when the report's depth is one a
    rollup holds); None when it has none."""
    info = usable(rollup_path(capture), rows)
    if info is None and previous is not None:
        info = usable(previous / ROLLUPS_DIR / kept_name(capture), rows)
        if info is not None and out is not None:
            info = RollupInfo(_keep(info.path, out), info.depth, info.window_ns, info.rows)
    if info is None and depth <= ROLLUP_DEPTH:
        info = _make(capture, rows, out, sources)
    return info


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
