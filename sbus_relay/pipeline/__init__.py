"""The data pipeline: record bus traffic to Parquet, analyse it with Spark.

Modules (see ``docs/pipeline.md``):

- ``capture``: the capture file format and the crash-safe rotating Parquet writer (pyarrow).
- ``recorder``: a bus client that feeds the writer (``sbus-relay record``).
- ``analyze``: the PySpark job behind ``sbus-relay analyze`` and ``spark-submit``.
- ``report``: the Markdown report and its PNG charts (matplotlib).
- ``datasource``: the ``sbus`` Spark data source (streaming read and write).
- ``synth``: synthetic captures for tests and benchmarks.

The core bus never imports this package: pyarrow, pyspark and matplotlib are the
optional ``spark`` extra (``pip install .[spark]``).
"""
