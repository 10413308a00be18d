"""``sbus-relay bench``: throughput, latency and memory of the bus, measured.

The load comes from ``loadgen.c`` and the "limit baseline" from ``forwarder.c``,
both compiled on first use with the system ``gcc -O2`` (``build``).  ``runner``
starts every server it measures as a real process, drives the scenarios of
``scenarios`` and ``report`` turns the medians into the table and the JSON.
See docs/performance.md.
"""
