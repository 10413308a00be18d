"""Shared fixtures of the pipeline tests: one SparkSession for the whole run.

Starting Spark costs about 6 s, so every Spark test shares one session
(``local[2]``, UI off, 2 shuffle partitions, as in CI).
"""

from __future__ import annotations

import os
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
