"""The process a terminal started a bus with, once it has handed the bus over.

What it owns: the entry point of the process that keeps a terminal's
foreground.  What it may touch: ops.foreground.

``serve`` replaces itself with this (``python -m sbus_relay.cli.foreground``,
not a command of ``sbus-relay``) when a live upgrade found it in its
terminal's foreground: a fresh interpreter that holds none of the bus's
memory waits for the bus that serves now, passes signals on to it, and exits
with its status (``ops.foreground``; docs/deploy.md, "A bus in the foreground
of a terminal").
"""

from __future__ import annotations

import sys

from sbus_relay.ops.foreground import keep


def main() -> None:
    """Wait for the bus; exit with its status.  The arguments: the numbers of
    the signals the bus's process got once it had handed over, to pass on."""
    sys.exit(keep([int(arg) for arg in sys.argv[1:] if arg.isdigit()]))


if __name__ == "__main__":
    main()
