"""``analyze --follow``: the report kept current while ``record`` writes (Structured Streaming).

What it owns: the streaming query of analyze --follow and its report updates.
What it may touch: Spark, the capture directory (read), the output directory.

The stream is Spark's file source over the capture directory, reading the
``*.rollup`` files ``record`` publishes with each capture file it closes (the
driver rolls up, beside them, capture files that arrive without one); or, when
rollups cannot serve the report (``reads_rollups``), the ``*.parquet`` capture
files themselves.  Spark's checkpoint (offsets, commits,
the list of files read) makes each file read once, across ``kill -9`` and
restarts.

Each micro-batch (``foreachBatch``) writes its rollups' rows as they are, or
aggregates its capture rows into the job's sets (``analyze.aggregate``) in
windows fine enough to be summed into any later window
(``windows.state_window``), plus one row per file it read, to
``<checkpoint>/state/batch=<id>``, overwriting: a batch that Spark runs again
after a crash rewrites the same rows, never adds them twice.

After each batch Spark has committed, the driver adds the batches committed
since its last update to its sums of the state (``Summed``, with pyarrow),
sums those into the windows of the whole span (``analyze.compute_local``) and
writes
the tables, summary and report as a batch run does (``analyze.finish``), into a
fresh directory that then replaces ``--out``: a batch ``analyze`` of the same
files gives the same tables.  Every COMPACT_BATCHES batches the state is summed
into one ``compact-<id>`` directory and the batches it holds are removed, so
the state stays the size of the aggregates, not of the traffic.

With ``--remote`` the micro-batches run in the Connect server's Python worker:
the server's Python must have sbus_relay (``sbus-relay spark-server`` runs this
install's), and the server must see the capture and checkpoint paths.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import analyze as A
from . import classarchive
from . import inputs as I
from . import rollup as R
from .capture import capture_files, recover
from .defaults import CAPTURE_SUFFIX, FOLLOW_TRIGGER_SECONDS, ROLLUP_SUFFIX
from .render import Renderer
from .runner import Request, drop_log, jvm_log_path, keep_log, plural
from .session import Interrupts, Session, SparkFailed, first_line, is_spark_error
from .session import start as start_spark
from .windows import state_window

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Batches kept apart in the state before they are compacted into one directory.
COMPACT_BATCHES = 20
#: The grouping set of the rows that name the files a batch read (in ``key``,
#: with their rows in ``messages`` and their first and last receive times).
FILES_SET = R.FILE_SET
#: The state's columns: those of a rollup (``rollup.ROLLUP_DDL``), the sets of
#: ``analyze.aggregate`` and the rows naming files.
STATE_DDL = R.ROLLUP_DDL
#: The column the stream adds to the capture rows: the file each came from.
FILE_COLUMN = "_file"
#: Suffix of the checkpoint directory beside --out when --checkpoint is not given.
CHECKPOINT_SUFFIX = ".checkpoint"
#: The file in the checkpoint recording the options its state was built with.
OPTIONS_FILE = "follow.json"
#: Seconds between the driver's looks at the stream (commits, failures).
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class FollowOptions:
    """--checkpoint (None: beside --out) and --trigger."""

    checkpoint: str | None = None
    trigger_seconds: float = FOLLOW_TRIGGER_SECONDS


@dataclass
class State:
    """Where the stream keeps its checkpoint and the aggregated state."""

    root: Path

    @property
    def stream(self) -> Path:
        return self.root / "stream"

    @property
    def sets(self) -> Path:
        return self.root / "state"

    def committed(self) -> int:
        """The last batch Spark has committed (-1 before the first)."""
        try:
            names = os.listdir(self.stream / "commits")
        except OSError:
            return -1
        return max((int(n) for n in names if n.isdigit()), default=-1)

    def compacted(self) -> int:
        """The last batch held by a complete compaction (-1 when none)."""
        found = [-1]
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.sets):
                number = entry.name.removeprefix("compact-")
                done = os.path.exists(os.path.join(entry.path, "_SUCCESS"))
                if entry.name.startswith("compact-") and number.isdigit() and done:
                    found.append(int(number))
        return max(found)

    def paths(self, upto: int) -> list[str]:
        """The state directories to read for the batches up to ``upto``."""
        base = self.compacted()
        paths = [str(self.sets / f"compact-{base}")] if base >= 0 else []
        for batch in range(base + 1, upto + 1):
            path = self.sets / f"batch={batch}"
            if path.is_dir():
                paths.append(str(path))
        return paths


def state_rows(df: DataFrame, opts: A.AnalyzeOptions) -> DataFrame:
    """One micro-batch's rows as state: the grouping sets in windows of
    ``state_window`` of the batch's own span (or the asked window), and a row per
    file it read."""
    from pyspark.sql import functions as F

    per_file = (
        df.groupBy(FILE_COLUMN)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.min("time_ns").alias("first"),
            F.max("time_ns").alias("last"),
        )
        .collect()
    )
    if opts.window_seconds is None:
        firsts = [r["first"] for r in per_file if r["first"] is not None]
        lasts = [r["last"] for r in per_file if r["last"] is not None]
        span = max(lasts) - min(firsts) if firsts else None
        opts = replace(opts, window_seconds=state_window(span) / 1e9)
    columns = [c.split() for c in STATE_DDL.split(", ")]
    sets = A.aggregate(df, opts).select(*[F.col(c).cast(t).alias(c) for c, t in columns])
    files = sorted((r[FILE_COLUMN], r["rows"], r["first"], r["last"]) for r in per_file)
    named = df.sparkSession.createDataFrame(
        [(FILES_SET, None, None, None, None, f, n, 0, a, b) for f, n, a, b in files], STATE_DDL
    )
    return sets.unionByName(named)


def _batch_writer(state: str, opts: A.AnalyzeOptions) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function: writes the batch's state rows, replacing any
    earlier attempt of the same batch."""

    def write(df: DataFrame, batch_id: int) -> None:
        from pyspark import StorageLevel

        df = df.persist(StorageLevel.MEMORY_AND_DISK)  # read twice: files and span, then sets
        try:
            rows = state_rows(df, opts)
            rows.write.mode("overwrite").parquet(f"{state}/batch={batch_id}")
        finally:
            df.unpersist()

    return write


def _rollup_writer(state: str) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function of a stream of rollups: their rows are the
    state as they are (each file's row named by its path), written replacing
    any earlier attempt of the same batch."""

    def write(df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        columns = [c.split()[0] for c in STATE_DDL.split(", ")]
        named = F.when(F.col("_set") == F.lit(FILES_SET), F.col(FILE_COLUMN)).otherwise(
            F.col("key")
        )
        rows = df.select(*[named.alias(c) if c == "key" else F.col(c) for c in columns])
        rows.write.mode("overwrite").parquet(f"{state}/batch={batch_id}")

    return write


def reads_rollups(request: Request) -> bool:
    """Whether the stream can read the rollups: prefixes the rollups hold, and
    windows chosen from the span (any of them is a multiple of every rollup's)."""
    opts = request.options
    # The directory must take the rollups of captures that arrive without one.
    writable = os.access(request.captures[0], os.W_OK | os.X_OK)
    return (
        not request.raw
        and opts.window_seconds is None
        and opts.depth <= R.ROLLUP_DEPTH
        and writable
    )


def roll_up_missing(files: dict[str, int], skip_bad: bool = False) -> int:
    """Roll up, beside them, the capture ``files`` (path: rows) without a usable
    rollup; how many were made.  A file that cannot be read is refused
    (InputError), or left out with ``skip_bad``."""
    import pyarrow as pa

    made = 0
    for path, rows in sorted(files.items()):
        if R.usable(R.rollup_path(path), rows) is None:
            try:
                R.roll_up_file(path)
            except (OSError, pa.ArrowException) as exc:
                if skip_bad:
                    continue
                raise I.InputError(
                    f"unreadable capture file {path} ({first_line(exc)}); "
                    "give --skip-bad-files to follow the rest"
                ) from None
            made += 1
    return made


def checkpoint_dir(request: Request, watch: FollowOptions) -> Path:
    """--checkpoint, else OUT.checkpoint beside --out; refused inside an input or --out."""
    given = watch.checkpoint or str(Path(request.out).resolve()) + CHECKPOINT_SUFFIX
    root = Path(given).resolve()
    for p in [*request.captures, request.out]:
        other = Path(p).resolve()
        if root == other or other in root.parents or root in other.parents:
            raise I.InputError(f"--checkpoint {given} overlaps {p}: give a directory of its own")
    return root


def _check_options(root: Path, request: Request) -> None:
    """The checkpoint's state holds prefixes at one depth and windows of one length:
    a restart must ask for the same, or use a new checkpoint."""
    opts = request.options
    mine = {
        "captures": str(Path(request.captures[0]).resolve()),
        "depth": opts.depth,
        "window_seconds": opts.window_seconds,
        "reads": "rollups" if reads_rollups(request) else "captures",
    }
    path = root / OPTIONS_FILE
    if path.exists():
        try:
            theirs = json.loads(path.read_text())
        except ValueError:
            theirs = {}
        for key, value in mine.items():
            if theirs.get(key) != value:
                raise I.InputError(
                    f"the checkpoint {root} was made with {key} {theirs.get(key)!r}, "
                    f"not {value!r}: give the same, or a new --checkpoint"
                )
        return
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine) + "\n")


def check(request: Request, watch: FollowOptions, say: Callable[[str], None]) -> Path:
    """What --follow refuses before anything starts; the checkpoint directory.  A
    capture directory that does not exist is refused (a mistyped name would
    otherwise be watched for ever): ``record`` creates it with its first file."""
    if len(request.captures) != 1:
        raise I.InputError("--follow watches one capture directory: give exactly one")
    directory = Path(request.captures[0])
    if I.is_url(request.out) or I.is_url(str(directory)):
        raise I.InputError("--follow reads and writes local paths, not URLs")
    if directory.exists() and not directory.is_dir():
        raise I.InputError(f"--follow watches a capture directory; {directory} is a file")
    if not directory.exists():
        raise I.InputError(
            f"no such capture directory: {directory} (--follow watches the directory "
            f"`sbus-relay record --out DIR` writes into: check the name, or start record first)"
        )
    I.check_output(request.out, request.captures)
    root = checkpoint_dir(request, watch)
    _check_options(root, request)
    return root


class Summed:
    """The committed state summed on the driver (``rollup.sum_stored``), batch by
    batch: a committed batch never changes, so each update reads only the
    batches committed since the last one and adds them to the sums, which stay
    the size of the aggregates (prefixes, windows, sizes, keys), not of the
    batches read.  A fresh one (a restart) reads the compacted state first."""

    def __init__(self) -> None:
        #: The last batch in ``sums`` (-1: none yet).
        self.upto = -1
        self.sums: Any = None

    def add(self, state: State, upto: int) -> Any:
        """The sums of the committed state up to batch ``upto``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.sums is None or self.upto < state.compacted():
            self.upto, self.sums = -1, None
            paths = state.paths(upto)
        else:
            paths = [str(state.sets / f"batch={b}") for b in range(self.upto + 1, upto + 1)]
        parts = [] if self.sums is None else [self.sums]
        for path in paths:
            for f in sorted(Path(path).glob("*.parquet")):
                table = pq.read_table(f)
                parts.append(
                    pa.Table.from_arrays(
                        [table[c.name].cast(c.type) for c in R.ROLLUP_SCHEMA],
                        schema=R.ROLLUP_SCHEMA,
                    )
                )
        if len(parts) > 1 or self.upto < 0:
            self.sums = R.sum_stored(parts)
        self.upto = upto
        return self.sums


def update(
    spark: SparkSession,
    state: State,
    upto: int,
    request: Request,
    staging: Path,
    summed: Summed,
    renderer: Renderer | None = None,
) -> dict[str, Any]:
    """The tables, summary and report of the state up to batch ``upto``, into
    ``staging``: the state summed with pyarrow on the driver (``summed``, then
    ``analyze.compute_local``), the tables derived as a batch run derives them,
    the charts and page drawn by ``renderer``'s warm processes at the same time."""
    import pyarrow.compute as pc

    stored = summed.add(state, upto)
    named = stored.filter(pc.equal(stored["_set"], FILES_SET))
    files = pc.count_distinct(named["key"]).as_py()
    first = pc.min(named["first_ns"]).as_py()
    last = pc.max(named["last_ns"]).as_py()
    base = A.span_options(request.options, first, last)
    job = A.compute_local(stored, base)
    inputs = I.resolve(request.captures, recover_journals=False)
    inputs.notes = []
    result = A.finish(spark, job, request.options, base, inputs, files, staging)
    if request.report:
        from .report import write_report

        write_report(result, staging, drawer=renderer)
    return result.summary


def compact(spark: SparkSession, state: State, upto: int) -> None:
    """Sum the state up to batch ``upto`` into ``compact-<upto>`` and remove what it holds."""
    from pyspark.sql import functions as F

    stored = spark.read.schema(STATE_DDL).parquet(*state.paths(upto))
    is_file = F.col("_set") == F.lit(FILES_SET)
    first, last = stored.where(is_file).agg(F.min("first_ns"), F.max("last_ns")).collect()[0]
    window_ns = state_window(None if first is None else last - first)
    done = state.sets / f"compact-{upto}"
    tmp = state.sets / f".compact-{upto}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    A.reaggregate(stored, window_ns).write.parquet(str(tmp))
    os.rename(tmp, done)
    for entry in os.scandir(state.sets):
        name = entry.name
        number = name.removeprefix("batch=").removeprefix("compact-")
        if number.isdigit() and int(number) <= upto and entry.path != str(done):
            shutil.rmtree(entry.path, ignore_errors=True)


def _new_files(directory: str, seen: set[str]) -> list[str]:
    """Capture files that appeared since the last look (not yet checked)."""
    now = {str(p) for p in Path(directory).rglob(f"*{CAPTURE_SUFFIX}") if p.is_file()}
    fresh = sorted(now - seen)
    seen |= now
    return fresh


def follow(
    request: Request,
    watch: FollowOptions,
    say: Callable[[str], None],
    on_interrupt: Callable[[], None],
    show: Callable[[str], None],
) -> str:
    """Run until Ctrl-C (or a failure); the line that says where things were left."""
    new_checkpoint = not (checkpoint_dir(request, watch) / OPTIONS_FILE).exists()
    root = check(request, watch, say)
    try:
        return _follow(request, watch, root, say, on_interrupt, show)
    except Exception:
        # A run that failed before its first batch leaves no checkpoint it made.
        if new_checkpoint and State(root).committed() < 0:
            shutil.rmtree(root, ignore_errors=True)
        raise


def _follow(
    request: Request,
    watch: FollowOptions,
    root: Path,
    say: Callable[[str], None],
    on_interrupt: Callable[[], None],
    show: Callable[[str], None],
) -> str:
    state = State(root)
    directory = request.captures[0]
    found = recover([directory]).line()
    if found:
        say(found)
    rollups = reads_rollups(request)
    bytes_now = 0
    if capture_files(request.captures):
        skip = request.skip_bad_files
        inputs = I.resolve(request.captures, skip_bad=skip, recover_journals=False)
        bytes_now = inputs.bytes
        made = roll_up_missing(inputs.file_rows, skip) if rollups else 0
        if made:
            say(f"rolled up {made} capture {plural(made, 'file')} without a rollup, beside it")
    seen: set[str] = set()
    _new_files(directory, seen)
    log = jvm_log_path(root)  # beside the state: a crash leaves it with the checkpoint
    session: Session | None = None
    reported = -1
    failed = False
    # Started first: its processes import matplotlib and plotly while Spark starts.
    renderer = Renderer() if request.report else None
    try:
        with classarchive.running(), Interrupts(on_interrupt) as interrupts:
            try:
                heap = A.heap_mib(bytes_now)
                session = start_spark(request.spark, heap, log, interrupts, "sbus-follow")
                interrupts.arm()
                spark = session.spark
                from pyspark.sql import functions as F

                session.configure(A.partitioning(bytes_now, session.parallelism()))
                where = str(Path(directory).resolve())
                if rollups:
                    stream = (
                        spark.readStream.schema(STATE_DDL)
                        .option("pathGlobFilter", f"*{ROLLUP_SUFFIX}")
                        .option("recursiveFileLookup", "true")
                        .parquet(where)
                        .select("*", F.col("_metadata.file_path").alias(FILE_COLUMN))
                    )
                    writer = _rollup_writer(str(state.sets))
                else:
                    stream = (
                        spark.readStream.schema(A.CAPTURE_DDL)
                        .option("pathGlobFilter", f"*{CAPTURE_SUFFIX}")
                        .option("recursiveFileLookup", "true")
                        .parquet(where)
                        .select(*A.SCANNED, F.col("_metadata.file_path").alias(FILE_COLUMN))
                    )
                    writer = _batch_writer(str(state.sets), request.options)
                query = (
                    stream.writeStream.foreachBatch(writer)
                    .option("checkpointLocation", str(state.stream))
                    .trigger(processingTime=f"{watch.trigger_seconds} seconds")
                    .queryName(f"sbus-follow-{os.getpid()}")
                    .start()
                )
                say(
                    f"following {directory}: the report in {request.out} is rewritten after "
                    f"each new capture file; Ctrl-C stops (a restart carries on from {root})"
                )
                reported = _watch(
                    spark, query, state, request, directory, seen, rollups, say, show, renderer
                )
            except BaseException as exc:
                ending, session = session, None
                interrupts.end(exc, ending)
            finally:
                if session is not None:
                    session.stop()
    except KeyboardInterrupt:
        upto = "nothing yet" if state.committed() < 0 else f"batch {state.committed()}"
        return f"stopped; {request.out} is current up to {upto}; a restart carries on from {root}"
    except Exception as exc:
        if not is_spark_error(exc):
            raise
        failed = True
        kept = keep_log(log, request.out)
        raise SparkFailed(f"Spark failed: {first_line(exc)}; Spark's log: {kept}") from None
    finally:
        if renderer is not None:
            renderer.close()
        if not failed:
            drop_log(log)  # stopped, or an error of ours: nothing in it says why
    return f"stopped after batch {reported}"


def batches_label(reported: int, committed: int) -> str:
    """``batch 4``, or ``batches 3-4`` when one update covers several batches
    (they committed while the previous update ran): every batch is named once."""
    first = reported + 1
    return f"batch {committed}" if first >= committed else f"batches {first}-{committed}"


def _watch(
    spark: SparkSession,
    query: Any,
    state: State,
    request: Request,
    directory: str,
    seen: set[str],
    rollups: bool,
    say: Callable[[str], None],
    show: Callable[[str], None],
    renderer: Renderer | None,
) -> int:
    """The driver's loop: each committed batch becomes a new report (until Ctrl-C)."""
    reported = -1
    last_recovery = 0.0
    summed = Summed()
    while True:
        if not query.isActive:
            error = query.exception()
            raise SparkFailed(f"the stream stopped: {first_line(error) if error else 'no reason'}")
        now = time.monotonic()
        if now - last_recovery >= FOLLOW_TRIGGER_SECONDS:
            last_recovery = now
            # A journal still being written is the usual state here: not news.
            found = recover([directory])
            found.in_use = []
            if found.line():
                say(str(found.line()))
            fresh = _new_files(directory, seen)
            if fresh:
                new = I.resolve(fresh, recover_journals=False)  # InputError for a foreign file
                if rollups:  # those another tool wrote
                    roll_up_missing(new.file_rows, request.skip_bad_files)
        committed = state.committed()
        if committed > reported:
            t0 = time.monotonic()
            staging = I.staging_dir(request.out)
            try:
                summary = update(spark, state, committed, request, staging, summed, renderer)
                I.swap_into_place(staging, request.out)
            finally:
                I.discard(staging)
            label = batches_label(reported, committed)
            reported = committed
            files, messages = summary["inputs"]["files"], summary["messages"]
            show(
                f"{label}: {messages:,} {plural(messages, 'message')} from "
                f"{files:,} {plural(files, 'file')}; report updated in "
                f"{time.monotonic() - t0:.1f} s"
            )
            if committed - max(state.compacted(), 0) >= COMPACT_BATCHES:
                compact(spark, state, committed)
        time.sleep(POLL_SECONDS)
