"""A live view of buses and their clients: sbus-relay top [HIERARCHY.yaml] [--metrics HOST:PORT].

What it owns: the top command: fetching each bus's figures and drawing the
screen.  What it may touch: the buses' metrics servers (HTTP), the terminal.

Like ``nats-top`` or ``htop``.  Each interval it polls every bus's metrics
server, ``/clients`` for the clients and ``/metrics`` for the server's totals,
and shows a header per bus and a table of its clients with rates, optionally
grouped by relay label or by user.  A bus that does not answer is shown as
"down: <reason>" and polled again next time.  On a terminal it is a curses
view driven by keys; otherwise (or with ``--once``, ``--json``) it prints one
snapshot, two polls ``--interval`` apart so that rates are real, and exits.

Fetching and drawing live here; rates, sorting, grouping and the text of each
line are in ``topview`` (no I/O).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sbus_relay.protocol.errors import ConfigError, UsageError

from . import topview
from .options import add_metrics_argument
from .topview import BusView, Snapshot, ViewState

#: Most bytes read of one HTTP answer (1000 clients are well under 1 MiB).
MAX_ANSWER_BYTES = 8 << 20
#: Exit status of a snapshot in which no bus answered (scripts can tell).
EXIT_ALL_DOWN = 1
#: Seconds to wait for one HTTP answer before calling the bus down.
FETCH_TIMEOUT = 2.0
#: Clients asked of each bus per poll (the most /clients gives), busiest first.
FETCH_LIMIT = 1000
#: Bounds of --interval, seconds.
INTERVAL_RANGE = (0.1, 3600.0)
#: Seconds between checks for a key in the interactive view.
KEY_WAIT = 0.1
#: Wildcard listen addresses, and where to reach them from this machine.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
#: Keys, as the interactive view's last line explains them.
KEYS_HELP = "q quit  s/S or </> sort column  r reverse  g group (relay/uid/none)  +/- interval"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """[HIERARCHY.yaml], --metrics HOST:PORT..., --interval, --sort, --group, --limit, ..."""
    parser.add_argument(
        "hierarchy",
        nargs="?",
        metavar="HIERARCHY.yaml",
        help="watch every bus of this file (the one `sbus-relay up` takes)",
    )
    add_metrics_argument(parser, watch=True)
    parser.add_argument(
        "--interval", default="1", metavar="SECONDS", help="seconds between polls (default 1)"
    )
    parser.add_argument(
        "--sort",
        default="msgs_in",
        metavar="KEY",
        help=f"sort column, descending: {', '.join(topview.SORT_KEYS)} (default msgs_in)",
    )
    parser.add_argument(
        "--group",
        default="none",
        metavar="BY",
        help="one row per relay label or per uid: relay, uid, none (default none)",
    )
    parser.add_argument("--limit", metavar="N", help="at most N rows per bus")
    parser.add_argument(
        "--once", action="store_true", help="print one plain-text snapshot and exit"
    )
    parser.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")


def run(args: argparse.Namespace) -> int:
    """Watch the buses until q or Ctrl-C (0), or print one snapshot: 0 when a bus
    answered, EXIT_ALL_DOWN when none did (the snapshot says why for each)."""
    state = _view_state(args)
    watches, unwatched = _watches(args)
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(watches)))) as pool:

        def poll() -> list[BusView]:
            return list(pool.map(lambda watch: watch.poll(), watches))

        try:
            if args.json or args.once or not (sys.stdout.isatty() and sys.stdin.isatty()):
                return _snapshot(poll, state, unwatched, as_json=args.json)
            return _interactive(poll, state, unwatched)
        except KeyboardInterrupt:
            return 0
        except BrokenPipeError:
            # The reader went away (| head): keep Python's exit flush quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0


# --- arguments ---------------------------------------------------------------------


def _bad(flag: str, reason: str) -> ConfigError:
    return ConfigError("command line", flag, reason)


def _view_state(args: argparse.Namespace) -> ViewState:
    low, high = INTERVAL_RANGE
    try:
        interval = float(args.interval)
    except ValueError:
        interval = -1.0
    if not low <= interval <= high:
        raise _bad(
            "--interval", f"expected seconds from {low:g} to {high:g}, got {args.interval!r}"
        )
    if args.sort not in topview.SORT_KEYS:
        keys = ", ".join(topview.SORT_KEYS)
        raise _bad("--sort", f"expected one of {keys}, got {args.sort!r}")
    if args.group not in topview.GROUPS:
        groups = ", ".join(topview.GROUPS)
        raise _bad("--group", f"expected one of {groups}, got {args.group!r}")
    limit = None
    if args.limit is not None:
        if not args.limit.isdigit() or int(args.limit) < 1:
            raise _bad(
                "--limit", f"expected a whole number of rows, at least 1, got {args.limit!r}"
            )
        limit = int(args.limit)
    return ViewState(sort=args.sort, group=args.group, interval=interval, limit=limit)


def _watches(args: argparse.Namespace) -> tuple[list[Watch], list[str]]:
    """A ``Watch`` per bus to poll, and the names of the file's buses without metrics."""
    from sbus_relay.ops.config import config_from_mapping

    named: list[tuple[str, str]] = []
    unwatched: list[str] = []
    if args.hierarchy is not None:
        from sbus_relay.ops.hierarchy import load_hierarchy

        for spec in load_hierarchy(args.hierarchy).buses:
            if spec.metrics is None or spec.metrics.endswith(":0"):
                unwatched.append(spec.name)  # none, or a port only the bus itself knows
            else:
                named.append((spec.name, spec.metrics))
    for text in args.metrics:
        try:
            config_from_mapping({"metrics": text}, "command line")
        except ConfigError as exc:
            raise _bad("--metrics", exc.reason) from None
        named.append((text, text))
    if not named:
        if unwatched:
            raise ConfigError(args.hierarchy, "buses", "no bus has a metrics address to watch")
        raise UsageError("name a hierarchy file or at least one --metrics HOST:PORT")
    seen: set[str] = set()
    watches = []
    for name, address in named:
        if address not in seen:
            seen.add(address)
            watches.append(Watch(name, address))
    return watches, unwatched


# --- fetching ----------------------------------------------------------------------


class FetchError(Exception):
    """A bus's metrics server did not give a usable answer; the text says why."""


#: What a bus that does not answer, or answers nonsense, raises in a poll: no
#: answer (OSError: refused, timed out, an HTTP error), a broken one
#: (HTTPException), one that is not JSON or not UTF-8 (ValueError), or not
#: ours (FetchError).  Anything else is a bug of ours, and is not hidden.
_UNANSWERED = (OSError, ValueError, http.client.HTTPException, FetchError)


class Watch:
    """One bus: where its metrics server is, and its last snapshot (for rates)."""

    def __init__(self, name: str, address: str) -> None:
        from sbus_relay.ops.config import parse_host_port

        self.name = name
        self.address = address
        host, port = parse_host_port(address)
        host = _WILDCARDS.get(host, host)
        self.base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self.previous: Snapshot | None = None
        # Straight to the bus: a proxy from the environment has no business here.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def poll(self) -> BusView:
        """Fetch a snapshot; the bus's view, with rates against the last one."""
        try:
            current = self._fetch()
        except _UNANSWERED as exc:  # the bus's failure, shown in its header
            # Named as it last answered: "the-master at ...  down: ...".
            known = self.previous.server if self.previous is not None else {}
            return BusView(self.name, self.address, error=_reason(exc), server=known)
        view = topview.bus_view(self.name, self.address, self.previous, current)
        self.previous = current
        return view

    def _fetch(self) -> Snapshot:
        answer = json.loads(self._get(f"/clients?limit={FETCH_LIMIT}"))
        if not (
            isinstance(answer, dict)
            and isinstance(answer.get("server"), dict)
            and isinstance(answer.get("clients"), list)
            and all(isinstance(c, dict) for c in answer["clients"])
        ):
            raise FetchError("not an sbus /clients answer")
        total = answer.get("total")
        clients = tuple(answer["clients"])
        try:
            counters = topview.metric_counters(self._get("/metrics").decode("utf-8"))
        except _UNANSWERED:
            counters = {}  # the clients are still worth showing; the totals line says why not
        return Snapshot(
            server=answer["server"],
            clients=clients,
            total=total if isinstance(total, int) else len(clients),
            counters=counters,
        )

    def _get(self, path: str) -> bytes:
        request = urllib.request.Request(self.base + path, headers={"Accept": "*/*"})
        with self._opener.open(request, timeout=FETCH_TIMEOUT) as response:
            body: bytes = response.read(MAX_ANSWER_BYTES + 1)
        if len(body) > MAX_ANSWER_BYTES:
            raise FetchError(f"{path.split('?')[0]} answer larger than {MAX_ANSWER_BYTES} bytes")
        return body


def _reason(exc: BaseException) -> str:
    """Why a fetch failed, in a few words."""
    if isinstance(exc, urllib.error.HTTPError):  # only /clients fails a poll
        hint = " (a server without /clients?)" if exc.code == 404 else ""
        return f"HTTP {exc.code} {exc.reason} from /clients{hint}"
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    if isinstance(exc, TimeoutError):
        return f"no answer within {FETCH_TIMEOUT:g}s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return "not JSON from /clients"
    if isinstance(exc, FetchError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- showing -----------------------------------------------------------------------


def _snapshot(
    poll: Callable[[], list[BusView]],
    state: ViewState,
    unwatched: Sequence[str],
    *,
    as_json: bool,
) -> int:
    """Two polls an interval apart, then one snapshot on stdout."""
    poll()
    time.sleep(state.interval)
    views = poll()
    if as_json:
        print(json.dumps(topview.as_json(views, state, unwatched), indent=2))
    else:
        for text, _style in topview.render(views, state, unwatched=unwatched):
            print(text)
    sys.stdout.flush()
    return EXIT_ALL_DOWN if views and all(v.error is not None for v in views) else 0


def _interactive(
    poll: Callable[[], list[BusView]], state: ViewState, unwatched: Sequence[str]
) -> int:
    import curses

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # leaves curses.wrapper, which restores the terminal

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)

    def main(screen: Any) -> None:
        nonlocal state
        with contextlib.suppress(curses.error):
            curses.curs_set(0)
        screen.timeout(int(KEY_WAIT * 1000))
        styles = _styles(curses)
        _put(screen, 0, "sbus-relay top: polling ...", curses.A_BOLD)
        screen.refresh()
        views = poll()
        polled = time.monotonic()
        while True:
            _draw(screen, views, state, unwatched, styles)
            while True:
                if time.monotonic() - polled >= state.interval:
                    views = poll()
                    polled = time.monotonic()
                    break
                key = screen.getch()
                if key == curses.KEY_RESIZE:
                    break
                if key == -1 or not 0 < key < 256:
                    continue
                changed = topview.on_key(state, chr(key))
                if changed is None:
                    return
                if changed != state:
                    state = changed
                    break

    try:
        curses.wrapper(main)
    except curses.error as exc:
        print(f"sbus-relay top: cannot draw on this terminal ({exc}); try --once", file=sys.stderr)
        return 1
    return 0


def _styles(curses: Any) -> dict[str, int]:
    down = curses.A_BOLD
    if curses.has_colors():
        with contextlib.suppress(curses.error):
            curses.use_default_colors()
            curses.init_pair(1, curses.COLOR_RED, -1)
            down |= curses.color_pair(1)
    return {
        "title": curses.A_BOLD,
        "bus": curses.A_BOLD,
        "down": down,
        "columns": curses.A_REVERSE,
        "row": curses.A_NORMAL,
        "alert": down,  # a client whose messages are being dropped now
        "note": curses.A_DIM,
    }


def _draw(
    screen: Any,
    views: Sequence[BusView],
    state: ViewState,
    unwatched: Sequence[str],
    styles: dict[str, int],
) -> None:
    height, _width = screen.getmaxyx()
    # Each bus gets an equal share of the screen's rows for its table.
    fixed = 3 + 5 * len(views)  # title, keys, notes; per bus: blank, 2 header lines, titles, note
    each = max(1, (height - fixed) // max(1, len(views)))
    lines = topview.render(views, state, unwatched=unwatched, limit=each)
    screen.erase()
    for y, (text, style) in enumerate(lines[: height - 1]):
        _put(screen, y, text, styles.get(style, 0))
    _put(screen, height - 1, KEYS_HELP, styles["note"])
    screen.refresh()


def _put(screen: Any, y: int, text: str, attr: int) -> None:
    import curses

    width = screen.getmaxyx()[1]
    with contextlib.suppress(curses.error):  # the last cell of the screen raises
        screen.addnstr(y, 0, text, max(0, width - 1), attr)
