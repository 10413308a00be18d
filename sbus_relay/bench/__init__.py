"""``sbus-relay bench``: throughput, latency, CPU and memory of the bus, measured.

What it owns: nothing but this map of the benchmark's modules.  What it may
touch: nothing.

The load comes from ``loadgen.c``, compiled on first use with the system
``gcc -O2`` (``build``); the reference C sbusd it is compared with is found or
built by ``reference``.  ``runner`` starts every server it measures as a real
process and runs the scenarios of ``scenarios`` interleaved on every side;
``report`` turns the medians into the tables, the targets and the JSON;
``profile`` samples our server with py-spy.  See docs/performance.md.
"""
