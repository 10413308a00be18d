"""Rollups: a capture file's traffic aggregated once, when the file is closed.

What it owns: the rollup format and how a capture's sets are summed.  What it
may touch: the capture and rollup files.

Beside each capture file ``<name>.parquet``, ``<name>.rollup`` (Parquet, zstd)
holds what every table of ``analyze`` is derived from, at the finest grain a
report that includes the file can ask for by default:

- cells: messages, payload bytes, first and last receive time per (prefix at
  ROLLUP_DEPTH segments, window of ``window_ns``, instance);
- sizes: messages per (prefix at ROLLUP_DEPTH, exact payload size): the
  histograms that keep every percentile exact;
- keys: messages and payload bytes per key;
- one row naming the capture file, its rows and its first and last receive time.

Rows of every kind share one schema (ROLLUP_SCHEMA, the same as ``follow``'s
state), tagged by ``_set`` (``grouping_id``).  ``window_ns`` is
``windows.state_window`` of the file's own span: it divides every window
``analyze`` chooses for a report spanning at least the file (the nice windows
from the span's on), so the cells sum exactly into them; a coarser prefix is
a cut of the stored one (``a/b`` at depth 1 is ``a``).  A deeper ``--depth``, or
a ``--window`` that is not a multiple of ``window_ns``, reads the raw rows.

A rollup is computed from the file's Arrow table with pyarrow's own hash
group-by (``roll_up``), never per message in Python, and published before its
capture file (``capture.convert_journal``): written as ``<name>.rollup.tmp``,
fsync'ed, renamed; so a capture file written by ``record`` always has one.
Its key-value metadata (``ROLLUP_MARKER`` and the others below) names the
depth, the window and the capture's row count, which ``usable`` checks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .defaults import CAPTURE_SUFFIX, ROLLUP_SUFFIX, TMP_SUFFIX
from .windows import state_window

#: Prefix depth the rollup keeps: the deepest ``--depth`` a rollup serves.  Two
#: segments (``service/topic``, the default depth) keep a rollup the size of the
#: key families, not of the keys; a deeper report reads the raw rows.
ROLLUP_DEPTH = 2
#: Metadata marking a rollup, with its format version; and its parameters.
ROLLUP_MARKER = b"sbus_relay.rollup"
ROLLUP_VERSION = b"1"
DEPTH_KEY = b"sbus_relay.rollup.depth"
WINDOW_KEY = b"sbus_relay.rollup.window_ns"
ROWS_KEY = b"sbus_relay.rollup.rows"
#: Parquet compression of rollups: as the captures'.
COMPRESSION = "zstd"

#: The grouping columns, in the order of Spark's ``grouping_id()``.
GROUPING_COLUMNS = ("prefix", "window_start_ns", "instance", "size", "key")
CELLS = ("prefix", "window_start_ns", "instance")
SIZES = ("prefix", "size")
KEYS = ("key",)


def grouping_id(grouping: tuple[str, ...], columns: tuple[str, ...] = GROUPING_COLUMNS) -> int:
    """Spark's ``grouping_id()`` of the rows of one grouping set: a bit per
    grouping column, most significant first, set when it is not grouped on."""
    return sum(1 << (len(columns) - 1 - i) for i, c in enumerate(columns) if c not in grouping)


CELL_SET = grouping_id(CELLS)
SIZE_SET = grouping_id(SIZES)
KEY_SET = grouping_id(KEYS)
#: The set of the row that names the capture file (in ``key``), its rows in
#: ``messages``, its first and last receive time.
FILE_SET = -1

ROLLUP_SCHEMA = pa.schema(
    [
        ("_set", pa.int64()),
        ("prefix", pa.string()),
        ("window_start_ns", pa.int64()),
        ("instance", pa.string()),
        ("size", pa.int64()),
        ("key", pa.string()),
        ("messages", pa.int64()),
        ("bytes", pa.int64()),
        ("first_ns", pa.int64()),
        ("last_ns", pa.int64()),
    ]
)
#: The same schema as Spark DDL.
ROLLUP_DDL = ", ".join(
    f"{f.name} {'long' if pa.types.is_integer(f.type) else 'string'}" for f in ROLLUP_SCHEMA
)
#: The capture columns a rollup reads (never the payload).
SCANNED = ["time_ns", "key", "size", "instance"]


def rollup_path(capture: str | os.PathLike[str]) -> Path:
    """``<name>.rollup`` for the capture file ``<name>.parquet``."""
    p = Path(capture)
    name = p.name[: -len(CAPTURE_SUFFIX)] if p.name.endswith(CAPTURE_SUFFIX) else p.name
    return p.with_name(name + ROLLUP_SUFFIX)


def prefixes(keys: pa.Array, depth: int) -> pa.Array:
    """The first ``depth`` ``/``-separated segments of each key (Spark's
    ``substring_index(key, '/', depth)``): ``a/b/c`` -> ``a/b``, ``a//b`` -> ``a/``."""
    parts = pc.split_pattern(keys, "/", max_splits=depth)
    return pc.binary_join(pc.list_slice(parts, 0, depth), "/")


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """(indices, dictionary) of a column: the strings hashed once each."""
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks() if encoded.num_chunks else pa.array([], encoded.type)
    return encoded.indices, encoded.dictionary


def sets(table: pa.Table, window_ns: int, depth: int) -> pa.Table:
    """The three sets of capture rows ``table`` (capture columns; the payload is
    not read), in ROLLUP_SCHEMA: cells at prefixes of ``depth`` segments in
    windows of ``window_ns``, size histograms, per-key counts.  pyarrow's hash
    group-by on integer codes, each distinct key's prefix cut once.  Shared by
    ``roll_up`` and the partial sums of raw rows (``partial``)."""
    times = table["time_ns"]
    key_codes, key_dict = _codes(table["key"])
    # Each distinct key's prefix, then each row's prefix code through its key's.
    prefix_of_key, prefix_dict = _codes(prefixes(key_dict, depth))
    inst_codes, inst_dict = _codes(table["instance"])
    sizes = pc.cast(table["size"], pa.int64())
    coded = pa.table(
        {
            "k": key_codes,
            "p": pc.take(prefix_of_key, key_codes),
            "i": inst_codes,
            "w": pc.multiply(pc.divide(times, window_ns), window_ns),
            "t": times,
            "s": sizes,
        }
    )
    cells = coded.group_by(["p", "w", "i"], use_threads=False).aggregate(
        [("k", "count"), ("s", "sum"), ("t", "min"), ("t", "max")]
    )
    by_size = coded.group_by(["p", "s"], use_threads=False).aggregate([("k", "count")])
    by_key = coded.group_by(["k"], use_threads=False).aggregate([("s", "count"), ("s", "sum")])
    return pa.concat_tables(
        [
            set_rows(
                cells.num_rows,
                CELL_SET,
                prefix=pc.take(prefix_dict, cells["p"]),
                window_start_ns=cells["w"],
                instance=pc.take(inst_dict, cells["i"]),
                messages=cells["k_count"],
                bytes=cells["s_sum"],
                first_ns=cells["t_min"],
                last_ns=cells["t_max"],
            ),
            set_rows(
                by_size.num_rows,
                SIZE_SET,
                prefix=pc.take(prefix_dict, by_size["p"]),
                size=by_size["s"],
                messages=by_size["k_count"],
            ),
            set_rows(
                by_key.num_rows,
                KEY_SET,
                key=pc.take(key_dict, by_key["k"]),
                messages=by_key["s_count"],
                bytes=by_key["s_sum"],
            ),
        ]
    )


def set_rows(rows: int, set_id: int, **columns: pa.Array) -> pa.Table:
    """``rows`` rows of one set in ROLLUP_SCHEMA: its columns given, the others null."""
    return pa.table(
        {
            f.name: pa.repeat(pa.scalar(set_id), rows)
            if f.name == "_set"
            else columns.get(f.name, pa.nulls(rows, f.type))
            for f in ROLLUP_SCHEMA
        }
    ).cast(ROLLUP_SCHEMA)


#: Per stored set: its grouping columns and how its columns are summed again.
STORED_SUMS = (
    (CELL_SET, CELLS, (("messages", "sum"), ("bytes", "sum"), ("first_ns", "min"),
                       ("last_ns", "max"))),
    (SIZE_SET, SIZES, (("messages", "sum"),)),
    (KEY_SET, KEYS, (("messages", "sum"), ("bytes", "sum"))),
)  # fmt: skip


def sum_stored(parts: Sequence[pa.Table]) -> pa.Table:
    """Stored sets (ROLLUP_SCHEMA rows: rollups, partial sums of raw rows,
    ``follow``'s state) summed at their own grain: each set on its own columns,
    the rows naming files kept as they are.  Sums add up, so this may be done
    in steps: ``follow`` adds each committed batch to the sums of the earlier
    ones, a worker (``partial``) its row groups' sums to those it keeps."""
    state = pa.concat_tables(parts) if parts else ROLLUP_SCHEMA.empty_table()
    out = []
    for set_id, columns, sums in STORED_SUMS:
        rows = state.filter(pc.equal(state["_set"], set_id))
        g = rows.group_by(list(columns), use_threads=False).aggregate(list(sums))
        summed = {name: g[f"{name}_{how}"] for name, how in sums}
        out.append(set_rows(g.num_rows, set_id, **{c: g[c] for c in columns}, **summed))
    out.append(state.filter(pc.equal(state["_set"], FILE_SET)))
    return pa.concat_tables(out)


def roll_up(table: pa.Table, name: str, depth: int = ROLLUP_DEPTH) -> pa.Table:
    """The rollup of a capture ``table`` (capture columns; the payload is not read)
    of the capture file ``name``: its three sets (``sets``) in windows of the
    file's ``state_window``, and the row naming the file."""
    n = table.num_rows
    times = table["time_ns"]
    first = pc.min(times).as_py() if n else None
    last = pc.max(times).as_py() if n else None
    window_ns = state_window(None if first is None else last - first)
    out = pa.concat_tables(
        [
            sets(table, window_ns, depth),
            set_rows(
                1,
                FILE_SET,
                key=pa.array([name]),
                messages=pa.array([n]),
                first_ns=pa.array([first], pa.int64()),
                last_ns=pa.array([last], pa.int64()),
            ),
        ]
    )
    meta = {
        ROLLUP_MARKER: ROLLUP_VERSION,
        DEPTH_KEY: str(depth).encode(),
        WINDOW_KEY: str(window_ns).encode(),
        ROWS_KEY: str(n).encode(),
    }
    return out.replace_schema_metadata(meta)


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: The order of the sets in a rollup file, each in row groups of its own: the
#: rows naming files first (``merged`` reads only them), then the sets, so that
#: a reader asking for one set (``_set = n``) skips the others' row groups.
SET_ORDER = (FILE_SET, CELL_SET, SIZE_SET, KEY_SET)


def write_rollup(rollup: pa.Table, path: Path) -> Path:
    """Write ``rollup`` to ``path`` atomically (a ``.tmp`` file, fsync'ed,
    renamed), each set in row groups of its own (SET_ORDER)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with pq.ParquetWriter(tmp, rollup.schema, compression=COMPRESSION) as writer:
        for set_id in SET_ORDER:
            rows = rollup.filter(pc.equal(rollup["_set"], set_id))
            if rows.num_rows:
                writer.write_table(rows)
    _fsync(tmp)
    os.rename(tmp, path)
    return path


def read_set(path: str | os.PathLike[str], set_id: int, columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of the rows of one set in the rollup at ``path``, reading
    only the row groups whose statistics say they may hold it (``write_rollup``
    gives each set its own)."""
    f = pq.ParquetFile(path)
    meta = f.metadata
    column = meta.schema.to_arrow_schema().get_field_index("_set")
    groups = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max or stats.min <= set_id <= stats.max:
            groups.append(g)
    table = f.read_row_groups(groups, columns=[*columns, "_set"], use_threads=False)
    return table.filter(pc.equal(table["_set"], set_id)).select(list(columns))


def roll_up_file(capture: str | os.PathLike[str], target: Path | None = None) -> Path:
    """Roll up a closed capture file into ``target``, by default ``<name>.rollup``
    beside it; return the rollup's path."""
    capture = Path(capture)
    table = pq.read_table(capture, columns=SCANNED)
    target = rollup_path(capture) if target is None else target
    return write_rollup(roll_up(table, capture.name), target)


@dataclass(frozen=True)
class RollupInfo:
    """What a rollup's metadata says."""

    path: str
    depth: int
    window_ns: int
    rows: int

    def serves(self, depth: int, window_ns: int) -> bool:
        """Whether it holds a report's prefixes at ``depth`` in windows of ``window_ns``."""
        return depth <= self.depth and window_ns % self.window_ns == 0


def usable(path: Path, capture_rows: int) -> RollupInfo | None:
    """The rollup at ``path`` when it is one, readable and of a capture of
    ``capture_rows`` rows (a capture rewritten since does not match); else None."""
    try:
        meta = pq.read_metadata(path).metadata or {}
        info = RollupInfo(
            str(path), int(meta[DEPTH_KEY]), int(meta[WINDOW_KEY]), int(meta[ROWS_KEY])
        )
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return None
    if meta.get(ROLLUP_MARKER) != ROLLUP_VERSION or info.rows != capture_rows:
        return None
    return info
