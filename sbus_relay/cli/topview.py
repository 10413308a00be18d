"""The pure part of ``sbus-relay top``: rates, sorting, grouping and the text it shows.

Nothing here does I/O.  ``cli/top.py`` fetches each bus's ``/clients`` and
``/metrics`` into a ``Snapshot`` and draws the lines; everything in between is
a function of two snapshots and a ``ViewState``, tested with tables in
``tests/unit/test_topview.py``.

Rates come from diffing two snapshots of one server process: clients by
``cid`` (never reused while a server runs), server totals by counter.  Time is
the server's own clock, so a slow fetch does not bend a rate.  A client absent
from the earlier snapshot but younger than the interval started from zero
within it; any other client without an earlier sample has no rate yet ("-").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: Sort keys, in the order ``s``/``>`` cycles through them (the columns, left to right).
SORT_KEYS = (
    "cid",
    "patterns",
    "msgs_in",
    "msgs_out",
    "bytes_in",
    "bytes_out",
    "drops",
    "dropped",
    "queued_messages",
    "queued_bytes",
    "age",
)
#: Row groupings, in the order ``g`` cycles through them.
GROUPS = ("none", "relay", "uid")
#: Refresh intervals ``+`` and ``-`` step through, seconds.
INTERVALS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
#: Server totals read from /metrics: our name -> (sample name, labels it must carry).
_METRIC_SAMPLES: dict[str, tuple[str, dict[str, str]]] = {
    "msgs_in": ("sbus_packets_received_total", {"type": "msg"}),
    "msgs_out": ("sbus_messages_delivered_total", {}),
    "bytes_in": ("sbus_received_bytes_total", {}),
    "bytes_out": ("sbus_sent_bytes_total", {}),
    "dropped": ("sbus_messages_dropped_total", {}),  # summed over reasons
    "queued_messages": ("sbus_queued_messages", {}),
    "queued_bytes": ("sbus_queued_bytes", {}),
    "dropping": ("sbus_clients_dropping", {}),
}


# --- data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """One poll of one server: its ``/clients`` answer and its ``/metrics`` counters."""

    server: Mapping[str, Any]
    clients: tuple[Mapping[str, Any], ...]
    total: int  # clients connected (``clients`` may hold fewer)
    counters: Mapping[str, float] = field(default_factory=dict)  # empty: /metrics failed

    @property
    def time(self) -> float:
        return float(self.server.get("time") or 0.0)

    @property
    def uptime(self) -> float:
        return float(self.server.get("uptime") or 0.0)


@dataclass(frozen=True)
class Traffic:
    """Rates over the last interval (per second, None while unknown), and now."""

    msgs_in: float | None
    msgs_out: float | None
    bytes_in: float | None
    bytes_out: float | None
    drops: float | None
    dropped: int
    queued_messages: int
    queued_bytes: int
    #: connections whose messages are being dropped now (a drop episode is open)
    dropping: int


@dataclass(frozen=True)
class Totals(Traffic):
    """A server's own totals."""


@dataclass(frozen=True)
class Row(Traffic):
    """One line of a table: a client, or a group of them (``cid`` None), and its traffic."""

    label: str  # the cid as text, or the group's relay label or uid
    cid: int | None
    relay: str  # a group's: its label when grouped by relay, else ""
    uid: int | None  # a group's: its uid when grouped by uid, else None
    pid: int | None
    conns: int
    patterns: int
    age: float  # a group's: its oldest connection's
    paused: int = 0  # publishers not read now, held by a block mode (a client's: 0 or 1)


@dataclass(frozen=True)
class BusView:
    """What is shown of one bus: who it is, or why it is down, and its client rows."""

    name: str  # its name in the hierarchy file, else its metrics address
    address: str  # HOST:PORT of its metrics server
    error: str | None = None  # the last poll failed: shown as "down: <error>"
    server: Mapping[str, Any] = field(default_factory=dict)
    total: int = 0
    rows: tuple[Row, ...] = ()
    totals: Totals | None = None


@dataclass(frozen=True)
class ViewState:
    """What the user chose: sort column and order, grouping, interval, rows per bus."""

    sort: str = "msgs_in"
    descending: bool = True
    group: str = "none"
    interval: float = 1.0
    limit: int | None = None


# --- rates -------------------------------------------------------------------------


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


#: Seconds two snapshots' start times (clock minus uptime) may differ and still be
#: of one server process; more means it restarted (and reuses cids from 1).
SAME_START = 1.0


def _elapsed(previous: Snapshot | None, current: Snapshot) -> float:
    """Seconds between two snapshots of one server process; 0 if not comparable."""
    if previous is None:
        return 0.0
    started = (previous.time - previous.uptime, current.time - current.uptime)
    if abs(started[0] - started[1]) > SAME_START:
        return 0.0  # restarted: its counters and cids begin again
    return max(0.0, current.time - previous.time)


def client_rows(previous: Snapshot | None, current: Snapshot) -> list[Row]:
    """One row per client of ``current``, with rates against ``previous``."""
    elapsed = _elapsed(previous, current)
    comparable = previous is not None and elapsed > 0
    before = {c.get("cid"): c for c in previous.clients} if previous and comparable else {}
    rows = []
    for client in current.clients:
        old = before.get(client.get("cid"))
        age = _number(client.get("age"))
        if old is None and comparable and age <= elapsed:
            old = {}  # connected during the interval: its counters started at 0
        cid = client.get("cid")
        rows.append(
            Row(
                label=str(cid),
                cid=_integer(cid),
                relay=str(client.get("relay", "")),
                uid=_integer(client.get("uid")),
                pid=_integer(client.get("pid")),
                conns=1,
                patterns=int(_number(client.get("patterns"))),
                msgs_in=_rate(client, old, "msgs_in", elapsed),
                msgs_out=_rate(client, old, "msgs_out", elapsed),
                bytes_in=_rate(client, old, "bytes_in", elapsed),
                bytes_out=_rate(client, old, "bytes_out", elapsed),
                drops=_rate(client, old, "dropped", elapsed),
                dropped=int(_number(client.get("dropped"))),
                queued_messages=int(_number(client.get("queued_messages"))),
                queued_bytes=int(_number(client.get("queued_bytes"))),
                dropping=int(client.get("dropping") is True),
                age=age,
                paused=int(client.get("paused") is True),
            )
        )
    return rows


def _rate(
    now: Mapping[str, Any], then: Mapping[str, Any] | None, counter: str, elapsed: float
) -> float | None:
    """Per second between two samples of ``counter``; None without an earlier sample."""
    if then is None:
        return None
    new, old = _number(now.get(counter)), _number(then.get(counter))
    return (new - old) / elapsed if new >= old else None


def metric_counters(text: str) -> dict[str, float]:
    """The server totals ``Totals`` needs, read from a Prometheus text exposition."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for ours, (name, labels) in _METRIC_SAMPLES.items():
                if sample.name == name and labels.items() <= sample.labels.items():
                    found[ours] = found.get(ours, 0.0) + sample.value
    return found


def server_totals(previous: Snapshot | None, current: Snapshot) -> Totals | None:
    """The server's totals from its counters, rates against ``previous``."""
    now = current.counters
    if not now:
        return None
    elapsed = _elapsed(previous, current)
    then: Mapping[str, float] = previous.counters if previous is not None else {}

    def rate(name: str) -> float | None:
        if elapsed <= 0 or name not in then or name not in now or now[name] < then[name]:
            return None
        return (now[name] - then[name]) / elapsed

    return Totals(
        msgs_in=rate("msgs_in"),
        msgs_out=rate("msgs_out"),
        bytes_in=rate("bytes_in"),
        bytes_out=rate("bytes_out"),
        drops=rate("dropped"),
        dropped=int(now.get("dropped", 0)),
        queued_messages=int(now.get("queued_messages", 0)),
        queued_bytes=int(now.get("queued_bytes", 0)),
        dropping=int(now.get("dropping", 0)),
    )


def bus_view(name: str, address: str, previous: Snapshot | None, current: Snapshot) -> BusView:
    """A reachable bus: its server, its client rows and totals."""
    return BusView(
        name=name,
        address=address,
        server=current.server,
        total=current.total,
        rows=tuple(client_rows(previous, current)),
        totals=server_totals(previous, current),
    )


# --- grouping and sorting ----------------------------------------------------------


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def group_rows(rows: Sequence[Row], by: str) -> list[Row]:
    """Rows summed per relay label or per uid (``by``); ``none`` keeps them as they are."""
    if by == "none":
        return list(rows)
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.relay if by == "relay" else str(row.uid), []).append(row)
    result = []
    for label, members in groups.items():
        result.append(
            Row(
                label=label,
                cid=None,
                relay=label if by == "relay" else "",
                uid=members[0].uid if by == "uid" else None,
                pid=None,
                conns=len(members),
                patterns=sum(r.patterns for r in members),
                msgs_in=_sum(r.msgs_in for r in members),
                msgs_out=_sum(r.msgs_out for r in members),
                bytes_in=_sum(r.bytes_in for r in members),
                bytes_out=_sum(r.bytes_out for r in members),
                drops=_sum(r.drops for r in members),
                dropped=sum(r.dropped for r in members),
                queued_messages=sum(r.queued_messages for r in members),
                queued_bytes=sum(r.queued_bytes for r in members),
                dropping=sum(r.dropping for r in members),
                age=max(r.age for r in members),
                paused=sum(r.paused for r in members),
            )
        )
    return result


def _label_key(row: Row) -> tuple[int, int, str]:
    # Clients by cid; groups by label, numeric uids in numeric order.
    if row.cid is not None:
        return (0, row.cid, "")
    return (0, int(row.label), "") if row.label.isdigit() else (1, 0, row.label)


def sort_rows(rows: Sequence[Row], key: str, descending: bool = True) -> list[Row]:
    """``rows`` ordered by ``key``; ties by cid (or label); unknown rates always last."""
    if key not in SORT_KEYS:
        raise ValueError(f"unknown sort key {key!r}")
    ordered = sorted(rows, key=_label_key)
    if key == "cid":
        return ordered[::-1] if descending else ordered
    known = [r for r in ordered if getattr(r, key) is not None]
    unknown = [r for r in ordered if getattr(r, key) is None]
    return sorted(known, key=lambda r: getattr(r, key), reverse=descending) + unknown


def shown_rows(view: BusView, state: ViewState, limit: int | None = None) -> list[Row]:
    """The rows of ``view`` as ``state`` shows them: grouped, sorted, at most ``limit``."""
    rows = sort_rows(group_rows(view.rows, state.group), state.sort, state.descending)
    return rows if limit is None else rows[:limit]


# --- keys --------------------------------------------------------------------------


def _cycle(values: Sequence[Any], current: Any, step: int) -> Any:
    index = values.index(current) if current in values else 0
    return values[(index + step) % len(values)]


def on_key(state: ViewState, key: str) -> ViewState | None:
    """The state after pressing ``key``; None means quit.  Unknown keys change nothing."""
    if key in ("q", "Q"):
        return None
    if key in ("s", ">"):
        return replace(state, sort=_cycle(SORT_KEYS, state.sort, 1))
    if key in ("S", "<"):
        return replace(state, sort=_cycle(SORT_KEYS, state.sort, -1))
    if key == "r":
        return replace(state, descending=not state.descending)
    if key == "g":
        return replace(state, group=_cycle(GROUPS, state.group, 1))
    if key == "+":
        longer = [i for i in INTERVALS if i > state.interval]
        return replace(state, interval=longer[0] if longer else state.interval)
    if key == "-":
        shorter = [i for i in INTERVALS if i < state.interval]
        return replace(state, interval=shorter[-1] if shorter else state.interval)
    return state


# --- formatting --------------------------------------------------------------------


def _scaled(value: float, base: float, units: Sequence[str], tenths_below: float) -> str:
    """``value`` in the first of ``units`` (each ``base`` times the one before)
    that keeps it under ``base``: one decimal below ``tenths_below``, else none;
    past the last unit, one decimal in it."""
    for unit in units[:-1]:
        if abs(value) < tenths_below - 0.05:
            return f"{value:.1f}{unit}"
        if abs(value) < base - 0.5:
            return f"{value:.0f}{unit}"
        value /= base
    return f"{value:.1f}{units[-1]}"


def human_bytes(count: float) -> str:
    """``512B``, ``1.5KiB``, ``12MiB``: binary units, at most three significant digits."""
    value = float(count)
    if abs(value) < 1024:
        return f"{value:.0f}B"
    return _scaled(value / 1024, 1024, ("KiB", "MiB", "GiB", "TiB"), 10)


def human_rate(rate: float | None) -> str:
    """A per-second rate: ``-`` when unknown, ``0``, ``12.5``, ``340``, ``1.2k``, ``3.4M``."""
    if rate is None:
        return "-"
    if rate == 0:
        return "0"
    return _scaled(rate, 1000, ("", "k", "M", "G"), 100)


def human_byte_rate(rate: float | None) -> str:
    """Bytes per second in binary units; ``-`` when unknown."""
    return "-" if rate is None else human_bytes(rate)


def human_age(seconds: float) -> str:
    """``45s``, ``12m03s``, ``3h04m``, ``2d05h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)


def state_of(row: Row) -> str:
    """What is wrong with a client now: ``dropping`` (its messages are being
    dropped), ``paused`` (a publisher held by a block mode), else ``-``."""
    if row.dropping:
        return "dropping"
    return "paused" if row.paused else "-"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


@dataclass(frozen=True)
class Column:
    """A table column: title, width, the sort key it shows, and how to show a row."""

    title: str
    width: int
    key: str | None
    show: Callable[[Row], str]
    left: bool = False


_NUMBERS = (
    Column("PATS", 5, "patterns", lambda r: str(r.patterns)),
    Column("IN/s", 7, "msgs_in", lambda r: human_rate(r.msgs_in)),
    Column("OUT/s", 7, "msgs_out", lambda r: human_rate(r.msgs_out)),
    Column("IN_B/s", 8, "bytes_in", lambda r: human_byte_rate(r.bytes_in)),
    Column("OUT_B/s", 8, "bytes_out", lambda r: human_byte_rate(r.bytes_out)),
    Column("DROP/s", 7, "drops", lambda r: human_rate(r.drops)),
    Column("DROPPED", 8, "dropped", lambda r: str(r.dropped)),
    Column("QUEUED", 7, "queued_messages", lambda r: str(r.queued_messages)),
    Column("Q_BYTES", 8, "queued_bytes", lambda r: human_bytes(r.queued_bytes)),
)
#: Columns of the client table.
CLIENT_COLUMNS = (
    Column("CID", 6, "cid", lambda r: r.label),
    Column("RELAY", 18, None, lambda r: r.relay, left=True),
    Column("UID", 6, None, lambda r: _text(r.uid)),
    Column("PID", 7, None, lambda r: _text(r.pid)),
    Column("STATE", 8, None, state_of, left=True),
    *_NUMBERS,
    Column("AGE", 7, "age", lambda r: human_age(r.age)),
)


def group_columns(by: str) -> tuple[Column, ...]:
    """Columns of the table grouped by ``relay`` or ``uid``."""
    return (
        Column(by.upper(), 18, "cid", lambda r: r.label, left=True),
        Column("CONNS", 6, None, lambda r: str(r.conns)),
        Column("DROPPING", 8, None, lambda r: str(r.dropping)),
        *_NUMBERS,
        Column("OLDEST", 7, "age", lambda r: human_age(r.age)),
    )


def _cells(columns: Sequence[Column], texts: Sequence[str]) -> str:
    cells = []
    for column, text in zip(columns, texts, strict=True):
        text = _fit(text, column.width)
        cells.append(text.ljust(column.width) if column.left else text.rjust(column.width))
    return " ".join(cells).rstrip()


def table_header(columns: Sequence[Column], state: ViewState) -> str:
    """The column titles; the sorted column's title is marked with ``*``."""
    titles = [c.title + "*" if c.key == state.sort else c.title for c in columns]
    return _cells(columns, titles)


def table_row(columns: Sequence[Column], row: Row) -> str:
    return _cells(columns, [column.show(row) for column in columns])


def bus_header(view: BusView) -> str:
    """A bus's first line: who it is, its clients and upstream link, or why it is down."""
    server = view.server
    instance = str(server.get("instance") or "")
    name = instance if view.name == view.address and instance else view.name
    if instance and instance != name:
        name += f" ({instance})"
    where = name if name == view.address else f"{name} at {view.address}"
    if view.error is not None:
        return f"{where}  down: {view.error}"
    parts = [where, f"role {server.get('role', '?')}"]
    parts.append(f"up {human_age(_number(server.get('uptime')))}")
    parts.append(f"clients {view.total}")
    upstream = server.get("upstream_connected")
    if upstream is not None:
        parts.append("upstream connected" if upstream else "upstream DOWN")
    nats = server.get("nats")
    if isinstance(nats, dict):  # a master joined to NATS (docs/nats.md)
        parts.append(nats_summary(nats))
    return "  ".join(parts)


def nats_summary(link: dict[str, Any]) -> str:
    """The NATS link in a few words: state, server, other hosts, traffic, losses,
    and its process (pid, threads, resident memory)."""
    state = f"nats {link.get('server') or '-'}" if link.get("connected") else "nats DOWN"
    drops = sum(int(n) for n in (link.get("drops") or {}).values())
    words = (
        f"{state} hosts {link.get('remote_hosts', 0)} out {link.get('sent', 0)}"
        f" in {link.get('received', 0)} queued {link.get('queued_messages', 0)} lost {drops}"
    )
    process = link.get("process")
    if isinstance(process, dict):
        if process.get("pid"):
            words += (
                f" link pid {process['pid']} {link.get('engine') or '?'}"
                f" {process.get('threads', 0)} threads {human_bytes(process.get('rss_bytes', 0))}"
            )
        else:
            words += " link process DOWN"
    return words


def bus_totals(view: BusView) -> str:
    """A live bus's second line: the whole server's traffic, drops and queues."""
    t = view.totals
    if t is None:
        return "  totals unknown: /metrics did not answer"
    return (
        f"  in {human_rate(t.msgs_in)} msg/s {human_byte_rate(t.bytes_in)}/s"
        f"  out {human_rate(t.msgs_out)} msg/s {human_byte_rate(t.bytes_out)}/s"
        f"  drops {human_rate(t.drops)}/s, {t.dropped} total, {t.dropping} dropping now"
        f"  queued {t.queued_messages} msgs, {human_bytes(t.queued_bytes)}"
    )


def render(
    views: Sequence[BusView],
    state: ViewState,
    *,
    unwatched: Sequence[str] = (),
    limit: int | None = None,
) -> list[tuple[str, str]]:
    """Every line of the view as (text, style); ``limit`` rows per bus (else ``state.limit``).

    A style is title, bus, down, columns, row, alert (a row whose messages are
    being dropped now) or note: what kind of line it is,
    which ``cli/top.py`` shows in bold, reverse and so on.
    """
    limit = state.limit if limit is None else min(limit, state.limit or limit)
    order = "desc" if state.descending else "asc"
    lines = [
        (
            f"sbus-relay top  {len(views)} bus{'es' if len(views) != 1 else ''}"
            f"  every {state.interval:g}s  sort {state.sort} {order}  group {state.group}",
            "title",
        )
    ]
    columns = CLIENT_COLUMNS if state.group == "none" else group_columns(state.group)
    for view in views:
        lines.append(("", "row"))
        lines.append((bus_header(view), "down" if view.error is not None else "bus"))
        if view.error is not None:
            continue
        lines.append((bus_totals(view), "row"))
        rows = shown_rows(view, state)
        lines.append((table_header(columns, state), "columns"))
        # a client whose messages are being dropped now stands out (top.py: in red)
        lines.extend(
            (table_row(columns, row), "alert" if row.dropping else "row") for row in rows[:limit]
        )
        hidden = len(rows) - len(rows[:limit])
        if hidden > 0:
            what = "clients" if state.group == "none" else f"{state.group} groups"
            lines.append((f"... {hidden} more {what}", "note"))
        unfetched = view.total - len(view.rows)
        if unfetched > 0:
            lines.append((f"... {unfetched} more clients on the server, not fetched", "note"))
    if unwatched:
        lines.append(("", "row"))
        lines.append(("no metrics address, not watched: " + ", ".join(unwatched), "note"))
    return lines


def as_json(views: Sequence[BusView], state: ViewState, unwatched: Sequence[str] = ()) -> Any:
    """The snapshot as a JSON-ready document (rows as ``state`` shows them)."""
    buses = []
    for view in views:
        bus: dict[str, Any] = {"name": view.name, "metrics": view.address, "error": view.error}
        if view.error is None:
            bus["server"] = dict(view.server)
            bus["total"] = view.total
            bus["totals"] = _totals_json(view.totals) if view.totals is not None else None
            rows = shown_rows(view, state, state.limit)
            key = "clients" if state.group == "none" else "groups"
            bus[key] = [_row_json(row, state.group) for row in rows]
        buses.append(bus)
    return {
        "interval": state.interval,
        "sort": state.sort,
        "order": "desc" if state.descending else "asc",
        "group": state.group,
        "buses": buses,
        "unwatched": list(unwatched),
    }


#: Fields that are rates, named ``<field>_per_s`` in JSON.
_RATES = ("msgs_in", "msgs_out", "bytes_in", "bytes_out", "drops")


def _per_second(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 3)


def _totals_json(totals: Totals) -> dict[str, Any]:
    return {
        **{f"{name}_per_s": _per_second(getattr(totals, name)) for name in _RATES},
        "dropped": totals.dropped,
        "queued_messages": totals.queued_messages,
        "queued_bytes": totals.queued_bytes,
        "dropping": totals.dropping,
    }


def _row_json(row: Row, group: str) -> dict[str, Any]:
    rates = {f"{name}_per_s": _per_second(getattr(row, name)) for name in _RATES}
    counts = {
        "patterns": row.patterns,
        **rates,
        "dropped": row.dropped,
        "queued_messages": row.queued_messages,
        "queued_bytes": row.queued_bytes,
    }
    if group == "none":
        who = {"cid": row.cid, "relay": row.relay, "uid": row.uid, "pid": row.pid}
        state = {"dropping": bool(row.dropping), "paused": bool(row.paused)}
        return {**who, **counts, **state, "age": row.age}
    label: Any = row.uid if group == "uid" and row.uid is not None else row.label
    counted = {"dropping": row.dropping, "paused": row.paused}
    return {group: label, "connections": row.conns, **counts, **counted, "oldest": row.age}
