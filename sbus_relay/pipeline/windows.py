"""Window lengths: which one a capture gets, and which ones sum into which.

What it owns: window lengths and which sum into which.  What it may touch:
nothing (pure functions).

Windows are tumbling and aligned on the Unix epoch, so counts kept in windows
of one length sum exactly into windows of any multiple of it.  A capture's
window is chosen in two steps: from its span (``auto_window``: a nice length
giving at most TARGET_WINDOWS windows), then from its traffic's rhythm
(``rhythm_window``, from the counts in the first).  ``state_window`` is the
length ``follow`` keeps counts in while the span still grows, and
``recorded_windows`` how many windows the burst medians run over.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Sequence
from typing import Any

#: Window lengths (seconds) the default window is chosen from: easy to read.
NICE_WINDOWS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30,
    60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
)  # fmt: skip
#: Most windows the default window gives over the capture (the least is about 100).
TARGET_WINDOWS = 500
#: Fewer windows holding traffic than this tell no rhythm (see ``rhythm_window``).
RHYTHM_MIN_WINDOWS = 8


def auto_window(span_ns: int | None) -> float:
    """The default window for a capture spanning ``span_ns``: the shortest nice
    length giving at most TARGET_WINDOWS windows (so about 100 to 500)."""
    if not span_ns or span_ns <= 0:
        return 1.0
    for w in NICE_WINDOWS:
        if span_ns / (w * 1e9) <= TARGET_WINDOWS:
            return float(w)
    return float(NICE_WINDOWS[-1])


def state_window(span_ns: int | None) -> int:
    """Windows (ns) to keep counts in when later windows may be longer: the
    longest nice window that divides ``auto_window(span_ns)`` and every longer
    nice window, so that counts kept in it sum exactly into any window a longer
    span (or the traffic's rhythm) later asks for.  At most five times shorter
    than the span's window (1 s for 2 s, 5 s for 10 s)."""
    window = round(auto_window(span_ns) * 1e9)
    nice = [round(n * 1e9) for n in NICE_WINDOWS]
    longer = [n for n in nice if n >= window]
    for candidate in reversed([n for n in nice if n <= window]):
        if all(n % candidate == 0 for n in longer):
            return candidate
    return nice[0]


def rhythm_window(cells: Any, window_ns: int) -> int:
    """The window for judging bursts against the traffic's own rhythm (nanoseconds).

    ``cells`` hold messages per window of ``window_ns`` (the span's window,
    ``auto_window``).  Traffic that comes in batches, say once a second, leaves
    most of those windows empty when they are shorter than its period, and then
    every batch would stand out as a burst.  So: the median gap between
    consecutive windows that hold traffic, in windows; when it is more than one,
    the shortest nice window that is a multiple of ``window_ns`` (the cells then
    re-bin exactly) and spans that gap.  Fewer than RHYTHM_MIN_WINDOWS windows
    with traffic tell no rhythm: the window is kept."""
    import pyarrow.compute as pc

    if not cells.num_rows:
        return window_ns
    starts = pc.unique(cells.filter(pc.greater(cells["messages"], 0))["window_start_ns"])
    active = sorted(starts.to_pylist())
    if len(active) < RHYTHM_MIN_WINDOWS:
        return window_ns
    gap = statistics.median((b - a) // window_ns for a, b in itertools.pairwise(active))
    if gap <= 1:
        return window_ns
    for nice in NICE_WINDOWS:
        n = round(nice * 1e9)
        if n >= gap * window_ns and n % window_ns == 0:
            return n
    return window_ns


def recorded_windows(
    window_ns: int,
    first_ns: int | None,
    last_ns: int | None,
    sessions: Sequence[tuple[int, int]],
    active: Sequence[int],
) -> int:
    """How many windows of ``window_ns`` a recorder was running in: those that
    overlap a recorder session (start, end), and any that holds traffic.  Without
    sessions (captures not written by ``record``, or URLs), every window from
    ``first_ns`` to ``last_ns``: the gaps between sessions are not traffic that
    stopped, and bursts are judged against the recorded windows only."""
    if first_ns is None or last_ns is None:
        return 1
    if not sessions:
        return last_ns // window_ns - first_ns // window_ns + 1
    merged: list[list[int]] = []
    for lo, hi in sorted((s // window_ns, e // window_ns) for s, e in sessions):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    count = sum(hi - lo + 1 for lo, hi in merged)
    starts = [lo for lo, _ in merged]
    for k in {w // window_ns for w in active}:
        i = bisect.bisect_right(starts, k) - 1
        if i < 0 or k > merged[i][1]:
            count += 1
    return count
