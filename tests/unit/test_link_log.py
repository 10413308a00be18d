"""The link process's log records go to its bus (ops.logsetup.configure_relay):
level, event and fields, a traceback as text, nothing below the level."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from sbus_relay.ops import logsetup
from sbus_relay.protocol import linkwire

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def sent() -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    config, level = structlog.get_config(), logsetup._level
    records: list[tuple[str, str, dict[str, Any]]] = []
    logsetup.configure_relay("info", lambda *record: records.append(record))
    try:
        yield records
    finally:
        structlog.configure(**config)
        logsetup._level = level


def test_records_at_the_level_and_above_go_to_the_bus(sent: list[Any]) -> None:
    log = structlog.get_logger("sbus_relay.link").bind(nats_host="a")
    log.debug("nats.quiet")
    log.warning("nats.lost", server="n1:4222")
    try:
        raise ValueError("a bug")
    except ValueError:
        log.exception("nats.link_error")
    assert [(level, event) for level, event, _ in sent] == [
        ("warning", "nats.lost"), ("error", "nats.link_error")
    ]  # fmt: skip
    assert sent[0][2] == {"nats_host": "a", "server": "n1:4222"}
    assert "ValueError: a bug" in sent[1][2]["exception"]
    # and each fits the packet the bus decodes
    packet = linkwire.encode_log(*sent[1])
    got = linkwire.control(packet)
    assert got is not None and linkwire.decode_log(got[1])[1] == "nats.link_error"
