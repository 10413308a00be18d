"""Unit tests of ``ops.collector`` and ``ops.metrics_server``: no bus, a fresh registry each.

Each counter is checked by diffing the whole exposition before and after one
bump: exactly one sample may change, by exactly the bump.  That catches a
reason wired to the wrong label as well as one that is not exported at all.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
import pytest
from gevent.event import Event
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from sbus_relay import __version__
from sbus_relay.ops.collector import MetricsCollector, build_registry
from sbus_relay.ops.config import parse_host_port
from sbus_relay.ops.metrics_server import serve, serve_from_config
from sbus_relay.protocol.errors import ConfigError
from sbus_relay.protocol.stats import (
    DISCONNECT_REASONS,
    DROP_REASONS,
    INTERNAL_ERRORS,
    PACKET_TYPES,
    QUEUE_WAIT_BUCKETS,
    REFUSAL_REASONS,
    Gauges,
    Stats,
)

pytestmark = pytest.mark.timeout(30)

SampleKey = tuple[str, frozenset[tuple[str, str]]]


def sbus_registry(stats: Stats, gauges: Gauges | Callable[[], Gauges]) -> CollectorRegistry:
    """A fresh registry holding only the sbus collector (no process metrics)."""
    fn = gauges if callable(gauges) else (lambda: gauges)
    registry = CollectorRegistry()
    registry.register(MetricsCollector(stats, fn, "test-host"))
    return registry


def samples(registry: CollectorRegistry) -> dict[SampleKey, float]:
    """Every sample of the text exposition, keyed by name and label set."""
    text = generate_latest(registry).decode()
    out: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate sample {key}"
            out[key] = s.value
    return out


def changed(
    before: dict[SampleKey, float], after: dict[SampleKey, float]
) -> dict[SampleKey, float]:
    """Samples that differ, with their delta (new samples count from 0)."""
    assert set(before) <= set(after), f"samples vanished: {set(before) - set(after)}"
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k)}


def bump_and_diff(
    mutate: Callable[[Stats], None], gauges: Gauges | None = None
) -> dict[SampleKey, float]:
    stats = Stats()
    registry = sbus_registry(stats, gauges or Gauges())
    before = samples(registry)
    mutate(stats)
    return changed(before, samples(registry))


def key(metric: str, /, **labels: str) -> SampleKey:
    return (metric, frozenset(labels.items()))


# -- counters: each reason moves exactly its own sample -----------------------


@pytest.mark.parametrize("reason", DROP_REASONS)
def test_each_drop_reason_increments_exactly_its_counter(reason: str) -> None:
    def bump(stats: Stats) -> None:
        stats.drops[reason] += 3

    assert bump_and_diff(bump) == {key("sbus_messages_dropped_total", reason=reason): 3}


@pytest.mark.parametrize("reason", DISCONNECT_REASONS)
def test_each_disconnect_reason_increments_exactly_its_counter(reason: str) -> None:
    def bump(stats: Stats) -> None:
        stats.disconnects[reason] += 1

    assert bump_and_diff(bump) == {key("sbus_disconnects_total", reason=reason): 1}


@pytest.mark.parametrize("reason", REFUSAL_REASONS)
def test_each_refusal_reason_increments_exactly_its_counter(reason: str) -> None:
    def bump(stats: Stats) -> None:
        stats.refusals[reason] += 2

    assert bump_and_diff(bump) == {key("sbus_refusals_total", reason=reason): 2}


@pytest.mark.parametrize("ptype", PACKET_TYPES)
def test_each_packet_type_increments_exactly_its_counter(ptype: str) -> None:
    def bump(stats: Stats) -> None:
        stats.packets_in[ptype] += 2

    assert bump_and_diff(bump) == {key("sbus_packets_received_total", type=ptype): 2}


@pytest.mark.parametrize("where", INTERNAL_ERRORS)
def test_each_internal_error_is_counted_under_its_place(where: str) -> None:
    def bump(stats: Stats) -> None:
        assert stats.bug(where)  # the first: logged with its traceback
        assert not stats.bug(where)  # then counted only

    assert bump_and_diff(bump) == {key("sbus_internal_errors_total", where=where): 2}


def test_a_failing_gauges_snapshot_is_logged_once_and_counted() -> None:
    stats = Stats()

    def broken() -> Gauges:
        raise RuntimeError("a bug")

    registry = sbus_registry(stats, broken)
    for _ in range(3):
        samples(registry)  # each scrape still exports the counters
    assert stats.internal_errors["metrics_gauges"] == 3


SCALAR_COUNTERS = [
    ("connections_accepted", "sbus_connections_accepted_total"),
    ("connections_refused", "sbus_connections_refused_total"),
    ("accept_errors", "sbus_accept_errors_total"),
    ("unknown_unsubscribes", "sbus_unknown_unsubscribes_total"),
    ("log_lines_suppressed", "sbus_log_lines_suppressed_total"),
]


@pytest.mark.parametrize(("attr", "metric"), SCALAR_COUNTERS)
def test_each_scalar_counter_is_exported_once(attr: str, metric: str) -> None:
    def bump(stats: Stats) -> None:
        setattr(stats, attr, getattr(stats, attr) + 5)

    assert bump_and_diff(bump) == {key(metric): 5}


UPSTREAM_COUNTERS = [
    ("upstream_reconnects", key("sbus_upstream_reconnects_total")),
]


@pytest.mark.parametrize(("attr", "sample"), UPSTREAM_COUNTERS)
def test_each_upstream_counter_on_a_relay(attr: str, sample: SampleKey) -> None:
    def bump(stats: Stats) -> None:
        setattr(stats, attr, getattr(stats, attr) + 1)

    assert bump_and_diff(bump, Gauges(is_relay=True)) == {sample: 1}


#: Counters the server sums from its connections on scrape (``Gauges``), with
#: the sample each one must move, on a relay.
TRAFFIC_COUNTERS = [
    ("messages_in", key("sbus_packets_received_total", type="msg")),
    ("bytes_in", key("sbus_received_bytes_total")),
    ("delivered", key("sbus_messages_delivered_total")),
    ("bytes_out", key("sbus_sent_bytes_total")),
    ("forwarded_up", key("sbus_upstream_forwarded_messages_total", direction="up")),
    ("forwarded_down", key("sbus_upstream_forwarded_messages_total", direction="down")),
    ("dropping_clients", key("sbus_clients_dropping")),
]


@pytest.mark.parametrize(("attr", "sample"), TRAFFIC_COUNTERS)
def test_each_traffic_figure_moves_exactly_its_sample(attr: str, sample: SampleKey) -> None:
    current = [Gauges(is_relay=True)]
    registry = sbus_registry(Stats(), lambda: current[0])
    before = samples(registry)
    current[0] = Gauges(is_relay=True, **{attr: 7})
    assert changed(before, samples(registry)) == {sample: 7}


def test_master_exports_no_upstream_families() -> None:
    names = {name for name, _ in samples(sbus_registry(Stats(), Gauges()))}
    assert not {n for n in names if n.startswith("sbus_upstream_")}
    relay = {name for name, _ in samples(sbus_registry(Stats(), Gauges(is_relay=True)))}
    assert "sbus_upstream_connected" in relay


def test_every_stats_field_reaches_the_exposition() -> None:
    """A counter added to Stats but forgotten here would stay invisible."""
    stats = Stats()
    covered = {a for a, _ in SCALAR_COUNTERS} | {a for a, _ in UPSTREAM_COUNTERS}
    covered |= {"packets_in", "drops", "disconnects", "queue_wait_counts", "queue_wait_sum"}
    covered |= {"refusals", "reloads", "last_reload_ok", "internal_errors"}
    assert set(vars(stats)) == covered


# -- histogram ----------------------------------------------------------------


def test_queue_wait_histogram_is_cumulative_with_inf_overflow() -> None:
    stats = Stats()
    waits = [0.0, QUEUE_WAIT_BUCKETS[0], 0.002, 0.002, 0.7, 31.0, 1000.0]
    for w in waits:
        stats.observe_queue_wait(w)
    got = samples(sbus_registry(stats, Gauges()))

    def bucket(le: str) -> float:
        return got[key("sbus_queue_wait_seconds_bucket", le=le)]

    assert bucket("0.0001") == 2  # 0.0 and exactly on the bound: le is inclusive
    assert bucket("0.001") == 2
    assert bucket("0.005") == 4
    assert bucket("0.5") == 4
    assert bucket("1.0") == 5
    assert bucket("30.0") == 5  # 31 s and 1000 s only in +Inf
    assert bucket("+Inf") == len(waits)
    assert got[key("sbus_queue_wait_seconds_count")] == len(waits)
    assert got[key("sbus_queue_wait_seconds_sum")] == pytest.approx(sum(waits))
    les = [dict(k[1])["le"] for k in got if k[0] == "sbus_queue_wait_seconds_bucket"]
    assert len(les) == len(QUEUE_WAIT_BUCKETS) + 1


def test_queue_wait_observation_moves_only_the_histogram() -> None:
    diff = bump_and_diff(lambda s: s.observe_queue_wait(0.02))
    assert diff == {
        key("sbus_queue_wait_seconds_bucket", le="0.05"): 1,
        key("sbus_queue_wait_seconds_bucket", le="0.1"): 1,
        key("sbus_queue_wait_seconds_bucket", le="0.5"): 1,
        key("sbus_queue_wait_seconds_bucket", le="1.0"): 1,
        key("sbus_queue_wait_seconds_bucket", le="5.0"): 1,
        key("sbus_queue_wait_seconds_bucket", le="30.0"): 1,
        key("sbus_queue_wait_seconds_bucket", le="+Inf"): 1,
        key("sbus_queue_wait_seconds_count"): 1,
        key("sbus_queue_wait_seconds_sum"): pytest.approx(0.02),
    }


# -- gauges -------------------------------------------------------------------


def test_gauges_are_exported_from_the_snapshot() -> None:
    g = Gauges(
        clients=7,
        patterns=12,
        distinct_patterns=9,
        queued_messages=30,
        queued_bytes=4000,
        largest_queue_messages=25,
        largest_queue_bytes=3500,
        soft_modes={"queue": 5, "discard": 2},
        hard_modes={"discard": 6, "error": 1},
        blocked_publishers=3,
        is_relay=True,
        upstream_connected=True,
        upstream_interest_patterns=4,
        upstream_queue_messages=11,
    )
    got = samples(sbus_registry(Stats(), g))
    expected = {
        key("sbus_clients_connected"): 7,
        key("sbus_patterns_stored"): 12,
        key("sbus_patterns_distinct"): 9,
        key("sbus_queued_messages"): 30,
        key("sbus_queued_bytes"): 4000,
        key("sbus_largest_queue_messages"): 25,
        key("sbus_largest_queue_bytes"): 3500,
        key("sbus_clients_soft_mode", mode="queue"): 5,
        key("sbus_clients_soft_mode", mode="discard"): 2,
        key("sbus_clients_soft_mode", mode="block"): 0,  # known modes default to 0
        key("sbus_clients_soft_mode", mode="error"): 0,
        key("sbus_clients_hard_mode", mode="discard"): 6,
        key("sbus_clients_hard_mode", mode="block"): 0,
        key("sbus_clients_hard_mode", mode="error"): 1,
        key("sbus_blocked_publishers"): 3,
        key("sbus_upstream_connected"): 1,
        key("sbus_upstream_interest_patterns"): 4,
        key("sbus_upstream_queued_messages"): 11,
        key("sbus_build_info", version=__version__, role="relay", name="test-host"): 1,
    }
    assert {k: got[k] for k in expected} == expected


def test_gauges_are_read_fresh_on_every_scrape() -> None:
    current = [Gauges(clients=1)]
    registry = sbus_registry(Stats(), lambda: current[0])
    assert samples(registry)[key("sbus_clients_connected")] == 1
    current[0] = Gauges(clients=4)
    assert samples(registry)[key("sbus_clients_connected")] == 4


def test_failing_gauges_keep_counters_and_drop_gauges() -> None:
    def broken() -> Gauges:
        raise RuntimeError("server half torn down")

    stats = Stats()
    stats.drops["soft_discard"] = 9
    with capture_logs() as logs:
        got = samples(sbus_registry(stats, broken))
    assert got[key("sbus_messages_dropped_total", reason="soft_discard")] == 9
    assert key("sbus_clients_connected") not in got
    assert [e["event"] for e in logs] == ["metrics.gauges_failed"]


def test_registration_does_not_call_gauges() -> None:
    """Registering before the server runs must not touch its state."""
    calls: list[int] = []

    def gauges() -> Gauges:
        calls.append(1)
        return Gauges()

    sbus_registry(Stats(), gauges)
    assert calls == []


def test_no_exposition_label_is_reserved_or_high_cardinality() -> None:
    stats = Stats()
    got = samples(build_registry(stats, lambda: Gauges(is_relay=True), "h"))
    names = {name for name, _ in got}
    assert {n for n in names if not n.startswith(("sbus_", "process_"))} == set()
    labels = {label for _, ls in got for label, _ in ls}
    # 'instance' and 'job' belong to Prometheus's target labels.
    assert labels == {
        *("type", "reason", "mode", "direction", "le", "version", "role", "name", "result"),
        "where",  # sbus_internal_errors_total: a fixed set (stats.INTERNAL_ERRORS)
    }
    assert any(n.startswith("process_") for n in names)


# -- promtool -----------------------------------------------------------------


def find_promtool() -> str:
    path = shutil.which("promtool") or shutil.which("promtool", path="/usr/bin")
    if path is None:
        pytest.skip(
            "!!! promtool NOT FOUND: install Debian's 'prometheus' package "
            "(apt-get install prometheus) to lint the exposition !!!"
        )
    return path


def busy_stats() -> Stats:
    stats = Stats()
    for i, t in enumerate(PACKET_TYPES):
        stats.packets_in[t] = 10 + i
    for i, r in enumerate(DROP_REASONS):
        stats.drops[r] = 1 + i
    for i, r in enumerate(DISCONNECT_REASONS):
        stats.disconnects[r] = 2 + i
    for w in (0.00005, 0.003, 0.2, 99.0):
        stats.observe_queue_wait(w)
    stats.upstream_reconnects = 2
    return stats


def test_promtool_check_metrics_passes() -> None:
    promtool = find_promtool()
    g = Gauges(
        messages_in=100,
        bytes_in=5000,
        delivered=100,
        bytes_out=9000,
        forwarded_up=30,
        forwarded_down=40,
        clients=2,
        soft_modes={"discard": 1},
        is_relay=True,
        upstream_connected=True,
    )
    text = generate_latest(build_registry(busy_stats(), lambda: g, "h"))
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=20
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    # promtool exits 0 on lint warnings too; we want none at all.
    assert result.stdout.strip() == b"", result.stdout.decode()
    assert result.stderr.strip() == b"", result.stderr.decode()


# -- HTTP ---------------------------------------------------------------------


def fetch(url: str) -> tuple[int, bytes]:
    """GET in a real thread, so the gevent hub keeps serving meanwhile."""

    def get() -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    result: tuple[int, bytes] = gevent.get_hub().threadpool.spawn(get).get(timeout=10)
    return result


def test_serve_metrics_and_healthz_on_port_zero() -> None:
    healthy = [True]
    stats = busy_stats()
    server = serve("127.0.0.1", 0, build_registry(stats, Gauges, "h"), lambda: healthy[0])
    try:
        port = server.server_port
        assert port > 0
        status, body = fetch(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert b'sbus_messages_dropped_total{reason="soft_discard"} 1.0' in body
        assert b"process_cpu_seconds_total" in body
        assert fetch(f"http://127.0.0.1:{port}/healthz") == (200, b"ok\n")
        healthy[0] = False
        assert fetch(f"http://127.0.0.1:{port}/healthz")[0] == 503
        assert fetch(f"http://127.0.0.1:{port}/nope")[0] == 404
    finally:
        server.stop(timeout=1)


@dataclass
class FakeConfig:
    metrics: str | None
    instance: str = "box-1"


@dataclass
class FakeServer:
    stats: Stats = field(default_factory=Stats)
    stopped: Event = field(default_factory=Event)
    fail: bool = False
    started: float = 0.0

    def gauges(self) -> Gauges:
        if self.fail:
            raise RuntimeError("gone")
        return Gauges(clients=3)

    def who(self) -> dict[str, list[Any]]:
        return {}

    def client_rows(self) -> list[dict[str, Any]]:
        return []


def test_serve_from_config_logs_port_and_reports_health() -> None:
    bus: Any = FakeServer()
    with capture_logs() as logs:
        server = serve_from_config(FakeConfig("127.0.0.1:0"), bus)
    try:
        listening = [e for e in logs if e["event"] == "metrics.listening"]
        assert listening == [
            {
                "event": "metrics.listening",
                "host": "127.0.0.1",
                "port": server.server_port,
                "log_level": "info",
            }
        ]
        status, body = fetch(f"http://127.0.0.1:{server.server_port}/metrics")
        assert status == 200
        assert b"sbus_clients_connected 3.0" in body
        assert b'name="box-1"' in body
        assert fetch(f"http://127.0.0.1:{server.server_port}/healthz")[0] == 200
        bus.stopped.set()
        assert fetch(f"http://127.0.0.1:{server.server_port}/healthz")[0] == 503
        bus.stopped.clear()
        bus.fail = True
        with capture_logs():
            assert fetch(f"http://127.0.0.1:{server.server_port}/healthz")[0] == 503
    finally:
        server.stop(timeout=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9810", ("127.0.0.1", 9810)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9811", ("::1", 9811)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text", ["9810", ":9810", "host:", "host:port", "host:70000"])
def test_parse_host_port_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_host_port(text)
    assert info.value.key == "metrics"
