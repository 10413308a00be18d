"""Record bus traffic to rotating Parquet files: sbus-relay record [PATTERN...] --out DIR.

What it owns: the record command: its arguments, its progress line and its
exit status.  What it may touch: pipeline.recorder and its writer.

Subscribes to the patterns (default ``""``: everything that is not secret; the
server never delivers ``!/cred/`` keys through it, docs/protocol.md) and writes zstd
Parquet files (receive time in ns, key, payload size, payload, instance),
rotated by size and age.  Rows reach a journal at least twice a second, so a
crash loses at most the last second; the next run recovers what a killed one left.
SIGINT/SIGTERM finish the files cleanly.  Messages the bus dropped for the
recorder are counted (the drop query), logged beside the files, shown in the
summary, and make the exit status EXIT_LOST.

pyarrow is imported in ``run`` only: it is the optional ``spark`` extra.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

from sbus_relay.pipeline import defaults as D

from .options import add_address_argument, bus_address, count, positive_number

if TYPE_CHECKING:
    from sbus_relay.pipeline.recorder import Recorder

#: Multipliers of the --rotate-size suffixes.
SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
#: Exit status when the bus goes away under the recorder.
EXIT_BUS_CLOSED = 1
#: Exit status when the optional extra (pyarrow) is not installed.
EXIT_MISSING_EXTRA = 2
#: Exit status for options record refuses (an --out that is a file).
EXIT_USAGE = 2
#: Exit status when the bus dropped messages meant for the recorder.
EXIT_LOST = 3


def _size(text: str) -> int:
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1:] if t[-1:] in SIZE_SUFFIXES and t[-1:] else ""
    try:
        value = int(float(t[: len(t) - len(unit)]) * SIZE_SUFFIXES[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's options (the CLI owns parsing)."""
    add_address_argument(parser)
    parser.add_argument(
        "patterns",
        nargs="*",
        metavar="PATTERN",
        help='routing key patterns (default: "", everything not secret)',
    )
    parser.add_argument(
        "--out",
        default="captures",
        metavar="DIR",
        help="directory for the capture files (default %(default)s)",
    )
    parser.add_argument(
        "--no-payload", action="store_true", help="record sizes only, not payload bytes"
    )
    parser.add_argument(
        "--rotate-size",
        type=_size,
        default=D.ROTATE_BYTES,
        metavar="SIZE",
        help="start a new file after this many bytes (default 256M)",
    )
    parser.add_argument(
        "--rotate-seconds",
        type=positive_number,
        default=D.ROTATE_SECONDS,
        metavar="SEC",
        help="... or after this many seconds (default %(default)s)",
    )
    parser.add_argument(
        "--instance",
        metavar="NAME",
        help="bus instance name stored in every row (default HOST:ADDRESS)",
    )
    parser.add_argument(
        "--duration", type=positive_number, metavar="SEC", help="stop after this many seconds"
    )
    parser.add_argument("-n", "--count", type=count, metavar="N", help="stop after N messages")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line")


def _plural(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def _earlier_sessions(directory: str) -> str | None:
    """What an --out directory already holds, said before a new session joins it."""
    from datetime import UTC, datetime

    from sbus_relay.pipeline.capture import capture_files, loss_files, read_losses

    files = capture_files([directory])
    if not files:
        return None
    sessions = read_losses(loss_files([directory]))
    latest = max(f.stat().st_mtime for f in files)
    when = datetime.fromtimestamp(latest, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    held = (
        f"{sessions.sessions} earlier recording {_plural(sessions.sessions, 'session')}"
        if sessions.sessions
        else ("captures of an earlier recording")
    )
    return (
        f"{directory} already holds {held} ({len(files)} {_plural(len(files), 'file')}, "
        f"the last written {when}); "
        "this session is added beside them: analyze reads them together, and leaves the "
        "gaps between sessions out of its burst medians"
    )


def _progress_line(recorder: Recorder) -> None:
    s = recorder.writer.stats
    st = recorder.status
    elapsed = max(1e-9, time.monotonic() - st.started)
    lost = f"{st.dropped:,} lost" if st.drop_query else "loss unknown"
    line = (
        f"\r{s.messages:,} msgs  {s.payload_bytes / 1048576:,.1f} MiB  "
        f"{s.messages / elapsed:,.0f} msg/s  {lost}  {s.files_closed} files done  "
        f"{os.path.basename(s.current_file) or '(idle)'}"
    )
    sys.stderr.write(line[:200] + "\033[K")
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    """Record until SIGINT/SIGTERM, --duration or --count; 0 on a clean stop
    with nothing lost, EXIT_LOST if the bus dropped messages for us."""
    missing = D.missing_extra(("pyarrow",))
    if missing:
        print(f"sbus-relay record: {missing}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    from sbus_relay.ops.addresses import parse_address
    from sbus_relay.pipeline.capture import RotatingCaptureWriter, recover
    from sbus_relay.pipeline.recorder import Recorder
    from sbus_relay.protocol.errors import AddressError, BusClosed, PeerError

    text = bus_address(args)
    address = parse_address(text)
    instance = args.instance or f"{socket.gethostname()}:{text}"
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        print(f"sbus-relay record: --out {args.out} is a file, not a directory", file=sys.stderr)
        return EXIT_USAGE
    earlier = None  # said once the bus has answered, not before a failed connect
    try:
        if os.path.isdir(args.out):
            note = recover([args.out]).line()
            if note:
                print(f"sbus-relay record: {note} (in {args.out})", file=sys.stderr)
            earlier = _earlier_sessions(args.out)
        writer = RotatingCaptureWriter(
            args.out,
            instance=instance,
            keep_payload=not args.no_payload,
            rotate_bytes=args.rotate_size,
            rotate_seconds=args.rotate_seconds,
        )
    except OSError as exc:
        print(f"sbus-relay record: cannot write the capture under {args.out}: {exc}",
              file=sys.stderr)  # fmt: skip
        return EXIT_BUS_CLOSED
    recorder = Recorder(address, args.patterns or [""], writer)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()  # the loop sees it within one receive tick and closes the file

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    show = not args.quiet and sys.stderr.isatty()
    deadline = None if args.duration is None else time.monotonic() + args.duration

    def on_ready() -> None:
        if earlier:
            print(f"sbus-relay record: {earlier}", file=sys.stderr, flush=True)
        if not args.quiet:
            patterns = " ".join(
                repr(p.decode("utf-8", "backslashreplace")) for p in recorder.patterns
            )
            print(f"recording {patterns} on {text} into {args.out}", file=sys.stderr, flush=True)
        if not recorder.status.drop_query:
            print(
                f"sbus-relay record: the bus at {text} does not answer the drop query "
                "(CMSG drops/count): messages it drops for the recorder cannot be counted",
                file=sys.stderr,
                flush=True,
            )

    try:
        recorder.run(
            stop,
            on_ready=on_ready,
            progress=_progress_line if show else None,
            max_messages=args.count,
            deadline=deadline,
        )
    except AddressError as exc:
        print(f"sbus-relay record: {exc}", file=sys.stderr)
        return EXIT_BUS_CLOSED
    except (BusClosed, PeerError) as exc:
        if not recorder.status.ready:  # refused before recording: nothing to sum up
            print(f"sbus-relay record: {exc}", file=sys.stderr)
            return EXIT_BUS_CLOSED
        print(f"\nsbus-relay record: {exc}", file=sys.stderr)
        status = EXIT_BUS_CLOSED
    except OSError as exc:  # the capture directory: full, gone, not writable
        print(f"\nsbus-relay record: cannot write the capture under {args.out}: {exc}",
              file=sys.stderr)  # fmt: skip
        return EXIT_BUS_CLOSED
    else:
        status = 0
    finally:
        if show:
            sys.stderr.write("\n")
    s = writer.stats
    st = recorder.status
    if not st.drop_query:
        loss = "loss unknown (the bus does not answer the drop query)"
    elif st.dropped:
        loss = f"LOST {st.dropped:,} messages (dropped by the bus for this recorder)"
    else:
        loss = "nothing lost"
    print(
        f"recorded {s.messages:,} {_plural(s.messages, 'message')} "
        f"({s.payload_bytes:,} payload {_plural(s.payload_bytes, 'byte')}) "
        f"in {s.files_closed} {_plural(s.files_closed, 'file')} under {args.out}; {loss}",
        file=sys.stderr,
    )
    if status:
        return status
    return EXIT_LOST if st.drop_query and st.dropped else 0
