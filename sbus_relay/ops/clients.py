"""``/clients``: every connection of a server as JSON, sortable and bounded.

What it owns: the /clients query: its parameters, sorting and bounds.  What it
may touch: the rows it is given.

The server hands over one row per connection (``Server.client_rows``); this
module parses the query string, filters, sorts and cuts the list, and never
returns more than ``MAX_LIMIT`` rows, so the answer's size is bounded however
many clients are connected.  docs/observability.md shows an answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from .suggest import nearest

#: What ``sort=`` accepts (each a field of a row).
SORT_KEYS = (
    "cid",
    "age",
    "msgs_in",
    "msgs_out",
    "bytes_in",
    "bytes_out",
    "dropped",
    "queued_messages",
    "queued_bytes",
    "patterns",
)
DEFAULT_SORT = "msgs_in"
#: Rows per answer unless ``limit=`` says otherwise.
DEFAULT_LIMIT = 100
#: Most rows one answer carries (bounds the answer's size).
MAX_LIMIT = 1000
#: Longest query string read (anything longer is refused).
MAX_QUERY = 1024
_PARAMS = frozenset({"sort", "order", "limit", "offset", "relay", "uid"})


class QueryError(ValueError):
    """A bad ``/clients`` query; its text is the answer's ``error``."""


@dataclass(frozen=True)
class Query:
    """A parsed ``/clients`` query string."""

    sort: str = DEFAULT_SORT
    descending: bool = True
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    relay: str | None = None
    uid: int | None = None


def parse(query: str) -> Query:
    """Parse ``sort=..&order=..&limit=..&offset=..&relay=..&uid=..``."""
    if len(query) > MAX_QUERY:
        raise QueryError("query string longer than %d bytes" % MAX_QUERY)
    try:
        raw = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=16)
    except ValueError as e:
        raise QueryError(str(e)) from None
    strange = sorted(set(raw) - _PARAMS)
    if strange:
        hint = nearest(strange[0], sorted(_PARAMS))
        guess = f"; did you mean {hint!r}?" if hint is not None else ""
        known = ", ".join(sorted(_PARAMS))
        raise QueryError(f"unknown parameter {strange[0]!r}{guess} (known: {known})")
    one = {name: values[-1] for name, values in raw.items()}
    sort = one.get("sort", DEFAULT_SORT)
    if sort not in SORT_KEYS:
        raise QueryError("sort must be one of %s, got %r" % (", ".join(SORT_KEYS), sort))
    order = one.get("order", "desc")
    if order not in ("asc", "desc"):
        raise QueryError("order must be asc or desc, got %r" % order)
    return Query(
        sort=sort,
        descending=order == "desc",
        limit=_number(one, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
        offset=_number(one, "offset", 0, 0, None),
        relay=one.get("relay"),
        uid=_number(one, "uid", None, 0, None) if "uid" in one else None,
    )


def _number(one: Mapping[str, str], name: str, default: Any, low: int, high: int | None) -> Any:
    text = one.get(name)
    if text is None:
        return default
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise QueryError("%s must be a whole number, got %r" % (name, text[:40]))
    value = int(text)
    if value < low or (high is not None and value > high):
        bound = "%d..%d" % (low, high) if high is not None else "at least %d" % low
        raise QueryError("%s must be %s, got %d" % (name, bound, value))
    return value


def answer(
    query: Query, server: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The JSON document: the server's block, then the selected rows."""
    chosen = [
        r
        for r in rows
        if (query.relay is None or r["relay"] == query.relay)
        and (query.uid is None or r["uid"] == query.uid)
    ]
    chosen.sort(key=lambda r: (r[query.sort], r["cid"]), reverse=query.descending)
    return {
        "server": dict(server),
        "total": len(chosen),
        "offset": query.offset,
        "limit": query.limit,
        "sort": query.sort,
        "order": "desc" if query.descending else "asc",
        "clients": chosen[query.offset : query.offset + query.limit],
    }
