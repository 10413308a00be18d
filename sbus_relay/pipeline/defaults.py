"""Defaults and file-layout constants of the pipeline, with no heavy imports.

What it owns: the pipeline's defaults and file-layout constants.  What it may
touch: nothing.

The command modules read these for ``--help`` without importing pyarrow or
pyspark (the optional ``spark`` extra), so ``sbus-relay --help`` works without it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

#: Modules of the optional ``spark`` extra, in the order they are checked.
EXTRA_MODULES = ("pyarrow", "pyspark", "matplotlib", "plotly")


def missing_extra(modules: tuple[str, ...] = EXTRA_MODULES) -> str | None:
    """One line saying how to install the ``spark`` extra if any of ``modules`` is
    missing, else None.  Checked without importing them (fast, no side effects)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    pip = Path(sys.executable).with_name("pip")
    pip_cmd = str(pip) if pip.exists() else "pip"
    how = (
        f"{pip_cmd} install 'sbus_relay[spark]' "
        f"(from a source checkout: {pip_cmd} install -e '.[spark]')"
    )
    return f"needs {', '.join(missing)} (the optional 'spark' extra); install it with: {how}"


# --- capture files (record) ------------------------------------------------------
#: Suffix of finished capture files; the only ones the analyser reads.
CAPTURE_SUFFIX = ".parquet"
#: Suffix of the journal being written (Arrow IPC stream); becomes CAPTURE_SUFFIX on rotation.
JOURNAL_SUFFIX = ".arrow.partial"
#: Suffix of the open file in the previous format (Parquet without footer): unrecoverable.
LEGACY_PARTIAL_SUFFIX = ".parquet.partial"
#: Suffix of a Parquet file being converted from a journal, before its rename.
TMP_SUFFIX = ".tmp"
#: Suffix of a capture file's rollup (Parquet, ``rollup``), beside it: not a
#: capture file (a different suffix), so nothing that lists captures reads it.
ROLLUP_SUFFIX = ".rollup"
#: Suffix of a recorder session's loss log (JSON lines).
LOSS_SUFFIX = ".loss.jsonl"
#: Default rotation size (journal bytes): large enough for efficient Spark scans.
ROTATE_BYTES = 256 * 1024 * 1024
#: Default rotation age, seconds: bounds the number of files, not what a crash loses.
ROTATE_SECONDS = 300.0
#: Seconds between journal appends.  The promise is that a crash or kill -9 loses
#: at most the last second of traffic; appending twice as often keeps it when a
#: tick comes late or the recorder reads behind the bus on a loaded machine.
FLUSH_SECONDS = 0.5

# --- analysis (analyze) --------------------------------------------------------
#: Default prefix depth: ``service/topic`` is the usual key family in practice.
DEFAULT_DEPTH = 2
#: Window, seconds, for ``compute`` called without a window and without a span to
#: adapt to (analyze itself adapts the window to the capture: ``auto_window``).
DEFAULT_WINDOW_SECONDS = 60.0
#: Default number of top keys kept (by messages and by bytes).
DEFAULT_TOP = 20
#: Default burst threshold as a multiple of the median window.
DEFAULT_BURST_FACTOR = 4.0
#: Default floor for a burst, so that 1 -> 4 messages is not called a burst.
DEFAULT_BURST_MIN_MESSAGES = 10
#: Seconds between a followed analysis's looks for new capture files (``--trigger``):
#: a closed file shows in the report about this plus the update's own time later.
FOLLOW_TRIGGER_SECONDS = 1.0

# --- the Spark Connect server (spark-server) ------------------------------------
#: Where the server listens unless told: this machine only (it has no authentication).
CONNECT_HOST = "127.0.0.1"
#: Spark Connect's own default port.
CONNECT_PORT = 15002
#: The server's driver heap unless --memory: analyze's largest per-run heap.
CONNECT_MEMORY = "4g"
