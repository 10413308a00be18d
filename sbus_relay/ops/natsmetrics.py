"""The ``sbus_nats_`` metric families of a bus joined to NATS (docs/observability.md).

What it owns: the sbus_nats_ metric families.  What it may touch: the link's
state, read only.

Read on each scrape from the link's ``state()`` (plain numbers its bridge
counts; nothing on the message path takes a lock).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sbus_relay.protocol.natsorigins import CAUSES, REFUSALS
from sbus_relay.protocol.stats import Stats

log = structlog.get_logger("sbus_relay.metrics")


class NatsCollector:
    """Families for the NATS link: state, traffic each way, drops, queue, reconnects, rtt."""

    def __init__(
        self,
        state_fn: Callable[[], dict[str, Any]],
        instance: Callable[[], str],
        stats: Stats | None = None,
    ) -> None:
        self._state_fn = state_fn
        self._instance = instance
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._state_fn()
        except Exception:  # a bug of ours: logged once, counted (metrics_nats)
            if self._stats is None or self._stats.bug("metrics_nats"):
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
            "Messages that did not cross, by reason, counted where they were dropped "
            "(docs/nats.md, Who counts what).",
            labels=["reason"],
        )
        for reason, n in s["drops"].items():
            drops.add_metric([reason], n)
        yield drops
        yield from self._fleet(s)
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

    @staticmethod
    def _fleet(s: dict[str, Any]) -> Iterator[Metric]:
        """What came from each other host (origin: the first hosts heard, then
        ``other``): delivered, lost by cause, refused by reason."""
        counts: dict[str, dict[str, int]] = s.get("origin_counts", {})
        delivered = CounterMetricFamily(
            "sbus_nats_origin_messages",
            "Messages from each other host delivered to this bus.",
            labels=["origin"],
        )
        lost = CounterMetricFamily(
            "sbus_nats_lost_messages",
            "Messages other hosts sent this host that never arrived, by origin and by "
            "cause as this host can tell (docs/nats.md, Every loss seen).",
            labels=["origin", "cause"],
        )
        refused = CounterMetricFamily(
            "sbus_nats_refused_messages",
            "Messages from other hosts refused, never delivered out of order: "
            "duplicate (delivered before) or late (older than one delivered).",
            labels=["origin", "reason"],
        )
        for origin, row in sorted(counts.items()):
            delivered.add_metric([origin], row["delivered"])
            for cause in CAUSES:
                lost.add_metric([origin, cause], row["lost_" + cause])
            for reason in REFUSALS:
                refused.add_metric([origin, reason], row[reason])
        yield delivered
        yield lost
        yield refused
        yield CounterMetricFamily(
            "sbus_nats_unconfirmed_messages",
            "Messages handed to a NATS server that went away before confirming them: "
            "at most lost (an upper bound; the receivers count what was).",
            value=s.get("unconfirmed_total", 0),
        )
        malformed = CounterMetricFamily(
            "sbus_nats_malformed_messages",
            "What arrived under the subject prefix and was refused as malformed or "
            "out of bounds: message envelopes and counts, interest announcements.",
            labels=["what"],
        )
        malformed.add_metric(["envelope"], s.get("malformed", 0))
        malformed.add_metric(["announcement"], s.get("refused_announcements", 0))
        yield malformed
        yield GaugeMetricFamily(
            "sbus_nats_silent_hosts",
            "Other hosts not heard from lately, still counted for (docs/nats.md).",
            value=s.get("silent_hosts", 0),
        )
