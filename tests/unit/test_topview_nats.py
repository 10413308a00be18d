"""``top`` shows a master's NATS link in its header line."""

from __future__ import annotations

import pytest

from sbus_relay.cli.topview import BusView, bus_header

pytestmark = pytest.mark.timeout(10)


def view(nats: object) -> BusView:
    server = {"instance": "hosta", "role": "master", "uptime": 5.0, "nats": nats}
    return BusView("hosta", "127.0.0.1:9820", server=server, total=0, rows=())


def test_the_link_up_and_down() -> None:
    up = {
        "connected": True, "server": "10.1.1.1:4222", "remote_hosts": 2, "sent": 10,
        "received": 7, "queued_messages": 0, "drops": {"queue_overflow": 1, "bus_full": 2},
    }  # fmt: skip
    assert bus_header(view(up)).endswith(
        "clients 0  nats 10.1.1.1:4222 hosts 2 out 10 in 7 queued 0 lost 3"
    )
    down = {**up, "connected": False, "queued_messages": 40}
    assert "nats DOWN hosts 2 out 10 in 7 queued 40 lost 3" in bus_header(view(down))


def test_no_link_no_words() -> None:
    assert "nats" not in bus_header(view(None))


def test_the_link_process() -> None:
    link = {
        "connected": True, "server": "10.1.1.1:4222", "remote_hosts": 1, "sent": 0,
        "received": 0, "queued_messages": 0, "drops": {}, "engine": "nats.c",
        "process": {"pid": 4242, "threads": 8, "rss_bytes": 30 << 20, "restarts": 0},
    }  # fmt: skip
    header = bus_header(view(link))
    assert "link pid 4242 nats.c 8 threads 30" in header and "MiB" in header
    gone = {**link, "process": {"pid": None, "threads": 0, "rss_bytes": 0, "restarts": 1}}
    assert bus_header(view(gone)).endswith("link process DOWN")
