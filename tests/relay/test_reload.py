"""Reloading a relay (SIGHUP): its upward queue, its back-off and its name change
live, its upstream is kept (docs/reliability.md, "Reload")."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.relay.conftest import Hierarchy
from tests.relay.helpers import Bus, wait_until

pytestmark = pytest.mark.timeout(60)

APPLIED = 'sbus_config_reloads_total{result="applied"}'
OVERFLOW = 'sbus_messages_dropped_total{reason="upstream_queue_overflow"}'


def reload(bus: Bus) -> None:
    before = bus.metric(APPLIED)
    os.kill(bus.pid, signal.SIGHUP)
    wait_until(lambda: bus.metric(APPLIED) > before, "the reload applied")


def relay_labels(bus: Bus) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{bus.port}/clients", timeout=5) as r:
        return {c["relay"] for c in json.loads(r.read())["clients"] if c["is_relay"]}


def test_a_relay_reload_renames_it_upstream_and_resizes_its_upward_queue(
    tree: Hierarchy, tmp_path: Path
) -> None:
    config = tmp_path / "relay.yaml"
    config.write_text(yaml.safe_dump({"instance": "before", "upstream_queue_messages": 100}))
    master = tree.bus("m")
    relay = tree.bus("r", "-C", str(config), upstream=master)
    wait_until(lambda: relay_labels(master) == {"before"}, "the relay named at the master")

    settings: dict[str, Any] = {
        "instance": "after",
        "upstream_queue_messages": 300,
        "upstream": tree.path("elsewhere"),  # --upstream, given on the command line, wins
    }
    config.write_text(yaml.safe_dump(settings))
    reload(relay)
    # the master hears the new name at once, on the link it already has
    wait_until(lambda: relay_labels(master) == {"after"}, "the relay renamed at the master")
    assert master.metric("sbus_upstream_reconnects_total") == 0
    assert relay.metric("sbus_upstream_reconnects_total") == 0
    assert relay.events("config.kept") == []
    assert relay.events("config.reloaded")[0]["changed"] == [
        "upstream_queue_messages",
        "instance",
    ]
    # the upward queue's new bound: with the master hung, 300 wait, the rest drop
    tree.peer(master).sub(b"up/")  # the master wants up/: the relay forwards it
    wait_until(lambda: relay.metric("sbus_upstream_interest_patterns") >= 1, "interest")
    os.kill(master.pid, signal.SIGSTOP)
    try:
        publisher = tree.peer(relay)
        for i in range(30_000):  # past what the link's socket holds
            publisher.pub(b"up/%d" % i, b"x" * 64)
        publisher.sync()
        wait_until(lambda: relay.metric(OVERFLOW) > 0, "upward drops")
        assert relay.metric("sbus_upstream_queued_messages") == 300
    finally:
        os.kill(master.pid, signal.SIGCONT)
