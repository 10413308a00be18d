"""Profile the server's hot path with py-spy during a 1 -> 1 run, distinct keys.

What it owns: the profiled 1 -> 1 run and the summary of its samples.  What it
may touch: py-spy, our sbusd, the files it writes.

py-spy samples the running ``sbusd`` from outside.  On the compiled hot path
it reads the native stacks (``--native``: Cython's functions carry their
Python source lines, so ``connection.py:412`` still names the line; the
process is paused for each sample); on the pure-Python path it samples
without pausing (``--nonblocking``).  Two runs, one after the other: one
draws the flame graph (``--format flamegraph``, an SVG), one writes collapsed
stacks (``--format raw``) from which this module sums the samples per
function: *own* time (the function is the leaf of the stack) and *total*
time (the function is anywhere on it).
"""

from __future__ import annotations

import collections
import html
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sbus_relay import accel

from .procs import BenchProcessError, Child, ProcessSet
from .scenarios import Load, Tools, drive, new_address, running_server, server_argv

#: Samples per second asked of py-spy.
SAMPLE_RATE = 250
#: Seconds py-spy gets to attach before the load starts, and to write its file.
ATTACH_DELAY = 1.0
WRITE_GRACE = 15.0
#: Functions listed in the JSON, and source lines printed.
TOP = 20
TOP_LINES = 8
#: The line number py-spy appends to a frame's file: ``name (file.py:12)``.
_LINE_NUMBER = re.compile(r":\d+\)$")
#: The title line of py-spy's flame graph.
_SVG_TITLE = re.compile(r'(<text id="title"[^>]*>)[^<]*(</text>)')


def find_py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise BenchProcessError("py-spy not found (pip install py-spy)")
    return found


def _function(frame: str) -> str:
    """``name (file.py:12)`` -> ``name (file.py)``: a frame without its line number."""
    return _LINE_NUMBER.sub(")", frame)


def summarize(collapsed: str, top: int = TOP) -> dict[str, Any]:
    """Sample counts from py-spy's raw output (frames with line numbers).

    ``own``: per function, samples where it is the innermost frame; ``total``:
    per function, samples where it is anywhere on the stack; ``lines``: per
    source line, samples where it is the innermost frame.
    """
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        lines[frames[-1]] += count
        own[_function(frames[-1])] += count
        for name in {_function(frame) for frame in frames}:
            total[name] += count

    def table(counter: collections.Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": name, "samples": n, "percent": 100.0 * n / samples if samples else 0.0}
            for name, n in counter.most_common(top)
        ]

    return {"samples": samples, "own": table(own), "total": table(total), "lines": table(lines)}


def _recorder(
    procs: ProcessSet, py_spy: str, pid: int, output: Path, fmt: str, native: bool
) -> Child:
    return procs.start(
        f"py-spy-{fmt}",
        [
            py_spy,
            "record",
            "-p",
            str(pid),
            "-o",
            str(output),
            "--format",
            fmt,
            "--rate",
            str(SAMPLE_RATE),
            # The flame graph groups by function; the counts keep the lines.
            *(("--nolineno",) if fmt == "flamegraph" else ()),
            "--native" if native else "--nonblocking",
        ],
    )


def native_stacks(procs: ProcessSet) -> bool:
    """Whether the servers started with ``procs`` run compiled code (sampled natively)."""
    env = procs.env or {}
    return accel.compiled() and env.get(accel.PURE_PYTHON_ENV, "") in ("", "0")


def _retitle(svg: Path, title: str) -> None:
    """Put ``title`` where py-spy writes its own command line (local paths and a pid)."""
    text = svg.read_text()
    svg.write_text(_SVG_TITLE.sub(lambda m: m.group(1) + html.escape(title) + m.group(2), text, 1))


def profile_one_to_one(
    procs: ProcessSet, tools: Tools, workdir: Path, messages: int, output: Path, idle_s: float
) -> dict[str, Any]:
    """Run 1 -> 1 (distinct keys) under py-spy: a flame graph SVG at ``output``,
    collapsed stacks beside it (``.txt``); return the summary of the stacks."""
    try:
        py_spy = find_py_spy()
    except BenchProcessError as exc:
        return {"status": "unavailable", "reason": str(exc)}
    raw = output.with_suffix(".txt")
    bus = new_address(workdir, "prof")
    native = native_stacks(procs)
    with running_server(procs, "ours", server_argv(tools, "ours", bus), bus) as server:
        for target, fmt in ((output, "flamegraph"), (raw, "raw")):
            spy = _recorder(procs, py_spy, server.pid, target, fmt, native)
            time.sleep(ATTACH_DELAY)
            if spy.popen.poll() is not None:
                said = spy.stderr_tail().strip().splitlines() or ["no message"]
                raise BenchProcessError(f"py-spy exited at once: {said[-1]}")
            run = drive(procs, tools, Load(messages), bus, bus, [server], idle_s)
            spy.stop(signal.SIGINT, WRITE_GRACE)
    if output.exists():
        _retitle(output, f"our sbusd, 1 -> 1, distinct keys, {run.rate:,.0f} deliveries/s")
    summary = summarize(raw.read_text() if raw.exists() else "")
    summary.update(
        status="ok",
        output=str(output),
        collapsed=str(raw),
        messages=messages,
        rate=run.rate,
        cpu_us_per_delivery=run.cpu_us_per_delivery,
        native=native,
    )
    return summary


def format_summary(summary: dict[str, Any], top: int = 15) -> str:
    """The printed form: the top functions by own time."""
    if summary.get("status") != "ok":
        return f"profile: {summary.get('reason', 'not run')}"
    cpu = summary["cpu_us_per_delivery"]
    lines = [
        f"py-spy: {summary['samples']} samples of our sbusd during 1 -> 1, distinct keys "
        f"({summary['rate']:,.0f} deliveries/s, {cpu:.2f} us CPU per delivery under the "
        "profiler); top by own time (share, and its part of the CPU per delivery):"
    ]
    for row in summary["own"][:top]:
        share = row["percent"] / 100 * cpu
        lines.append(f"  {row['percent']:5.1f} %  {share:5.2f} us  {row['function']}")
    lines.append("top lines by own time:")
    for row in summary["lines"][:TOP_LINES]:
        lines.append(f"  {row['percent']:5.1f} %  {row['function']}")
    lines.append(f"flame graph: {summary['output']}; collapsed stacks: {summary['collapsed']}")
    return "\n".join(lines)
