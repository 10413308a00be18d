"""Defaults and file-layout constants of the pipeline, with no heavy imports.

The command modules read these for ``--help`` without importing pyarrow or
pyspark (the optional ``spark`` extra), so ``sbus-relay --help`` works without it.
"""

from __future__ import annotations

# --- capture files (record) ------------------------------------------------------
#: Suffix of finished capture files; the only ones the analyser reads.
CAPTURE_SUFFIX = ".parquet"
#: Suffix of the file being written; renamed to CAPTURE_SUFFIX on close.
PARTIAL_SUFFIX = ".parquet.partial"
#: Default rotation size: large enough for efficient Spark scans, small enough to copy.
ROTATE_BYTES = 256 * 1024 * 1024
#: Default rotation age, seconds: a crash loses at most this much (the open file).
ROTATE_SECONDS = 300.0

# --- analysis (analyze) --------------------------------------------------------
#: Default prefix depth: ``service/topic`` is the usual key family in practice.
DEFAULT_DEPTH = 2
#: Default window, seconds: minute resolution reads well over hours to days.
DEFAULT_WINDOW_SECONDS = 60.0
#: Default number of top keys kept (by messages and by bytes).
DEFAULT_TOP = 20
#: Default burst threshold as a multiple of the median window.
DEFAULT_BURST_FACTOR = 4.0
#: Default floor for a burst, so that 1 -> 4 messages is not called a burst.
DEFAULT_BURST_MIN_MESSAGES = 10
