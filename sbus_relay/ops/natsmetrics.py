"""The ``sbus_nats_`` metric families of a bus joined to NATS (docs/observability.md).

Read on each scrape from the link's ``state()`` (plain numbers its bridge
counts; nothing on the message path takes a lock).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = structlog.get_logger("sbus_relay.metrics")


class NatsCollector:
    """Families for the NATS link: state, traffic each way, drops, queue, reconnects, rtt."""

    def __init__(self, state_fn: Callable[[], dict[str, Any]], instance: Callable[[], str]) -> None:
        self._state_fn = state_fn
        self._instance = instance

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._state_fn()
        except Exception:
            log.exception("metrics.nats_failed")
            return
        up = GaugeMetricFamily(
            "sbus_nats_connected", "1 while the link to NATS is up, else 0.", labels=["host"]
        )
        up.add_metric([s["host"]], 1 if s["connected"] else 0)
        yield up
        msgs = CounterMetricFamily(
            "sbus_nats_messages",
            "Messages sent to NATS (out) and taken from it for local clients (in).",
            labels=["direction"],
        )
        msgs.add_metric(["out"], s["sent"])
        msgs.add_metric(["in"], s["received"])
        yield msgs
        nbytes = CounterMetricFamily(
            "sbus_nats_bytes", "Payload bytes sent to NATS and taken from it.", labels=["direction"]
        )
        nbytes.add_metric(["out"], s["sent_bytes"])
        nbytes.add_metric(["in"], s["received_bytes"])
        yield nbytes
        drops = CounterMetricFamily(
            "sbus_nats_dropped_messages",
            "Messages that did not cross, by reason (docs/nats.md, Failures).",
            labels=["reason"],
        )
        for reason, n in s["drops"].items():
            drops.add_metric([reason], n)
        yield drops
        yield GaugeMetricFamily(
            "sbus_nats_queued_messages",
            "Messages waiting for NATS (while it is away or slow), bounded.",
            value=s["queued_messages"],
        )
        yield GaugeMetricFamily(
            "sbus_nats_queued_bytes", "Bytes of those messages.", value=s["queued_bytes"]
        )
        yield CounterMetricFamily(
            "sbus_nats_reconnects", "Reconnections to NATS after a loss.", value=s["reconnects"]
        )
        yield GaugeMetricFamily(
            "sbus_nats_rtt_seconds", "Round-trip time to the NATS server.", value=s["rtt"]
        )
        yield GaugeMetricFamily(
            "sbus_nats_subscriptions", "NATS subscriptions held for local patterns.",
            value=s["subscriptions"],
        )  # fmt: skip
        yield GaugeMetricFamily(
            "sbus_nats_remote_hosts", "Other hosts heard from on NATS.", value=s["remote_hosts"]
        )
        yield GaugeMetricFamily(
            "sbus_nats_remote_patterns",
            "Distinct patterns the other hosts want (what may leave this host).",
            value=s["remote_patterns"],
        )
        process = s.get("process")
        if isinstance(process, dict):
            # the link's process of its own (docs/nats.md, "How it is built")
            yield GaugeMetricFamily(
                "sbus_nats_link_up",
                "1 while the link's process runs, else 0 (being restarted).",
                value=1 if process.get("pid") else 0,
            )
            yield GaugeMetricFamily(
                "sbus_nats_link_resident_bytes",
                "Resident memory of the link's process.",
                value=process.get("rss_bytes", 0),
            )
            yield GaugeMetricFamily(
                "sbus_nats_link_threads", "Threads of the link's process.",
                value=process.get("threads", 0),
            )  # fmt: skip
            yield CounterMetricFamily(
                "sbus_nats_link_restarts",
                "Times the link's process died and was started again.",
                value=process.get("restarts", 0),
            )
