"""Shared fixtures of the pipeline tests: one SparkSession for the whole run.

Starting Spark costs about 6 s, so every Spark test shares one session
(``local[2]``, UI off, 2 shuffle partitions, as in CI).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Seconds every Spark test may take: JVM start, plus a few small jobs.
SPARK_TEST_TIMEOUT = 300


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The test run's one SparkSession."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        # Without a JDK, skip on a workstation, but fail in CI (.ci/run sets CI),
        # where a silently skipped Spark suite would be a test that cannot fail.
        if os.environ.get("CI"):
            pytest.fail("no Java found (JAVA_HOME or java on PATH): Spark needs OpenJDK 17")
        pytest.skip("no Java (JAVA_HOME or java on PATH) for Spark")

    # Python workers must be this interpreter (it has pyarrow and sbus_relay).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sbus-relay-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
