"""The data pipeline: record bus traffic to Parquet, analyse it with Spark.

What it owns: nothing but this map of the pipeline's modules.  What it may
touch: nothing.

Modules (see ``docs/pipeline.md``):

- ``capture``: the capture format, the crash-safe writer (journal, then Parquet),
  recovery of a killed recorder's journal, and the loss log.
- ``rollup``: a capture file's aggregates, written when it is closed;
  ``sources``: whether a run reads a capture's rollup or its raw rows.
- ``recorder``: a bus client that feeds the writer and counts what the bus
  dropped for it (``sbus-relay record``).
- ``inputs``: what ``analyze`` reads (checked captures only) and how it replaces
  its output (atomically).
- ``runner``: one ``analyze`` run from start to end (the command parses and calls it).
- ``session``: the Spark it runs on (a JVM of its own, a cluster, a Connect
  server) and its settings; ``classarchive``: the JVM's class archive.
- ``analyze``: the PySpark job behind ``sbus-relay analyze`` and ``spark-submit``;
  ``derive``: the tables from its aggregates; ``windows``: window lengths;
  ``partial``: raw rows summed in Spark's Python workers with pyarrow.
- ``follow``: ``analyze --follow``, the job kept current by Structured Streaming.
- ``connect``: the Spark Connect server of ``sbus-relay spark-server``.
- ``report``: the Markdown report with PNG charts (matplotlib) and the
  self-contained HTML report (plotly).
- ``datasource``: the ``sbus`` Spark data source (streaming read and write).

The benchmarks, the synthetic captures, the DuckDB peer and the standalone
cluster of the tests and the benchmark are in ``sbus_relay/bench/``.

The core bus never imports this package: pyarrow, pyspark, matplotlib and
plotly are the optional ``spark`` extra (``pip install 'sbus_relay[spark]'``).
"""
