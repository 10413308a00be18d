"""The pure part of ``sbus-relay top`` (``cli/topview.py``), with tables: no server, no terminal."""

from __future__ import annotations

import http.client
import json
import urllib.error
from dataclasses import replace
from email.message import Message
from typing import Any

import pytest

from sbus_relay.cli.top import FetchError, _reason
from sbus_relay.cli.topview import (
    GROUPS,
    INTERVALS,
    SORT_KEYS,
    BusView,
    Row,
    Snapshot,
    ViewState,
    as_json,
    bus_header,
    bus_totals,
    client_rows,
    group_rows,
    human_age,
    human_bytes,
    human_rate,
    metric_counters,
    on_key,
    render,
    server_totals,
    sort_rows,
)

pytestmark = pytest.mark.timeout(30)


def client(cid: int, **fields: Any) -> dict[str, Any]:
    """A /clients entry with every counter at 0 unless given."""
    base: dict[str, Any] = {
        "cid": cid,
        "pid": 100 + cid,
        "uid": 1000,
        "gid": 1000,
        "relay": "local",
        "is_relay": False,
        "patterns": 1,
        "queued_messages": 0,
        "queued_bytes": 0,
        "msgs_in": 0,
        "bytes_in": 0,
        "msgs_out": 0,
        "bytes_out": 0,
        "dropped": 0,
        "age": 100.0,
    }
    return {**base, **fields}


def snapshot(
    time: float, *clients: dict[str, Any], uptime: float | None = None, **counters: float
) -> Snapshot:
    server = {"instance": "m", "role": "master", "time": time, "uptime": uptime or time}
    return Snapshot(server=server, clients=tuple(clients), total=len(clients), counters=counters)


def row(cid: int, **fields: Any) -> Row:
    base: dict[str, Any] = {
        "label": str(cid),
        "cid": cid,
        "relay": "local",
        "uid": 1000,
        "pid": 100 + cid,
        "conns": 1,
        "patterns": 1,
        "msgs_in": 0.0,
        "msgs_out": 0.0,
        "bytes_in": 0.0,
        "bytes_out": 0.0,
        "drops": 0.0,
        "dropped": 0,
        "queued_messages": 0,
        "queued_bytes": 0,
        "dropping": 0,
        "age": 10.0,
    }
    return Row(**{**base, **fields})


# --- rates -------------------------------------------------------------------------

RATE_CASES = [
    pytest.param(
        client(1, msgs_in=10, msgs_out=4, bytes_in=1000, bytes_out=80, dropped=1),
        client(1, msgs_in=30, msgs_out=10, bytes_in=3000, bytes_out=80, dropped=5),
        {"msgs_in": 10.0, "msgs_out": 3.0, "bytes_in": 1000.0, "bytes_out": 0.0, "drops": 2.0},
        id="counters diffed by cid over the server's clock",
    ),
    pytest.param(
        None,
        client(2, msgs_in=8, age=0.5),
        {"msgs_in": 4.0, "msgs_out": 0.0, "drops": 0.0},
        id="connected during the interval: counted from zero over the interval",
    ),
    pytest.param(
        None,
        client(3, msgs_in=8, age=50.0),
        {"msgs_in": None, "msgs_out": None, "drops": None},
        id="older than the interval but not seen before: no rate yet",
    ),
    pytest.param(
        client(4, msgs_in=50),
        client(4, msgs_in=20),
        {"msgs_in": None, "msgs_out": 0.0},
        id="a counter that went down has no rate",
    ),
]


@pytest.mark.parametrize(("before", "after", "expected"), RATE_CASES)
def test_client_rates(
    before: dict[str, Any] | None, after: dict[str, Any], expected: dict[str, Any]
) -> None:
    previous = snapshot(100.0, *([before] if before else []))
    (got,) = client_rows(previous, snapshot(102.0, after))
    assert {name: getattr(got, name) for name in expected} == expected


def test_the_first_snapshot_has_no_rates_but_every_other_column() -> None:
    (got,) = client_rows(None, snapshot(5.0, client(7, relay="web", queued_bytes=300, age=1.0)))
    assert (got.cid, got.relay, got.uid, got.pid, got.queued_bytes) == (7, "web", 1000, 107, 300)
    assert (got.msgs_in, got.msgs_out, got.bytes_in, got.drops) == (None, None, None, None)


@pytest.mark.parametrize(
    ("uptime", "restarted"),
    [
        (0.5, True),  # just restarted
        (900.0, True),  # restarted long ago, while it did not answer
        (1001.3, False),  # the same process (its clock and uptime a little apart)
    ],
)
def test_a_restarted_server_reusing_cids_gives_no_rates(uptime: float, restarted: bool) -> None:
    before = snapshot(100.0, client(1, msgs_in=500), uptime=100.0, msgs_in=10.0)
    after = snapshot(1001.0, client(1, msgs_in=600, age=0.5), uptime=uptime, msgs_in=20.0)
    (got,) = client_rows(before, after)
    totals = server_totals(before, after)
    assert totals is not None
    if restarted:
        assert got.msgs_in is None and totals.msgs_in is None
    else:
        assert got.msgs_in == pytest.approx(100 / 901) and totals.msgs_in is not None


def test_malformed_fields_do_not_break_a_row() -> None:
    odd = {"cid": "x", "uid": True, "msgs_in": "many", "age": None}
    (got,) = client_rows(None, snapshot(1.0, odd))
    assert (got.label, got.cid, got.uid, got.pid, got.age) == ("x", None, None, None, 0.0)


EXPOSITION = """\
# TYPE sbus_packets_received_total counter
sbus_packets_received_total{type="msg"} 120.0
sbus_packets_received_total{type="sub"} 7.0
sbus_messages_delivered_total 300.0
sbus_received_bytes_total 4096.0
sbus_sent_bytes_total 9000.0
sbus_messages_dropped_total{reason="hard_discard"} 3.0
sbus_messages_dropped_total{reason="client_gone"} 2.0
sbus_queued_messages 4.0
sbus_queued_bytes 512.0
sbus_clients_dropping 2.0
sbus_relay_messages_in_total{relay="web"} 99.0
"""


def test_metric_counters_read_the_server_totals() -> None:
    assert metric_counters(EXPOSITION) == {
        "msgs_in": 120.0,  # MSG packets only
        "msgs_out": 300.0,
        "bytes_in": 4096.0,
        "bytes_out": 9000.0,
        "dropped": 5.0,  # summed over reasons
        "queued_messages": 4.0,
        "queued_bytes": 512.0,
        "dropping": 2.0,  # a gauge: clients dropping now
    }


def test_server_totals_are_rates_of_the_counters() -> None:
    counters = metric_counters(EXPOSITION)
    before = snapshot(10.0, **{**counters, "msgs_in": 100.0, "dropped": 1.0})
    totals = server_totals(before, snapshot(14.0, **counters))
    assert totals is not None
    assert (totals.msgs_in, totals.drops, totals.dropped) == (5.0, 1.0, 5)
    assert (totals.queued_messages, totals.queued_bytes) == (4, 512)
    first = server_totals(None, snapshot(14.0, **counters))
    assert first is not None and first.msgs_in is None and first.dropped == 5
    assert server_totals(before, snapshot(14.0)) is None  # /metrics did not answer


# --- grouping and sorting ----------------------------------------------------------


def test_grouping_by_relay_sums_each_container() -> None:
    rows = [
        row(1, relay="web", msgs_in=10.0, dropped=2, queued_bytes=100, age=5.0),
        row(2, relay="web", msgs_in=None, dropped=1, queued_bytes=50, age=50.0),
        row(3, relay="db", msgs_in=None, age=1.0),
    ]
    web, db = group_rows(rows, "relay")
    assert (web.label, web.conns, web.msgs_in, web.dropped, web.queued_bytes) == (
        "web",
        2,
        10.0,  # the known rates summed
        3,
        150,
    )
    assert web.age == 50.0  # the oldest connection
    assert (db.label, db.msgs_in) == ("db", None)  # nothing known: unknown


def test_grouping_by_uid_and_none() -> None:
    rows = [row(1, uid=0), row(2, uid=1000), row(3, uid=1000)]
    assert [(g.label, g.uid, g.conns) for g in group_rows(rows, "uid")] == [
        ("0", 0, 1),
        ("1000", 1000, 2),
    ]
    assert group_rows(rows, "none") == rows


SORT_ROWS = [
    row(1, msgs_in=5.0, msgs_out=1.0, drops=0.0, queued_messages=9, age=30.0),
    row(2, msgs_in=50.0, msgs_out=None, drops=3.0, queued_messages=0, age=10.0),
    row(3, msgs_in=None, msgs_out=7.0, drops=0.0, queued_messages=2, age=20.0),
    row(4, msgs_in=5.0, msgs_out=2.0, drops=1.0, queued_messages=2, age=40.0),
]


@pytest.mark.parametrize(
    ("key", "descending", "cids"),
    [
        ("msgs_in", True, [2, 1, 4, 3]),  # ties by cid, unknown last
        ("msgs_in", False, [1, 4, 2, 3]),  # unknown last either way
        ("msgs_out", True, [3, 4, 1, 2]),
        ("drops", True, [2, 4, 1, 3]),
        ("queued_messages", True, [1, 3, 4, 2]),
        ("age", True, [4, 1, 3, 2]),
        ("age", False, [2, 3, 1, 4]),
        ("cid", True, [4, 3, 2, 1]),
        ("cid", False, [1, 2, 3, 4]),
    ],
)
def test_sort_rows(key: str, descending: bool, cids: list[int]) -> None:
    assert [r.cid for r in sort_rows(SORT_ROWS, key, descending)] == cids


def test_every_sort_key_sorts_clients_and_groups() -> None:
    groups = group_rows([row(1, uid=7), row(2, uid=1000), row(3, uid=20)], "uid")
    for key in SORT_KEYS:
        assert len(sort_rows(SORT_ROWS, key)) == len(SORT_ROWS)
        assert len(sort_rows(groups, key)) == len(groups)
    assert [g.label for g in sort_rows(groups, "cid", False)] == ["7", "20", "1000"]
    with pytest.raises(ValueError):
        sort_rows(SORT_ROWS, "colour")


# --- keys --------------------------------------------------------------------------

KEY_CASES = [
    ("s", ViewState(), {"sort": "msgs_out"}),
    (">", ViewState(), {"sort": "msgs_out"}),
    ("S", ViewState(), {"sort": "patterns"}),
    ("<", ViewState(), {"sort": "patterns"}),
    ("s", ViewState(sort="age"), {"sort": "cid"}),  # wraps around
    ("S", ViewState(sort="cid"), {"sort": "age"}),
    ("r", ViewState(), {"descending": False}),
    ("g", ViewState(), {"group": "relay"}),
    ("g", ViewState(group="relay"), {"group": "uid"}),
    ("g", ViewState(group="uid"), {"group": "none"}),
    ("+", ViewState(interval=1.0), {"interval": 2.0}),
    ("-", ViewState(interval=1.0), {"interval": 0.5}),
    ("+", ViewState(interval=1.5), {"interval": 2.0}),  # from a --interval between steps
    ("-", ViewState(interval=1.5), {"interval": 1.0}),
    ("+", ViewState(interval=INTERVALS[-1]), {}),  # at the ends it stays
    ("-", ViewState(interval=0.1), {}),
    ("x", ViewState(), {}),
]


@pytest.mark.parametrize(("key", "before", "changes"), KEY_CASES)
def test_keys(key: str, before: ViewState, changes: dict[str, Any]) -> None:
    assert on_key(before, key) == replace(before, **changes)


def test_q_quits() -> None:
    assert on_key(ViewState(), "q") is None
    assert on_key(ViewState(), "Q") is None


def test_the_cycles_cover_every_key_and_grouping() -> None:
    state, seen = ViewState(), []
    for _ in SORT_KEYS:
        state = on_key(state, "s") or state
        seen.append(state.sort)
    assert sorted(seen) == sorted(SORT_KEYS)
    assert len({(on_key(ViewState(group=g), "g") or ViewState()).group for g in GROUPS}) == 3


# --- formatting --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0"),
        (0.04, "0.0"),
        (5, "5.0"),
        (99.94, "99.9"),
        (99.96, "100"),
        (999.4, "999"),
        (999.6, "1.0k"),
        (1234, "1.2k"),
        (99_960, "100k"),
        (2.5e6, "2.5M"),
        (3e9, "3.0G"),
    ],
)
def test_human_rate(value: float | None, text: str) -> None:
    assert human_rate(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0B"),
        (1023, "1023B"),
        (1024, "1.0KiB"),
        (1536, "1.5KiB"),
        (10 * 1024, "10KiB"),
        (1024 * 1024 - 1, "1.0MiB"),
        (5 << 30, "5.0GiB"),
        (3 << 40, "3.0TiB"),
    ],
)
def test_human_bytes(value: int, text: str) -> None:
    assert human_bytes(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m00s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (86399, "23h59m"),
        (3 * 86400 + 7200, "3d02h"),
    ],
)
def test_human_age(seconds: float, text: str) -> None:
    assert human_age(seconds) == text


def live_view(rows: list[Row], **server: Any) -> BusView:
    info = {"instance": "master", "role": "master", "uptime": 125.0, "upstream_connected": None}
    return BusView(
        "master", "127.0.0.1:9810", server={**info, **server}, total=len(rows), rows=tuple(rows)
    )


def test_bus_headers() -> None:
    assert bus_header(live_view([])) == (
        "master at 127.0.0.1:9810  role master  up 2m05s  clients 0"
    )
    relay = BusView(
        "127.0.0.1:9811",
        "127.0.0.1:9811",
        server={"instance": "web", "role": "relay", "uptime": 3, "upstream_connected": False},
    )
    assert bus_header(relay) == "web at 127.0.0.1:9811  role relay  up 3s  clients 0  upstream DOWN"
    down = BusView("relay-b", "127.0.0.1:9812", error="connection refused")
    assert bus_header(down) == "relay-b at 127.0.0.1:9812  down: connection refused"
    gone = replace(relay, error="timed out")  # named as it last answered
    assert bus_header(gone) == "web at 127.0.0.1:9811  down: timed out"


def test_bus_totals() -> None:
    counters = metric_counters(EXPOSITION)
    before = snapshot(10.0, **{**counters, "msgs_in": 100.0, "bytes_in": 0.0, "dropped": 1.0})
    view = live_view([])
    view = replace(view, totals=server_totals(before, snapshot(14.0, **counters)))
    assert bus_totals(view) == (
        "  in 5.0 msg/s 1.0KiB/s  out 0 msg/s 0B/s  drops 1.0/s, 5 total, 2 dropping now"
        "  queued 4 msgs, 512B"
    )


def test_render_shows_each_bus_its_rows_and_what_is_left_out() -> None:
    rows = [row(1, msgs_in=1.0), row(2, msgs_in=3.0), row(3, msgs_in=2.0)]
    views = [live_view(rows), BusView("relay-b", "127.0.0.1:9812", error="timed out")]
    lines = render(views, ViewState(limit=2), unwatched=["relay-c"])
    texts = [text for text, _style in lines]
    assert texts[0] == "sbus-relay top  2 buses  every 1s  sort msgs_in desc  group none"
    assert texts[3] == "  totals unknown: /metrics did not answer"
    assert texts[4].split() == [
        "CID", "RELAY", "UID", "PID", "STATE", "PATS", "IN/s*", "OUT/s", "IN_B/s", "OUT_B/s",
        "DROP/s", "DROPPED", "QUEUED", "Q_BYTES", "AGE",
    ]  # fmt: skip
    assert [t.split()[0] for t in texts[5:7]] == ["2", "3"]  # busiest first, two of three
    assert [t.split()[4] for t in texts[5:7]] == ["-", "-"]
    assert texts[7] == "... 1 more clients"
    assert ("relay-b at 127.0.0.1:9812  down: timed out", "down") in lines
    assert texts[-1] == "no metrics address, not watched: relay-c"


def test_render_grouped_by_relay() -> None:
    rows = [row(1, relay="web"), row(2, relay="web"), row(3, relay="db")]
    texts = [text for text, _ in render([live_view(rows)], ViewState(group="relay"))]
    assert texts[4].split()[:4] == ["RELAY", "CONNS", "DROPPING", "PATS"]
    assert {tuple(t.split()[:2]) for t in texts[5:]} == {("web", "2"), ("db", "1")}


def test_clients_dropping_now_and_paused_publishers_are_marked() -> None:
    rows = [
        row(1, msgs_in=9.0, paused=1),
        row(2, relay="web", drops=40.0, dropped=400, dropping=1),
        row(3, relay="web", msgs_in=1.0),
    ]
    lines = render([live_view(rows)], ViewState())
    table = {text.split()[0]: (text.split()[4], style) for text, style in lines[5:]}
    assert table == {"1": ("paused", "row"), "2": ("dropping", "alert"), "3": ("-", "row")}
    grouped = render([live_view(rows)], ViewState(group="relay"))
    assert {t.split()[0]: t.split()[2] for t, _ in grouped[5:]} == {"local": "0", "web": "1"}
    (bus,) = as_json([live_view(rows)], ViewState(sort="cid", descending=False))["buses"]
    assert [(c["dropping"], c["paused"]) for c in bus["clients"]] == [
        (False, True),
        (True, False),
        (False, False),
    ]
    (bus,) = as_json([live_view(rows)], ViewState(group="relay"))["buses"]
    assert {g["relay"]: g["dropping"] for g in bus["groups"]} == {"local": 0, "web": 1}


def test_client_rows_read_dropping_and_paused_from_clients() -> None:
    now = snapshot(2.0, client(1, dropping=True), client(2, paused=True), client(3))
    assert [(r.dropping, r.paused) for r in client_rows(None, now)] == [(1, 0), (0, 1), (0, 0)]


def test_json_snapshot() -> None:
    view = live_view([row(1, msgs_in=2.5004, relay="web"), row(2)])
    doc = as_json([view], ViewState(limit=1), ["relay-c"])
    (bus,) = doc["buses"]
    assert bus["name"] == "master" and bus["error"] is None and bus["total"] == 2
    assert bus["clients"] == [
        {
            "cid": 1,
            "relay": "web",
            "uid": 1000,
            "pid": 101,
            "patterns": 1,
            "msgs_in_per_s": 2.5,
            "msgs_out_per_s": 0.0,
            "bytes_in_per_s": 0.0,
            "bytes_out_per_s": 0.0,
            "drops_per_s": 0.0,
            "dropped": 0,
            "queued_messages": 0,
            "queued_bytes": 0,
            "dropping": False,
            "paused": False,
            "age": 10.0,
        }
    ]
    assert doc["unwatched"] == ["relay-c"] and doc["sort"] == "msgs_in"
    assert bus["totals"] is None  # /metrics did not answer
    counters = metric_counters(EXPOSITION)
    totals = server_totals(snapshot(1.0, **counters), snapshot(4.0, **counters))
    totals_doc = as_json([replace(view, totals=totals)], ViewState())["buses"][0]["totals"]
    assert totals_doc == {
        "msgs_in_per_s": 0.0,
        "msgs_out_per_s": 0.0,
        "bytes_in_per_s": 0.0,
        "bytes_out_per_s": 0.0,
        "drops_per_s": 0.0,
        "dropped": 5,
        "queued_messages": 4,
        "queued_bytes": 512,
        "dropping": 2,
    }
    grouped = as_json([view], ViewState(group="uid"))["buses"][0]["groups"]
    assert [(g["uid"], g["connections"]) for g in grouped] == [(1000, 2)]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
            "connection refused",
        ),
        (urllib.error.URLError(TimeoutError("timed out")), "no answer within 2s"),
        (TimeoutError("The read operation timed out"), "no answer within 2s"),
        (
            urllib.error.HTTPError(
                "http://h:1/clients?limit=1000", 404, "Not Found", Message(), None
            ),
            "HTTP 404 Not Found from /clients (a server without /clients?)",
        ),
        (json.JSONDecodeError("Expecting value", "<html>", 0), "not JSON from /clients"),
        (FetchError("not an sbus /clients answer"), "not an sbus /clients answer"),
        (
            http.client.RemoteDisconnected("Remote end closed connection"),
            "RemoteDisconnected: Remote end closed connection",
        ),
    ],
)
def test_why_a_poll_failed_in_a_few_words(error: Exception, reason: str) -> None:
    assert _reason(error) == reason
