"""What ``analyze`` reads and writes: checked captures in, one atomic output directory out.

What it owns: which capture files a run reads, their checks, and the atomic
output directory.  What it may touch: those files and directories.

Inputs: local paths are resolved here, before Spark starts, into an explicit
list of capture files.  Journals left by a killed recorder are recovered first
(``capture.recover``).  Every Parquet file must carry the capture marker
(``capture.CAPTURE_MARKER``); anything else is refused in one line, and a file
that is not readable Parquet is refused too unless ``skip_bad`` is given.  The
footers also give the time span (row-group statistics) and the input size,
from which the job sizes its window and partitions without a scan.  URLs
(``hdfs://``, ``s3a://``...) are left to Spark: only it can list them.

Output: the job writes into a fresh sibling directory which replaces ``out``
only when everything is written (``swap_into_place``), so a failed run never
leaves old and new tables side by side.  An ``out`` inside an input, or an
input inside ``out``, is refused: results would be read back as traffic.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sbus_relay.protocol.errors import UsageError

from .capture import (
    CAPTURE_MARKER,
    CAPTURE_VERSION,
    LossSummary,
    capture_files,
    loss_files,
    read_losses,
    recover,
    session_prefix,
)
from .defaults import CAPTURE_SUFFIX

#: The file analyze writes last into its output: marks a directory as an analyze output.
SUMMARY_FILE = "summary.json"
#: Keys every summary.json of analyze has: how an earlier output is recognised.
SUMMARY_KEYS = frozenset({"messages", "keys", "options", "inputs", "loss"})
#: Bad files named in full in an error line; the rest are counted.
MAX_NAMED_FILES = 3


class InputError(UsageError, ValueError):
    """Inputs, output or options that analyze refuses; the message is one line."""


@dataclass
class Inputs:
    """Captures resolved for one run."""

    #: What Spark reads: checked capture files, or the URLs as given.
    paths: list[str]
    #: True when ``paths`` are checked local files (not URLs left to Spark).
    checked: bool
    first_ns: int | None = None
    last_ns: int | None = None
    rows: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    losses: LossSummary | None = None
    #: Rows of each checked capture file (its footer), by path.
    file_rows: dict[str, int] = field(default_factory=dict)
    #: The directories among the local inputs as given (each read through its
    #: merged rollup, ``merged``).
    directories: list[str] = field(default_factory=list)


def is_url(path: str) -> bool:
    return "://" in path


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:MAX_NAMED_FILES])
    more = len(paths) - MAX_NAMED_FILES
    return shown + (f" and {more} more" if more > 0 else "")


def resolve(paths: list[str], *, skip_bad: bool = False, recover_journals: bool = True) -> Inputs:
    """Check and list the captures under ``paths``; raise ``InputError`` in one line."""
    if any(is_url(p) for p in paths):
        if not all(is_url(p) for p in paths):
            raise InputError("give either local paths or URLs, not both")
        return Inputs(paths=list(paths), checked=False)
    for p in paths:
        if not os.path.exists(p):
            raise InputError(f"no such file or directory: {p}")
        if not os.path.isdir(p) and not p.endswith(CAPTURE_SUFFIX):
            raise InputError(
                f"{p} is not a capture file: analyze reads the *{CAPTURE_SUFFIX} files "
                "`sbus-relay record` writes; give them, or the directory that holds them"
            )
    inputs = Inputs(paths=[], checked=True, directories=[p for p in paths if os.path.isdir(p)])
    if recover_journals:
        try:
            note = recover(paths).line()
        except OSError as exc:
            note = f"could not recover unfinished capture files: {exc}"
        if note:
            inputs.notes.append(note)
    not_captures: list[str] = []
    first: list[int] = []
    last: list[int] = []
    last_by_session: dict[str, int] = {}
    for f in capture_files(paths):
        try:
            meta = pq.read_metadata(str(f))
        except (OSError, pa.ArrowException):
            inputs.skipped.append(str(f))
            continue
        kv = meta.metadata or {}
        if kv.get(CAPTURE_MARKER) != CAPTURE_VERSION:
            not_captures.append(str(f))
            continue
        inputs.paths.append(str(f))
        inputs.file_rows[str(f)] = meta.num_rows
        inputs.rows += meta.num_rows
        inputs.bytes += f.stat().st_size
        t = meta.schema.to_arrow_schema().get_field_index("time_ns")
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(t).statistics
            if stats is not None and stats.has_min_max:
                first.append(stats.min)
                last.append(stats.max)
                session = session_prefix(f)
                last_by_session[session] = max(last_by_session.get(session, 0), stats.max)
    if not_captures:
        raise InputError(
            f"not a capture file (no {CAPTURE_MARKER.decode()} marker; analyze reads only "
            f"what `sbus-relay record` writes): {_names(not_captures)}"
        )
    if inputs.skipped and not skip_bad:
        raise InputError(
            f"unreadable Parquet file(s): {_names(inputs.skipped)} "
            "(give --skip-bad-files to analyse the rest)"
        )
    if inputs.skipped:
        inputs.notes.append(f"skipped {len(inputs.skipped)} unreadable file(s)")
    if not inputs.paths:
        raise InputError(f"no *{CAPTURE_SUFFIX} capture files under {' '.join(paths)}")
    if first:
        inputs.first_ns, inputs.last_ns = min(first), max(last)
    inputs.losses = read_losses(loss_files(paths), last_by_session)
    return inputs


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output(out: str, inputs: list[str]) -> None:
    """Refuse an ``out`` that overlaps an input, or that holds something else."""
    if is_url(out):
        return
    target = Path(out).resolve()
    for p in inputs:
        if is_url(p):
            continue
        source = Path(p).resolve()
        if _inside(target, source) or _inside(source, target):
            raise InputError(
                f"--out {out} overlaps the input {p}: its tables would be read as traffic; "
                "write the report elsewhere"
            )
    if not target.exists() or is_analyze_output(target):
        return
    if not target.is_dir():
        raise InputError(f"--out {out} is a file, not a directory: not replacing it")
    if not any(target.iterdir()):
        raise InputError(
            f"--out {out} is an existing empty directory, not an earlier analyze output: "
            "analyze replaces its output directory as a whole; name a new one (it is "
            "created) or remove this one"
        )
    raise InputError(
        f"--out {out} exists and is not an earlier analyze output (no analyze "
        f"{SUMMARY_FILE} in it): not replacing it"
    )


def is_analyze_output(directory: Path) -> bool:
    """Whether ``directory`` holds what analyze writes: its summary.json, read back."""
    try:
        summary = json.loads((directory / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.keys() >= SUMMARY_KEYS


def staging_dir(out: str) -> Path:
    """A fresh directory beside ``out`` for this run to write into."""
    target = Path(out).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.new-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def swap_into_place(staging: Path, out: str) -> None:
    """Replace ``out`` by ``staging``: the old output is moved aside, then removed."""
    target = Path(out).resolve()
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        os.rename(target, old)
    os.rename(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def discard(staging: Path) -> None:
    """Remove a failed run's staging directory."""
    shutil.rmtree(staging, ignore_errors=True)
