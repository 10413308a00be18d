"""Shape of the shipped dashboard, provisioning files and Prometheus config.

No Prometheus server needed except ``promtool``; the live check that every
panel returns data is ``test_dashboard_prometheus.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sbus_relay.ops.collector import build_registry
from sbus_relay.ops.natsmetrics import NatsCollector
from sbus_relay.protocol.accounting import COUNTERS, GAUGES
from sbus_relay.protocol.stats import Gauges, Stats
from tests.metrics.dashboard_queries import (
    PROMETHEUS_CONFIG,
    REPO,
    all_panels,
    load_dashboard,
    panel_queries,
    row_panels,
)

pytestmark = pytest.mark.timeout(30)

#: What a NATS link's ``state()`` holds (``bus.natslink``), for its families.
NATS_STATE = {
    "host": "x", "state": "connected", "connected": True, "server": "127.0.0.1:4222",
    "sent": 1, "sent_bytes": 1, "received": 1, "received_bytes": 1,
    "drops": {"queue_overflow": 0}, "queued_messages": 0, "queued_bytes": 0,
    "to_bus_queued": 0, "reconnects": 0, "rtt": 0.001, "subscriptions": 1,
    "remote_hosts": 1, "remote_patterns": 1, "settled": True, "unconfirmed_total": 0,
    "origin_counts": {"y": {"delivered": 1, "lost_link_down": 0, "lost_slow_consumer": 0,
                            "lost_origin_silent": 0, "lost_unknown": 0, "duplicate": 0,
                            "late": 0}},
    "process": {"pid": 7, "rss_bytes": 1, "threads": 2, "restarts": 0},
}  # fmt: skip
#: Metric names a PromQL expression may mention, from sbus_relay.ops.collector.
METRIC_NAME = re.compile(r"\b((?:sbus|process)_[a-z_]+|up)\b(?!\s*\()")


def exported_names() -> set[str]:
    """Sample names a relay exports (a relay exports a superset of a master).

    With one row per who-dimension, as a server with a client has: the
    per-relay and per-user families then have samples.
    """

    def who() -> dict[str, list[tuple[str, list[int], list[int]]]]:
        row = ([0] * len(COUNTERS), [0] * len(GAUGES))
        return {"relay": [("local", *row)], "user": [("0", *row)]}

    registry = build_registry(Stats(), lambda: Gauges(is_relay=True), "x", who)
    # and a master joined to NATS exports its link's families (docs/nats.md)
    registry.register(NatsCollector(lambda: NATS_STATE, lambda: "x"))
    text = generate_latest(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_dashboard_has_instance_variable_and_schema() -> None:
    d = load_dashboard()
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["instance"]["query"]["query"].startswith("label_values(sbus_build_info")
    assert variables["instance"]["includeAll"] and variables["instance"]["allValue"] == ".*"
    assert variables["datasource"]["type"] == "datasource"
    assert d["uid"] == "sbus-relay"


def test_every_panel_has_queries_on_the_selected_instances() -> None:
    d = load_dashboard()
    panels = [p for p in all_panels(d) if p["type"] != "row"]
    ids = [p["id"] for p in all_panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert len(panels) >= 12
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])


def test_dashboard_covers_drops_queues_traffic_and_relays() -> None:
    exprs = " ".join(q.expr for q in panel_queries())
    for metric in (
        "sbus_messages_delivered_total",
        "sbus_packets_received_total",
        "sbus_received_bytes_total",
        "sbus_sent_bytes_total",
        "sbus_messages_dropped_total",
        "sbus_disconnects_total",
        "sbus_queued_messages",
        "sbus_largest_queue_messages",
        "sbus_queue_wait_seconds_bucket",
        "sbus_clients_soft_mode",
        "sbus_blocked_publishers",
        "sbus_clients_dropping",
        "sbus_upstream_connected",
        "sbus_upstream_reconnects_total",
        "sbus_upstream_forwarded_messages_total",
        "sbus_clients_connected",
        "sbus_patterns_stored",
        "sbus_nats_link_up",
        "sbus_nats_link_restarts_total",
        "sbus_nats_link_threads",
        "sbus_nats_link_resident_bytes",
    ):
        assert metric in exprs, metric
    assert "histogram_quantile(0.99" in exprs and "histogram_quantile(0.5" in exprs


#: The Who row's metrics: publishers, droppers, queue depth, disconnects, by relay and by uid.
WHO_METRICS = {
    label: [
        f"{prefix}_{name}"
        for name in (
            "messages_in_total",
            "dropped_messages_total",
            "queued_messages",
            "queued_bytes",
            "disconnects_total",
        )
    ]
    for prefix, label in (("sbus_relay", "relay"), ("sbus_user", "uid"))
}


def who_label(expr: str) -> str:
    """``relay`` or ``uid``: which split of the Who row a query belongs to."""
    (label,) = {label for label, names in WHO_METRICS.items() if any(n in expr for n in names)}
    return label


def test_who_row_covers_publishers_droppers_queues_and_disconnects() -> None:
    panels = row_panels(load_dashboard(), "Who")
    assert panels, "the Who row has no panels"
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for names in WHO_METRICS.values():
        for name in names:
            assert name in exprs, f"the Who row does not show {name}"


def test_who_panels_are_bounded_and_name_the_bus_and_the_relay_or_user() -> None:
    """Top N only, and every series says which bus and which relay (or uid) it is."""
    for p in row_panels(load_dashboard(), "Who"):
        for t in p["targets"]:
            label = who_label(t["expr"])
            assert re.match(rf"topk\(\d+, sum by \(instance, {label}\) \(", t["expr"]), (
                p["title"],
                t["expr"],
            )
            if p["type"] == "table":
                assert t["format"] == "table" and t["instant"], p["title"]
                (organize,) = [x for x in p["transformations"] if x["id"] == "organize"]
                hidden = organize["options"]["excludeByName"]
                assert not hidden.get("instance") and not hidden.get(label), p["title"]
            else:
                assert "{{instance}}" in t["legendFormat"], p["title"]
                assert "{{%s}}" % label in t["legendFormat"], p["title"]


def test_who_panels_speak_in_messages_and_bytes() -> None:
    for p in row_panels(load_dashboard(), "Who"):
        unit = p["fieldConfig"]["defaults"]["unit"]
        exprs = " ".join(t["expr"] for t in p["targets"])
        if "disconnects_total" in exprs:
            assert unit == "count:disconnects", p["title"]
        elif "rate(" in exprs:
            assert unit == "count:msgs/s", p["title"]
        else:  # a table of queue depth: messages, and bytes where the column is bytes
            assert unit == "count:msgs", p["title"]
            units = {
                o["matcher"]["options"]: prop["value"]
                for o in p["fieldConfig"]["overrides"]
                for prop in o["properties"]
                if prop["id"] == "unit"
            }
            assert units == {"Queued bytes": "bytes"}, p["title"]


def test_every_panel_query_parses() -> None:
    """promtool parses every expression (Grafana's variables replaced as for "All")."""
    promtool = shutil.which("promtool") or shutil.which("promtool", path="/usr/bin")
    if promtool is None:
        pytest.skip("!!! promtool NOT FOUND: apt-get install prometheus to parse the queries !!!")
    rules = [
        {"record": f"dashboard:panel_query:{i}", "expr": q.promql()}
        for i, q in enumerate(panel_queries())
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        f.flush()
        result = subprocess.run(
            [promtool, "check", "rules", f.name], capture_output=True, timeout=20
        )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def test_every_metric_in_the_dashboard_is_exported() -> None:
    """A typo in a panel would otherwise only show up as an empty graph."""
    names = exported_names() | {"up"}
    for q in panel_queries():
        for name in METRIC_NAME.findall(q.expr):
            assert name in names, f"panel {q.panel!r} uses unknown metric {name}"


def test_prometheus_config_labels_every_target() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "sbus"
    targets = {
        t: group["labels"]["instance"] for group in job["static_configs"] for t in group["targets"]
    }
    assert targets == {
        "127.0.0.1:9810": "master",
        "127.0.0.1:9811": "relay-1",
        "127.0.0.1:9812": "relay-2",
    }
    assert not job.get("honor_labels", False)


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool") or shutil.which("promtool", path="/usr/bin")
    if promtool is None:
        pytest.skip("!!! promtool NOT FOUND: apt-get install prometheus to check the config !!!")
    result = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, timeout=20
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


@pytest.mark.parametrize("kind", ["datasources", "dashboards"])
def test_provisioning_files_parse(kind: str) -> None:
    doc = yaml.safe_load((REPO / "grafana" / "provisioning" / kind / "sbus.yaml").read_text())
    assert doc["apiVersion"] == 1
    entries = doc[kind if kind == "datasources" else "providers"]
    assert len(entries) == 1
    if kind == "datasources":
        assert entries[0]["type"] == "prometheus"
    else:
        assert entries[0]["type"] == "file" and entries[0]["options"]["path"]
