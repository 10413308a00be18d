"""A directory's merged rollup: the rollups of every capture file under it, summed into one.

What it owns: ``merged.rollups`` files: what one covers, whether it serves a run, making
and extending it.  What it may touch: the rollups it reads and the file it writes (beside
the captures, or under analyze's output when their directory is read-only).

A capture file's rollup (``rollup``) keeps a report off the raw rows, but there
is one per capture file, and a long recording has hundreds of them: their rows
add up with the files.  ``DIR/merged.rollups`` holds the sum of every rollup
under ``DIR`` (subdirectories too: a fleet's directory of hosts' directories)
in the windows of their joint span (``windows.state_window``, which every
member's own window divides), and one row per capture file it covers
(``rollup.FILE_SET``: its path relative to ``DIR``, its rows, its first and
last receive time).  A report of ``DIR`` then reads one file whose size
depends on prefixes, windows, distinct sizes and keys, not on the files.

It serves a run when every file it names is among the run's captures with
the rows it names (a capture removed or rewritten since makes it stale), at a
depth and window the report can be summed from.  ``cover`` makes or extends
it before Spark starts, with pyarrow, for each directory analyze is given:
from the merged rollups already there (its own, its subdirectories') that are
still valid, and the rollups of the files they miss, summed in steps of at
most FOLD_ROWS rows.  Written as ``.tmp``, fsync'ed and renamed
(``rollup.write_rollup``), so a reader sees the old one or the new one whole;
two runs making it at once each write a valid one, and the last rename wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import rollup as R
from .windows import state_window

#: The merged rollup's name in the directory it covers.  Not ``*.rollup``
#: (``--follow`` streams those) and not ``*.parquet`` (captures).
MERGED_NAME = "merged.rollups"
#: Metadata marking a merged rollup, with its format version, and the number of
#: capture files it covers (its depth, window and rows use ``rollup``'s keys).
MERGED_MARKER = b"sbus_relay.merged"
MERGED_VERSION = b"1"
FILES_KEY = b"sbus_relay.merged.files"
#: Most stored rows summed in one step while merging: bounds the memory of
#: merging any number of rollups (about 100 bytes a row).
FOLD_ROWS = 2_000_000
#: Fewest capture files worth a merged rollup: one file's rollup is already one file.
MIN_FILES = 2
#: Hex digits of the directory's path in the name of a merged rollup kept in
#: analyze's output (its directory is read-only).
NAME_DIGEST = 12


@dataclass(frozen=True)
class Merged:
    """A merged rollup: where it is and what it covers."""

    path: str
    #: The directory its capture files are named relative to.
    directory: str
    depth: int
    window_ns: int
    #: Capture file (as the run names it) -> its rows.
    members: dict[str, int] = field(default_factory=dict)

    def valid(self, files: dict[str, int]) -> bool:
        """Whether every file it covers is among ``files`` with the same rows."""
        return all(files.get(path) == rows for path, rows in self.members.items())

    def serves(self, depth: int, window_ns: int) -> bool:
        """Whether a report at ``depth`` in windows of ``window_ns`` sums from it."""
        return depth <= self.depth and window_ns % self.window_ns == 0


def kept_name(directory: Path) -> str:
    """The name, under analyze's output ``rollups/``, of the merged rollup of a
    ``directory`` analyze may not write."""
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:NAME_DIGEST]
    return f"merged-{digest}.rollups"


def read(path: Path, directory: Path) -> Merged | None:
    """The merged rollup at ``path`` of the captures under ``directory``; None when
    there is none, or it is not one (unreadable, another format version)."""
    try:
        meta = pq.read_metadata(path).metadata or {}
        if meta.get(MERGED_MARKER) != MERGED_VERSION:
            return None
        named = R.read_set(path, R.FILE_SET, ["key", "messages"])
        depth, window_ns = int(meta[R.DEPTH_KEY]), int(meta[R.WINDOW_KEY])
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return None
    members = {
        str(directory / name): rows
        for name, rows in zip(named["key"].to_pylist(), named["messages"].to_pylist(), strict=True)
    }
    return Merged(str(path), str(directory), depth, window_ns, members)


def _found(directory: Path, kept: Path | None) -> Iterator[Merged]:
    """The merged rollups under ``directory``: its own first (or the one kept
    for it in the previous output), then those of its subdirectories."""
    own = directory / MERGED_NAME
    for path in (own, kept):
        if path is not None and path.is_file():
            found = read(path, directory)
            if found is not None:
                yield found
    for path in sorted(directory.rglob(MERGED_NAME)):
        if path != own and path.is_file():
            found = read(path, path.parent)
            if found is not None:
                yield found


@dataclass
class Cover:
    """How the captures under one directory are read: its merged rollup (made
    or extended by ``cover`` when needed), and the files it does not cover."""

    merged: Merged | None = None
    #: Files of the directory the merged rollup does not cover.
    rest: list[str] = field(default_factory=list)
    #: Capture files this run added to the merged rollup, and their rows.
    added: int = 0
    added_rows: int = 0


def cover(
    directory: Path,
    files: dict[str, int],
    rollup_of: Callable[[str], R.RollupInfo | None],
    *,
    depth: int,
    window_ns: int,
    writable: bool,
    kept: Path | None,
    elsewhere: Path | None,
) -> Cover:
    """How to read the capture ``files`` (path: rows) under ``directory`` for a
    report at ``depth`` in windows of ``window_ns``: through its merged rollup
    when that is current; else through one made (or extended) now from the
    valid merged rollups under it and the rollups of the files they miss
    (``rollup_of``, asked only for those), written beside the captures when
    ``writable``, else into ``elsewhere`` (analyze's output).  ``kept`` is the
    merged rollup the previous output kept for it.  Files without a rollup of
    the merged rollups' depth stay in ``rest``, as do all of them when no
    merged rollup serves the report."""
    mine = {p: n for p, n in files.items() if Path(p).is_relative_to(directory)}
    everything = Cover(rest=sorted(mine))
    if depth > R.ROLLUP_DEPTH or not mine:
        return everything
    valid = [m for m in _found(directory, kept) if m.valid(mine) and m.depth == R.ROLLUP_DEPTH]
    own = valid[0] if valid and Path(valid[0].directory) == directory else None
    if own is not None and len(own.members) == len(mine):
        return Cover(own) if own.serves(depth, window_ns) else everything
    # The merged rollups that hold the most first, then each file's own rollup.
    parts: list[tuple[str, Path, dict[str, int]]] = []
    covered: set[str] = set()
    for m in sorted(valid, key=lambda m: -len(m.members)):
        if covered.isdisjoint(m.members):
            parts.append((m.path, Path(m.directory), m.members))
            covered.update(m.members)
    rest = []
    for path in sorted(set(mine) - covered):
        info = rollup_of(path)
        if info is None or info.depth != R.ROLLUP_DEPTH:
            rest.append(path)
        else:
            parts.append((info.path, Path(path).parent, {path: mine[path]}))
    if len(mine) - len(rest) < MIN_FILES:
        return everything
    if own is not None and [p for p, _, _ in parts] == [own.path]:
        # Current but for files that have no rollup to add (unreadable ones).
        return Cover(own, rest) if own.serves(depth, window_ns) else everything
    merged = _merge(parts, directory, writable, elsewhere)
    if merged is None or not merged.serves(depth, window_ns):
        return everything
    before = set(own.members) if own is not None else set()
    added = [p for p in merged.members if p not in before]
    return Cover(merged, rest, len(added), sum(mine[p] for p in added))


def _span(parts: list[tuple[str, Path, dict[str, int]]]) -> tuple[int | None, int | None]:
    """The first and last receive time over the files the parts cover."""
    first: int | None = None
    last: int | None = None
    for path, _, _ in parts:
        named = R.read_set(path, R.FILE_SET, ["first_ns", "last_ns"])
        lo, hi = pc.min(named["first_ns"]).as_py(), pc.max(named["last_ns"]).as_py()
        if lo is not None:
            first = lo if first is None else min(first, lo)
        if hi is not None:
            last = hi if last is None else max(last, hi)
    return first, last


def _load(path: str, base: Path, directory: Path, window_ns: int) -> pa.Table:
    """A part's stored rows, in ROLLUP_SCHEMA: its cells in windows of
    ``window_ns`` (a multiple of its own), its files named relative to
    ``directory`` (they are relative to ``base``)."""
    table = pq.ParquetFile(path).read(use_threads=False)
    table = pa.Table.from_arrays(
        [table[f.name].cast(f.type) for f in R.ROLLUP_SCHEMA], schema=R.ROLLUP_SCHEMA
    )
    windows = pc.multiply(pc.divide(table["window_start_ns"], window_ns), window_ns)
    table = table.set_column(
        table.schema.get_field_index("window_start_ns"), "window_start_ns", windows
    )
    where = base.relative_to(directory).as_posix()
    if where != ".":
        is_file = pc.equal(table["_set"], R.FILE_SET)
        named = pc.binary_join_element_wise(where, table["key"], "/")
        table = table.set_column(
            table.schema.get_field_index("key"), "key", pc.if_else(is_file, named, table["key"])
        )
    return table


def _merge(
    parts: list[tuple[str, Path, dict[str, int]]],
    directory: Path,
    writable: bool,
    elsewhere: Path | None,
) -> Merged | None:
    """The parts (path, the directory its file names are relative to, the
    files it covers) summed into the merged rollup of ``directory``, written
    into it when ``writable``, else into ``elsewhere``; None when it can be
    written nowhere."""
    first, last = _span(parts)
    window_ns = state_window(None if first is None or last is None else last - first)
    # Every part's window divides the span's (``state_window`` of a longer span
    # is a multiple of a shorter one's): a part that says otherwise is not merged.
    if any(window_ns % (_window(path) or window_ns + 1) for path, _, _ in parts):
        return None
    sums: pa.Table | None = None
    pending: list[pa.Table] = []
    held = 0
    for path, base, _ in parts:
        table = _load(path, base, directory, window_ns)
        pending.append(table)
        held += table.num_rows
        if held >= FOLD_ROWS:
            sums = R.sum_stored(([] if sums is None else [sums]) + pending)
            pending, held = [], sums.num_rows
    sums = R.sum_stored(([] if sums is None else [sums]) + pending)
    members = {p: n for _, _, covered in parts for p, n in covered.items()}
    meta = {
        R.ROLLUP_MARKER: R.ROLLUP_VERSION,
        MERGED_MARKER: MERGED_VERSION,
        R.DEPTH_KEY: str(R.ROLLUP_DEPTH).encode(),
        R.WINDOW_KEY: str(window_ns).encode(),
        R.ROWS_KEY: str(sum(members.values())).encode(),
        FILES_KEY: str(len(members)).encode(),
    }
    sums = sums.replace_schema_metadata(meta)
    if writable:
        try:
            target = R.write_rollup(sums, directory / MERGED_NAME)
        except OSError:
            writable = False
    if not writable:
        if elsewhere is None:
            return None
        elsewhere.mkdir(exist_ok=True)
        target = R.write_rollup(sums, elsewhere / kept_name(directory))
    return Merged(str(target), str(directory), R.ROLLUP_DEPTH, window_ns, members)


def _window(path: str) -> int | None:
    try:
        return int((pq.read_metadata(path).metadata or {})[R.WINDOW_KEY])
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return None
