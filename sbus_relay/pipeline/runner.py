"""One ``analyze`` run from start to end: what the command calls once it has parsed.

What it owns: one analyze run's order of steps and its failures.  What it may
touch: inputs, sources, session, analyze and report, through their functions.

In order: the options and inputs are checked (a refused run starts nothing and
writes nothing: ``InputError``); captures without a rollup are rolled up
(``sources``); Spark is started or joined (``session``); the
job (``analyze``) writes into a fresh directory beside ``--out``; the report is
drawn; the directory replaces ``--out``.  A failure of Spark is ``SparkFailed``,
one line naming Spark's log; Ctrl-C is said at once (``on_interrupt``), ends
the JVM and leaves ``--out`` as it was (KeyboardInterrupt propagates).  The same
run serves ``sbus-relay analyze`` and ``spark-submit submit.py``; ``follow``
keeps one going.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import classarchive
from . import inputs as I
from .analyze import AnalyzeOptions, heap_mib, partitioning, span_options
from .session import Interrupts, Session, SparkFailed, SparkSettings, first_line, is_spark_error
from .session import start as start_spark
from .sources import Sources, plan

#: Spark's own log of a run that starts a JVM, while it runs: in the run's
#: staging directory beside --out.  Kept only when Spark fails, as
#: ``<out>`` + ``FAILED_LOG_SUFFIX`` beside --out; else it goes with the run.
JVM_LOG = "spark.log"
#: The name of a failed run's Spark log, beside the --out it names.
FAILED_LOG_SUFFIX = ".spark.log"
#: Where the log goes when --out is a URL (no directory of ours beside it).
TEMP_JVM_LOG = "sbus-analyze-{pid}.log"
#: Environment variable naming a file where a run writes where its time went
#: (``_write_timings``): the benchmark's breakdown of a run.
TIMINGS_ENV = "SBUS_ANALYZE_TIMINGS"
#: Words of a Spark failure that point at a capture file rather than at Spark.
FILE_FAILURE_WORDS = ("parquet", "failed_read_file", "corrupt", "file")


@dataclass(frozen=True)
class Request:
    """What to analyse, where to, and on which Spark."""

    captures: list[str]
    out: str
    options: AnalyzeOptions = field(default_factory=AnalyzeOptions)
    spark: SparkSettings = field(default_factory=SparkSettings)
    report: bool = True
    skip_bad_files: bool = False
    #: Read every capture's raw rows, not its rollup (``sources``).
    raw: bool = False


@dataclass
class Outcome:
    """What a run did: its summary and where its time went."""

    summary: dict[str, Any]
    out: str
    #: Seconds: Spark started (or connected), the job, the report, all of it.
    start_s: float
    analysis_s: float
    report_s: float | None
    total_s: float
    #: The Connect server used, or None.
    remote: str | None
    #: Whether a class archive builder was started in the background.
    building_archive: bool = False

    def line(self) -> str:
        """The one line that says what was analysed, what was lost and how long it took."""
        s = self.summary
        started = "connected" if self.remote else "Spark start"
        report = "" if self.report_s is None else f", report {self.report_s:.1f} s"
        return (
            f"analysed {s['messages']:,} {plural(s['messages'], 'message')} "
            f"({s['keys']:,} {plural(s['keys'], 'key')}; {loss_phrase(s['loss'])}) "
            f"in {self.total_s:.1f} s ({started} {self.start_s:.1f} s, "
            f"analysis {self.analysis_s:.1f} s{report}); "
            f"{s['options']['window_seconds']:g} s windows; tables in {self.out}"
        )


def plural(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def loss_phrase(loss: dict[str, Any]) -> str:
    """What the summary says was lost: by the bus, and by recorders that were killed."""
    killed = loss.get("unfinished_sessions") or 0
    if not loss.get("known"):
        said = "loss unknown"
    elif loss["dropped"]:
        said = f"{loss['dropped']:,} lost by the bus"
    else:
        said = "none dropped by the bus" if killed else "nothing lost"
    if killed:
        said += (
            f"; {killed} recorder {plural(killed, 'session')} killed: up to about a second "
            "of traffic before each end is missing"
        )
    return said


def jvm_log_path(directory: Path | None) -> str:
    """Where the JVM logs while a run writes into ``directory`` (the temporary
    directory when there is none)."""
    if directory is None:
        return os.path.join(tempfile.gettempdir(), TEMP_JVM_LOG.format(pid=os.getpid()))
    return str(directory / JVM_LOG)


def keep_log(log: str, out: str) -> str:
    """Move a failed run's log beside ``out`` (a local path) and say where it is
    now; where it cannot be moved, it stays where it was."""
    if I.is_url(out) or not os.path.exists(log):
        return log
    kept = str(Path(out).resolve()) + FAILED_LOG_SUFFIX
    try:
        os.replace(log, kept)
    except OSError:
        return log
    return kept


def drop_log(log: str) -> None:
    """Remove the log of a run that did not fail in Spark: nothing in it worth keeping."""
    with contextlib.suppress(OSError):
        os.unlink(log)


def failure(exc: BaseException, session: Session | None, request: Request, log: str) -> str:
    """The one line for a Spark failure, with where to look."""
    message = first_line(exc)
    remote = session is not None and session.remote is not None
    where = "the Connect server's log" if remote else f"Spark's log: {log}"
    if "JAVA_GATEWAY_EXITED" in message or "Connection refused" in message:
        hint = " (is --master right and the cluster up?)"
    elif request.skip_bad_files or not any(w in message.lower() for w in FILE_FAILURE_WORDS):
        hint = ""
    else:
        hint = " (a corrupt capture file? try --skip-bad-files)"
    return f"Spark failed: {message}{hint}; {where}"


def check(request: Request) -> I.Inputs:
    """The checks that come before Spark: options, output, inputs (InputError)."""
    I.check_output(request.out, request.captures)
    return I.resolve(request.captures, skip_bad=request.skip_bad_files)


def analyze(
    request: Request,
    say: Callable[[str], None],
    on_interrupt: Callable[[], None],
) -> Outcome:
    """Run one analysis (see the module docstring); ``say`` gets the notes on the way."""
    t0 = time.monotonic()
    inputs = check(request)
    for note in inputs.notes:
        say(note)
    settings = request.spark
    if request.skip_bad_files:
        conf = {"spark.sql.files.ignoreCorruptFiles": "true", **settings.conf}
        settings = SparkSettings(settings.master, settings.remote, settings.memory, conf)
    local_out = not I.is_url(request.out)
    staging = I.staging_dir(request.out) if local_out else None
    try:
        sources = plan_sources(request, inputs, staging)
    except BaseException:
        if staging is not None:
            I.discard(staging)
        raise
    for line in sources.lines():
        say(line)
    t_inputs = time.monotonic()
    log = jvm_log_path(staging)
    session: Session | None = None
    failed = False
    try:
        with classarchive.running(), Interrupts(on_interrupt) as interrupts:
            try:
                session = start_spark(
                    settings, heap_mib(inputs.bytes), log, interrupts, shared=True
                )
                t_session = time.monotonic()
                interrupts.arm()
                session.configure(partitioning(inputs.bytes, session.parallelism()))
                from .analyze import run

                out = str(staging or request.out)
                result = run(session.spark, inputs, out, request.options, sources, say)
                t_analysis = time.monotonic()
            except BaseException as exc:
                ending, session = session, None
                interrupts.end(exc, ending)
            finally:
                if session is not None:
                    session.stop()
        jvm = session.jvm if session is not None else None
        if classarchive.writing() is not None and not classarchive.wait_for_dump(jvm):
            raise SparkFailed("the JVM did not write its class archive")
        t_stopped = time.monotonic()
        if request.report:
            from .report import write_report

            write_report(result, staging or request.out)
        t_report = time.monotonic()
        drop_log(log)  # a clean run: not part of its output
        if staging is not None:
            I.swap_into_place(staging, request.out)
            staging = None
    except Exception as exc:
        if not is_spark_error(exc):
            raise
        failed = True
        raise SparkFailed(failure(exc, session, request, keep_log(log, request.out))) from None
    finally:
        if not failed:
            drop_log(log)  # interrupted, or an error of ours: nothing in it says why
        if staging is not None:
            I.discard(staging)
    building = (
        session is not None
        and session.jvm is not None
        and session.archive is None
        and not session.fell_back
        and classarchive.build_later()
    )
    outcome = Outcome(
        summary=result.summary,
        out=request.out,
        start_s=t_session - t0,
        analysis_s=t_analysis - t_session,
        report_s=t_report - t_stopped if request.report else None,
        total_s=time.monotonic() - t0,
        remote=session.remote if session is not None else None,
        building_archive=building,
    )
    phases = {
        "inputs": t_inputs - t0,
        "session": t_session - t_inputs,
        "job": result.job_s,
        "tables": result.tables_s,
        "stop": t_stopped - t_analysis,
        "report": t_report - t_stopped,
    }
    _write_timings(phases, time.time() - outcome.total_s, time.time())
    return outcome


def _write_timings(phases: dict[str, float], started: float, ended: float) -> None:
    """Where a run's time went, into the file TIMINGS_ENV names (the benchmark's
    breakdown; nothing when it is not set): seconds per phase, and when
    analyze's clock started and stopped (seconds since the epoch), so that the
    caller sees the time before (the interpreter, its imports) and after."""
    path = os.environ.get(TIMINGS_ENV)
    if not path:
        return
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps({"phases": phases, "started": started, "ended": ended}))


def plan_sources(request: Request, inputs: I.Inputs, staging: Path | None) -> Sources:
    """Which captures the run reads through their rollups, rolling up those
    without one (before Spark starts: pyarrow on this machine)."""
    if not inputs.checked:
        return Sources(raw=list(inputs.paths))
    base = span_options(request.options, inputs.first_ns, inputs.last_ns)
    previous = Path(request.out)
    return plan(
        inputs.file_rows,
        base.depth,
        base.window_ns,
        raw=request.raw,
        out=staging,
        previous=previous if I.is_analyze_output(previous) else None,
        directories=inputs.directories,
    )


def archive_note() -> str:
    """The line said when a class archive starts being built in the background."""
    return (
        f"note: building a class archive in the background so that Spark starts "
        f"faster next time (about 175 MB in {classarchive.cache_dir()}; once per Java "
        f"and pyspark install; {classarchive.ENV_SWITCH}=0 turns it off)"
    )
