"""Entry point for ``spark-submit``: the ``analyze`` command as a script.

What it owns: the spark-submit entry point.  What it may touch: cli.analyze.

    spark-submit --master spark://host:7077 sbus_relay/cli/submit.py \\
        /shared/captures --out /shared/report

Takes exactly the options of ``sbus-relay analyze``; without ``--master`` the
master given to spark-submit is kept.  Executors need no sbus_relay install:
rollups are read with built-in Spark SQL functions, and the raw rows of capture
files are summed by Python workers with pyarrow, by functions shipped with the
job (where the executors have no Python of the driver's version with pyarrow,
Spark SQL sums them instead, more slowly, and the run says so).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the analyze options and run the job (the script's whole life)."""
    from sbus_relay.cli import analyze  # the command this script runs

    parser = argparse.ArgumentParser(prog="submit.py", description="sbus capture analysis")
    analyze.add_arguments(parser)
    return analyze.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
