"""The one line a Spark failure is shown as, and its hint, from Spark's own text
(no JVM: the texts are as Spark 4 prints them)."""

from __future__ import annotations

import pytest

from sbus_relay.pipeline.runner import Request, failure
from sbus_relay.pipeline.session import first_line

pytestmark = pytest.mark.timeout(10)

READ_FAILED = (
    "An error occurred while calling o34.collectToPython.\n"
    ": org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while"
    " reading file file:///cap/capture-2.parquet.  SQLSTATE: KD001\n"
    "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.cannotReadFilesError(...)\n"
    "Caused by: java.io.IOException: can not read class org.apache.parquet.format.PageHeader\n"
    "\t... 23 more\n"
)

#: Two stages failed at once: adaptive execution gathers them under one class,
#: whose own line says nothing of what failed (seen in a loaded CI run).
GATHERED = (
    "An error occurred while calling o34.collectToPython.\n"
    ": org.apache.spark.SparkException: [STAGE_MATERIALIZATION_MULTIPLE_FAILURES] Multiple"
    " failures (2) in stage materialization: \n"
    "  1. SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while reading file"
    " file:///cap/capture-2.parquet.  SQLSTATE: KD001\n"
    "  2. SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while reading file"
    " file:///cap/capture-3.parquet.  SQLSTATE: KD001 SQLSTATE: XX000\n"
    "Caused by: org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error"
    " while reading file file:///cap/capture-2.parquet.  SQLSTATE: KD001\n"
    "\t... 1 more\n"
)


class SparkError(Exception):
    """Stands for py4j's error: its text is the Java exception and stack."""


def test_the_line_with_an_error_class_is_shown() -> None:
    assert first_line(SparkError(READ_FAILED)) == (
        "org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while"
        " reading file file:///cap/capture-2.parquet.  SQLSTATE: KD001"
    )


def test_gathered_failures_show_the_first_one_gathered() -> None:
    assert first_line(SparkError(GATHERED)) == (
        "SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while reading file"
        " file:///cap/capture-2.parquet.  SQLSTATE: KD001"
    )


def test_a_gathering_class_alone_is_still_shown() -> None:
    text = ": org.apache.spark.SparkException: [STAGE_MATERIALIZATION_MULTIPLE_FAILURES] x\n"
    assert "[STAGE_MATERIALIZATION_MULTIPLE_FAILURES] x" in first_line(SparkError(text))


@pytest.mark.parametrize("text", [READ_FAILED, GATHERED])
def test_a_corrupt_file_gets_the_skip_hint(text: str) -> None:
    line = failure(SparkError(text), None, Request(["cap"], "out"), "/run/spark.log")
    assert line.startswith("Spark failed: ") and "try --skip-bad-files" in line
    assert line.endswith("; Spark's log: /run/spark.log")
    skipping = Request(["cap"], "out", skip_bad_files=True)
    assert "--skip-bad-files" not in failure(SparkError(text), None, skipping, "/l")
