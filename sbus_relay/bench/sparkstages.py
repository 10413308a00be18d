"""Where a Spark run's time went, from Spark's own metrics: its event log.

What it owns: reading Spark's event log into stage times.  What it may touch:
the event log files (read only).

A run started with ``EVENT_LOG_CONF`` (``spark.eventLog.*``) leaves one JSON
line per event in the directory; ``stages`` reads the completed stages whose
submission falls within a run's wall-clock interval (a Connect server's log
holds every run, in one growing file), with the metrics Spark sums over each
stage's tasks.  ``table`` prints them, with the time of the run that no stage
covers (the driver: planning, collecting, deriving and writing the tables).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: Settings that make Spark write an uncompressed event log into a directory.
EVENT_LOG_KEYS = ("spark.eventLog.enabled", "spark.eventLog.dir", "spark.eventLog.compress")
#: Longest stage name shown.
MAX_NAME = 60


def event_log_conf(directory: str) -> dict[str, str]:
    values = ("true", f"file://{os.path.abspath(directory)}", "false")
    return dict(zip(EVENT_LOG_KEYS, values, strict=True))


@dataclass
class Stage:
    """One completed stage and its tasks' summed metrics."""

    stage_id: int
    name: str
    tasks: int
    submitted_ms: int
    completed_ms: int
    run_ms: int
    cpu_ms: float
    gc_ms: int
    input_bytes: int
    shuffle_read_bytes: int
    shuffle_write_bytes: int

    @property
    def wall_ms(self) -> int:
        return self.completed_ms - self.submitted_ms


def _metric(accumulables: list[dict[str, object]], name: str) -> int:
    for a in accumulables:
        if a.get("Name") == f"internal.metrics.{name}":
            try:
                return int(str(a.get("Value", 0)))
            except ValueError:
                return 0
    return 0


def _operators(info: dict[str, object]) -> str:
    """What a stage runs, from its RDDs' plan scopes, scan first ("Scan parquet,
    WholeStageCodegen (1), Exchange"): a Connect stage's own name is its session."""
    names: list[str] = []
    rdds = info.get("RDD Info")
    for rdd in sorted(rdds if isinstance(rdds, list) else [], key=lambda r: r.get("RDD ID", 0)):
        try:
            name = str(json.loads(rdd.get("Scope") or "{}").get("name", "")).strip()
        except ValueError:
            continue
        if name and name not in names:
            names.append(name)
    return ", ".join(names)


def stages(directory: str, start_ms: int, end_ms: int) -> list[Stage]:
    """The stages of every event log in ``directory`` submitted within [start, end]."""
    found: list[Stage] = []
    # Spark 4 writes rolling logs: a directory per application, files of events in it.
    for path in sorted(Path(directory).rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        with open(path, errors="replace") as f:
            for line in f:
                if '"SparkListenerStageCompleted"' not in line:
                    continue
                try:
                    info = json.loads(line)["Stage Info"]
                except (ValueError, KeyError):
                    continue  # a line being written
                submitted = int(info.get("Submission Time") or 0)
                if not start_ms <= submitted <= end_ms:
                    continue
                acc = info.get("Accumulables") or []
                found.append(
                    Stage(
                        stage_id=int(info["Stage ID"]),
                        name=_operators(info) or str(info.get("Stage Name", "")),
                        tasks=int(info.get("Number of Tasks", 0)),
                        submitted_ms=submitted,
                        completed_ms=int(info.get("Completion Time") or submitted),
                        run_ms=_metric(acc, "executorRunTime"),
                        cpu_ms=_metric(acc, "executorCpuTime") / 1e6,
                        gc_ms=_metric(acc, "jvmGCTime"),
                        input_bytes=_metric(acc, "input.bytesRead"),
                        shuffle_read_bytes=_metric(acc, "shuffle.read.remoteBytesRead")
                        + _metric(acc, "shuffle.read.localBytesRead"),
                        shuffle_write_bytes=_metric(acc, "shuffle.write.bytesWritten"),
                    )
                )
    return sorted(found, key=lambda s: (s.submitted_ms, s.stage_id))


def covered_ms(found: list[Stage]) -> int:
    """Milliseconds during which at least one stage ran."""
    total, reach = 0, 0
    for s in sorted(found, key=lambda s: s.submitted_ms):
        start = max(s.submitted_ms, reach)
        if s.completed_ms > start:
            total += s.completed_ms - start
        reach = max(reach, s.completed_ms)
    return total


def table(found: list[Stage], wall_s: float) -> list[str]:
    """Markdown lines: one per stage, then the time outside every stage."""
    mib = 2**20
    lines = [
        "| stage | tasks | wall | task time | CPU | GC | input | shuffle read | shuffle write |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in found:
        name = s.name if len(s.name) <= MAX_NAME else s.name[: MAX_NAME - 1] + "…"
        lines.append(
            f"| {s.stage_id} {name} | {s.tasks} | {s.wall_ms / 1000:.2f} s | "
            f"{s.run_ms / 1000:.2f} s | {s.cpu_ms / 1000:.2f} s | {s.gc_ms / 1000:.2f} s | "
            f"{s.input_bytes / mib:,.0f} MiB | {s.shuffle_read_bytes / mib:,.1f} MiB | "
            f"{s.shuffle_write_bytes / mib:,.1f} MiB |"
        )
    outside = wall_s - covered_ms(found) / 1000
    lines.append(
        f"| outside any stage (client, planning, results to the driver, tables) | | "
        f"{outside:.2f} s | | | | | | |"
    )
    return lines
