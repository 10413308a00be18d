"""``/clients`` queries: parsed strictly, answers bounded."""

from __future__ import annotations

import pytest

from sbus_relay.ops.clients import MAX_LIMIT, Query, QueryError, answer, parse

pytestmark = pytest.mark.timeout(30)


def test_defaults() -> None:
    assert parse("") == Query()


def test_every_parameter() -> None:
    q = parse("sort=dropped&order=asc&limit=5&offset=10&relay=web&uid=1000")
    assert q == Query("dropped", False, 5, 10, "web", 1000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sort=pid", "sort must be one of"),
        ("order=up", "order must be asc or desc"),
        ("limit=0", "limit must be 1..1000"),
        ("limit=%d" % (MAX_LIMIT + 1), "limit must be 1..1000"),
        ("limit=ten", "limit must be a whole number"),
        ("offset=-1", "offset must be a whole number"),
        ("uid=1e3", "uid must be a whole number"),
        ("colour=red", r"unknown parameter 'colour' \(known: "),
        ("limt=3", "unknown parameter 'limt'; did you mean 'limit'?"),
        ("x" * 2000, "longer than"),
    ],
)
def test_bad_queries_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        parse(text)


def test_answer_filters_sorts_and_cuts() -> None:
    rows = [
        {"cid": i, "relay": "web" if i % 2 else "local", "uid": 1000 + i % 3, "msgs_in": i % 4}
        for i in range(20)
    ]
    doc = answer(parse("relay=web&sort=msgs_in&limit=3"), {"instance": "m"}, rows)
    assert doc["total"] == 10 and len(doc["clients"]) == 3
    assert [r["msgs_in"] for r in doc["clients"]] == [3, 3, 3]
    assert [r["cid"] for r in doc["clients"]] == [19, 15, 11]  # ties: newest first
    assert doc["server"] == {"instance": "m"}
    assert answer(parse("offset=50"), {}, rows)["clients"] == []
