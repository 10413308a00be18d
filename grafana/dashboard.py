"""The sbus Grafana dashboard, as code: writes ``grafana/sbus-dashboard.json``.

    python grafana/dashboard.py > grafana/sbus-dashboard.json
    python grafana/dashboard.py --out grafana/sbus-dashboard.json
    python grafana/dashboard.py --check     # exit 1 if the committed JSON differs

Built with Grafana's own Python SDK, ``grafana-foundation-sdk`` (pinned in the
``dev`` extra of pyproject.toml: its output is what gets committed, so a new SDK
build is a deliberate change, regenerated and reviewed).  The committed JSON is
this script's output byte for byte; ``tests/metrics/test_dashboard_generated.py``
fails when they differ.  Every metric is described in docs/observability.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from grafana_foundation_sdk.builders import bargauge, common, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

OUT = Path(__file__).resolve().parent / "sbus-dashboard.json"

#: Every query goes to the Prometheus picked in the ``datasource`` variable.
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

#: Every series is restricted to the instances picked in the variables.
SELECTOR = 'job=~"$job", instance=~"$instance"'

MSG_PACKETS = 'type="msg"'
#: Clients in a flood mode other than the default (soft queue, hard discard).
NOT_QUEUE = 'mode!="queue"'
NOT_DISCARD = 'mode!="discard"'


# --- queries ----------------------------------------------------------------------


def sel(metric: str, *matchers: str) -> str:
    """``metric{job=~"$job", instance=~"$instance", <matchers>}``."""
    return f"{metric}{{{', '.join((SELECTOR, *matchers))}}}"


def rate(metric: str, *matchers: str, window: str = "$__rate_interval") -> str:
    return f"rate({sel(metric, *matchers)}[{window}])"


def increase(metric: str, *matchers: str, window: str = "$__rate_interval") -> str:
    return f"increase({sel(metric, *matchers)}[{window}])"


def query(
    ref_id: str,
    expr: str,
    legend: str = "",
    *,
    when: Literal["range", "instant", "both"] = "range",
    as_table: bool = False,
) -> prometheus.Dataquery:
    """One PromQL target, written in code mode.

    ``when``: a range query (a series over the time range), an instant one (one
    value at its end: what bar gauges and tables show), or both.
    """
    q = (
        prometheus.Dataquery()
        .ref_id(ref_id)
        .datasource(DATASOURCE)
        .expr(expr)
        .legend_format(legend)
        .editor_mode(pm.QueryEditorMode.CODE)
    )
    if as_table:
        q.format(pm.PromQueryFormat.TABLE)
    return {"range": q.range, "instant": q.instant, "both": q.range_and_instant}[when]()


def queries(*specs: tuple[str, str]) -> list[prometheus.Dataquery]:
    """Targets A, B, C ... from ``(expr, legend)`` pairs."""
    return [query(chr(ord("A") + i), expr, legend) for i, (expr, legend) in enumerate(specs)]


# --- panels -----------------------------------------------------------------------


P = TypeVar("P", timeseries.Panel, stat.Panel, table.Panel, bargauge.Panel)


def _base(
    panel: P,
    pid: int,
    title: str,
    description: str,
    unit: str,
    targets: list[prometheus.Dataquery],
    w: int,
    h: int,
) -> P:
    panel.id(pid).title(title).description(description).datasource(DATASOURCE)
    panel.span(w).height(h).unit(unit)
    for target in targets:
        panel.with_target(target)
    return panel


def graph(
    pid: int,
    title: str,
    description: str,
    unit: str,
    targets: list[prometheus.Dataquery],
    *,
    w: int = 12,
    h: int = 8,
    stacking: cm.StackingMode = cm.StackingMode.NONE,
    draw: cm.GraphDrawStyle = cm.GraphDrawStyle.LINE,
    line_width: int = 1,
    fill: int = 10,
) -> timeseries.Panel:
    """A time series with the dashboard's usual look: thin lines, legend as a table."""
    panel = _base(timeseries.Panel(), pid, title, description, unit, targets, w, h)
    return (
        panel.draw_style(draw)
        .line_width(line_width)
        .fill_opacity(fill)
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(common.StackingConfig().mode(stacking).group("A"))
        .min(0)
        .legend(
            common.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM)
            .calcs(["lastNotNull", "max"])
            .show_legend(True)
        )
        .tooltip(
            common.VizTooltipOptions()
            .mode(cm.TooltipDisplayMode.MULTI)
            .sort(cm.SortOrder.DESCENDING)
        )
    )


def last_value() -> common.ReduceDataOptions:
    return common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def up_down(pid: int, title: str, description: str, expr: str) -> stat.Panel:
    """A stat per instance: green UP for 1, red DOWN for 0."""
    panel = _base(
        stat.Panel(), pid, title, description, "short", [query("A", expr, "{{instance}}")], 6, 5
    )
    return (
        panel.mappings(
            [
                dm.ValueMap(
                    {
                        "0": dm.ValueMappingResult(text="DOWN", color="red", index=0),
                        "1": dm.ValueMappingResult(text="UP", color="green", index=1),
                    }
                )
            ]
        )
        .thresholds(
            dash.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=None, color="red"), dm.Threshold(value=1, color="green")])
        )
        .color_scheme(dash.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .reduce_options(last_value())
        .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
    )


# --- the dashboard ------------------------------------------------------------------


def overview(d: dash.Dashboard) -> None:
    d.with_row(dash.Row("Overview").id(1).collapsed(False))
    d.with_panel(
        up_down(
            2,
            "Scrape target up",
            "1 when Prometheus could scrape the instance's /metrics.",
            f"up{{{SELECTOR}}}",
        )
    )
    d.with_panel(
        up_down(
            3,
            "Relay upstream connected",
            "Per relay: UP while connected to its upstream (protocol.md: Relays). "
            "Masters have no upstream.",
            sel("sbus_upstream_connected"),
        )
    )
    d.with_panel(
        _base(
            stat.Panel(),
            4,
            "Clients connected",
            "Clients connected to each instance now.",
            "short",
            [query("A", f"sum by (instance) ({sel('sbus_clients_connected')})", "{{instance}}")],
            6,
            5,
        )
        .color_mode(cm.BigValueColorMode.NONE)
        .graph_mode(cm.BigValueGraphMode.AREA)
        .reduce_options(last_value())
        .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
    )
    d.with_panel(
        _base(
            table.Panel(),
            5,
            "Instances",
            "Version, role (master or relay) and configured name of each instance.",
            "short",
            [query("A", sel("sbus_build_info"), when="both")],
            6,
            5,
        )
        .show_header(True)
        .with_transformation(
            dm.DataTransformerConfig(id_val="labelsToFields", options={"mode": "columns"})
        )
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True},
                    "indexByName": {"instance": 0, "role": 1, "version": 2, "name": 3},
                },
            )
        )
    )


def traffic(d: dash.Dashboard) -> None:
    d.with_row(dash.Row("Traffic").id(6).collapsed(False))
    d.with_panel(
        graph(
            7,
            "Messages per second",
            "Published (MSG packets received) and delivered (copies handed to "
            "subscribers' sockets) per instance.",
            "ops",
            queries(
                (
                    f"sum by (instance) ({rate('sbus_packets_received_total', MSG_PACKETS)})",
                    "{{instance}} published",
                ),
                (
                    f"sum by (instance) ({rate('sbus_messages_delivered_total')})",
                    "{{instance}} delivered",
                ),
            ),
        )
    )
    d.with_panel(
        graph(
            8,
            "Bytes in / out",
            "Bytes read from and written to clients per instance.",
            "Bps",
            queries(
                (f"sum by (instance) ({rate('sbus_received_bytes_total')})", "{{instance}} in"),
                (f"sum by (instance) ({rate('sbus_sent_bytes_total')})", "{{instance}} out"),
            ),
        )
    )
    d.with_panel(
        graph(
            9,
            "Packets received by type",
            "SUB, UNSUB, MSG, CMSG and invalid (protocol error) packets.",
            "pps",
            queries(
                (
                    f"sum by (instance, type) ({rate('sbus_packets_received_total')})",
                    "{{instance}} {{type}}",
                )
            ),
        )
    )
    d.with_panel(
        graph(
            10,
            "Forwarded through the upstream",
            "Relays: messages sent up to the upstream and received down from it for local clients.",
            "ops",
            queries(
                (
                    "sum by (instance, direction) "
                    f"({rate('sbus_upstream_forwarded_messages_total')})",
                    "{{instance}} {{direction}}",
                )
            ),
        )
    )


def drops_and_disconnects(d: dash.Dashboard) -> None:
    d.with_row(dash.Row("Drops and disconnects").id(11).collapsed(False))
    d.with_panel(
        graph(
            12,
            "Messages dropped by reason",
            "Messages not delivered, per instance and reason (soft/hard discard, slow "
            "client cut off, reserved key, upstream queue overflow ...).",
            "ops",
            queries(
                (
                    f"sum by (instance, reason) ({rate('sbus_messages_dropped_total')})",
                    "{{instance}} {{reason}}",
                )
            ),
            stacking=cm.StackingMode.NORMAL,
        )
    )
    d.with_panel(
        graph(
            13,
            "Disconnects by reason",
            "Client disconnects per instance and reason (closed, protocol_error, "
            "slow_client, secret_refused ...).",
            "ops",
            queries(
                (
                    f"sum by (instance, reason) ({rate('sbus_disconnects_total')})",
                    "{{instance}} {{reason}}",
                )
            ),
            stacking=cm.StackingMode.NORMAL,
        )
    )
    d.with_panel(
        _base(
            bargauge.Panel(),
            14,
            "Drops in the selected range",
            "Total drops per reason over the dashboard's time range.",
            "short",
            queries(
                (
                    "sum by (reason) "
                    f"({increase('sbus_messages_dropped_total', window='$__range')})",
                    "{{reason}}",
                )
            ),
            12,
            7,
        )
        .display_mode(cm.BarGaugeDisplayMode.BASIC)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .reduce_options(last_value())
        .show_unfilled(True)
    )
    d.with_panel(
        graph(
            15,
            "Connections accepted and refused",
            "New client connections, and peers refused at accept (-u users, max clients) "
            "or accept errors.",
            "cps",
            queries(
                (
                    f"sum by (instance) ({rate('sbus_connections_accepted_total')})",
                    "{{instance}} accepted",
                ),
                (
                    f"sum by (instance) ({rate('sbus_connections_refused_total')})",
                    "{{instance}} refused",
                ),
                (
                    f"sum by (instance) ({rate('sbus_accept_errors_total')})",
                    "{{instance}} accept errors",
                ),
            ),
            h=7,
        )
    )


def queues_and_slow_clients(d: dash.Dashboard) -> None:
    d.with_row(dash.Row("Queues and slow clients").id(16).collapsed(False))
    d.with_panel(
        graph(
            17,
            "Queued messages",
            "Messages waiting in all clients' outgoing queues, and in the longest single queue.",
            "short",
            queries(
                (f"sum by (instance) ({sel('sbus_queued_messages')})", "{{instance}} total"),
                (
                    f"max by (instance) ({sel('sbus_largest_queue_messages')})",
                    "{{instance}} largest",
                ),
            ),
        )
    )
    d.with_panel(
        graph(
            18,
            "Queued bytes",
            "Bytes waiting in all clients' outgoing queues, and in the largest one.",
            "bytes",
            queries(
                (f"sum by (instance) ({sel('sbus_queued_bytes')})", "{{instance}} total"),
                (
                    f"max by (instance) ({sel('sbus_largest_queue_bytes')})",
                    "{{instance}} largest",
                ),
            ),
        )
    )
    buckets = f"sum by (instance, le) ({rate('sbus_queue_wait_seconds_bucket')})"
    d.with_panel(
        graph(
            19,
            "Queue wait latency",
            "Time a message waited in a client's queue before its socket took it (p50, p99). "
            "Empty/NaN when nothing had to be queued.",
            "s",
            queries(
                (f"histogram_quantile(0.5, {buckets})", "{{instance}} p50"),
                (f"histogram_quantile(0.99, {buckets})", "{{instance}} p99"),
            ),
        )
    )
    d.with_panel(
        graph(
            20,
            "Slow clients",
            "Clients whose messages are being dropped now (a slow consumer's drop episode, "
            "logged as flood.drop when it begins), clients in a non-default flood mode "
            "(soft discard/block/error, hard block/error) and publishers currently paused "
            "by a block mode.",
            "short",
            queries(
                (
                    f"sum by (instance) ({sel('sbus_clients_dropping')})",
                    "{{instance}} dropping now",
                ),
                (
                    f"sum by (instance, mode) ({sel('sbus_clients_soft_mode', NOT_QUEUE)})",
                    "{{instance}} soft/{{mode}}",
                ),
                (
                    f"sum by (instance, mode) ({sel('sbus_clients_hard_mode', NOT_DISCARD)})",
                    "{{instance}} hard/{{mode}}",
                ),
                (
                    f"sum by (instance) ({sel('sbus_blocked_publishers')})",
                    "{{instance}} blocked publishers",
                ),
            ),
        )
    )


#: How many relays or users each panel of the Who row shows (largest first).
TOP = 10


@dataclass(frozen=True)
class Who:
    """One way the Who row splits a bus's clients: by relay or by user."""

    name: str  # in titles: "relay", "user"
    prefix: str  # of the metric names
    label: str  # the Prometheus label
    legend: str  # series names: always the bus (instance) first
    column: str  # table column of the label
    series: str  # the legend, in words
    note: str  # what the label's values mean


RELAY = Who(
    "relay",
    "sbus_relay_",
    "relay",
    "{{instance}} / {{relay}}",
    "Relay",
    "Series: bus / relay.",
    "On a master the relay is the container: the name its relay announced, or "
    "cred:<gid>/<uid>/<pid> if it announced none; local is the bus's own clients, other "
    "everyone beyond the bus's top N (accounting_top).",
)
USER = Who(
    "user",
    "sbus_user_",
    "uid",
    "{{instance}} / uid {{uid}}",
    "User (uid)",
    "Series: bus / uid.",
    "The uid is the connected peer's; other is everyone beyond the bus's top N (accounting_top).",
)


def top(who: Who, expr: str, *, only_positive: bool = False) -> str:
    """The ``TOP`` largest series of ``expr`` summed by bus and relay (or uid)."""
    summed = f"sum by (instance, {who.label}) ({expr})"
    return f"topk({TOP}, {summed}{' > 0' if only_positive else ''})"


def top_publishers(pid: int, who: Who) -> timeseries.Panel:
    return graph(
        pid,
        f"Top publishers by {who.name}",
        f"Messages per second received from each {who.name} (the MSG packets it "
        f"published), the {TOP} busiest. {who.series} {who.note}",
        "count:msgs/s",
        [query("A", top(who, rate(f"{who.prefix}messages_in_total")), who.legend)],
    )


def top_droppers(pid: int, who: Who) -> timeseries.Panel:
    dropped = rate(f"{who.prefix}dropped_messages_total")
    return graph(
        pid,
        f"Top droppers by {who.name}",
        f"Messages per second the bus dropped on account of each {who.name} (mostly: "
        "its queue was full in a discard mode, or it was cut off with messages still "
        f"queued), the {TOP} worst; a series shows only while it drops. Why: 'Messages "
        f"dropped by reason'. {who.series} {who.note}",
        "count:msgs/s",
        [query("A", top(who, dropped, only_positive=True), who.legend)],
    )


def deepest_queues(pid: int, who: Who) -> table.Panel:
    messages, size = "Queued messages", "Queued bytes"
    return (
        _base(
            table.Panel(),
            pid,
            f"Deepest queues by {who.name}",
            f"Messages and bytes waiting now in the queues of each {who.name}'s clients, "
            f"the {TOP} deepest by either measure, deepest first, with the bus each is "
            f"on. {who.note}",
            "count:msgs",
            [
                query(ref, top(who, sel(f"{who.prefix}{metric}")), when="instant", as_table=True)
                for ref, metric in (("A", "queued_messages"), ("B", "queued_bytes"))
            ],
            12,
            8,
        )
        .show_header(True)
        .sort_by([common.TableSortByFieldState().display_name(messages).desc(True)])
        # One row per bus and relay (or uid) with both values, whichever query found it.
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {"instance": 0, who.label: 1, "Value #A": 2, "Value #B": 3},
                    "renameByName": {
                        "instance": "Bus",
                        who.label: who.column,
                        "Value #A": messages,
                        "Value #B": size,
                    },
                },
            )
        )
        .override_by_name(size, [dm.DynamicConfigValue(id_val="unit", value="bytes")])
    )


def disconnects(pid: int, who: Who) -> bargauge.Panel:
    closed = increase(f"{who.prefix}disconnects_total", window="$__range")
    return (
        _base(
            bargauge.Panel(),
            pid,
            f"Disconnects by {who.name} in the selected range",
            f"Connections of each {who.name} that the bus closed for a reason (protocol "
            "error, slow client, refused secret ...; not the peer's own close) over the "
            f"dashboard's time range, the {TOP} most. Why: 'Disconnects by reason'. "
            f"{who.series} {who.note}",
            "count:disconnects",
            [query("A", top(who, closed, only_positive=True), who.legend, when="instant")],
            12,
            7,
        )
        .decimals(0)
        .display_mode(cm.BarGaugeDisplayMode.BASIC)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .reduce_options(last_value())
        .show_unfilled(True)
    )


def who(d: dash.Dashboard) -> None:
    """Which relay (container) and which user publish, lose messages, queue, get cut off."""
    d.with_row(dash.Row("Who").id(29).collapsed(False))
    d.with_panel(top_publishers(30, RELAY))
    d.with_panel(top_publishers(31, USER))
    d.with_panel(top_droppers(32, RELAY))
    d.with_panel(top_droppers(33, USER))
    d.with_panel(deepest_queues(34, RELAY))
    d.with_panel(deepest_queues(35, USER))
    d.with_panel(disconnects(36, RELAY))
    d.with_panel(disconnects(37, USER))


def upstream(d: dash.Dashboard) -> None:
    d.with_row(dash.Row("Upstream (relays)").id(21).collapsed(False))
    d.with_panel(
        graph(
            22,
            "Upstream state",
            "1 connected, 0 lost, per relay.",
            "short",
            queries((sel("sbus_upstream_connected"), "{{instance}}")),
            w=8,
            line_width=2,
            fill=20,
        )
        .line_interpolation(cm.LineInterpolation.STEP_AFTER)
        .max(1)
    )
    d.with_panel(
        graph(
            23,
            "Upstream reconnects",
            "Reconnections to the upstream after a loss.",
            "short",
            queries(
                (
                    f"sum by (instance) ({increase('sbus_upstream_reconnects_total')})",
                    "{{instance}}",
                )
            ),
            w=8,
            draw=cm.GraphDrawStyle.BARS,
            fill=60,
        )
    )
    d.with_panel(
        graph(
            24,
            "Upstream queue and interest",
            "Upward messages waiting during an outage, and patterns the upstream said it wants.",
            "short",
            queries(
                (
                    f"sum by (instance) ({sel('sbus_upstream_queued_messages')})",
                    "{{instance}} queued",
                ),
                (
                    f"sum by (instance) ({sel('sbus_upstream_interest_patterns')})",
                    "{{instance}} interest patterns",
                ),
            ),
            w=8,
        )
    )


def nats(d: dash.Dashboard) -> None:
    """The link of a master joined to NATS (docs/nats.md); empty on other buses."""
    d.with_row(dash.Row("NATS link (hosts)").id(40).collapsed(False))
    d.with_panel(
        graph(
            41,
            "NATS link state",
            "1 while the bus's link to NATS is up, 0 while it is away; per bus.",
            "short",
            queries((sel("sbus_nats_connected"), "{{instance}}")),
            w=8,
            line_width=2,
            fill=20,
        )
        .line_interpolation(cm.LineInterpolation.STEP_AFTER)
        .max(1)
    )
    d.with_panel(
        graph(
            42,
            "Messages to and from other hosts",
            "Messages sent to NATS (out: another host wants them) and taken from it (in).",
            "short",
            queries(
                (
                    f"sum by (instance, direction) ({rate('sbus_nats_messages_total')})",
                    "{{instance}} {{direction}}",
                ),
                (
                    f"sum by (instance, direction) ({rate('sbus_nats_bytes_total')})",
                    "{{instance}} {{direction}} bytes",
                ),
            ),
            w=8,
        ).override_by_regexp(
            ".* bytes",
            [
                dm.DynamicConfigValue(id_val="unit", value="Bps"),
                dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            ],
        )
    )
    d.with_panel(
        graph(
            43,
            "NATS drops by reason",
            "Messages that did not cross: the link's queue overflowed while NATS was away, "
            "NATS refused, the bus fell behind, a message too large for an sbus packet ...",
            "short",
            queries(
                (
                    f"sum by (instance, reason) ({increase('sbus_nats_dropped_messages_total')})",
                    "{{instance}} {{reason}}",
                )
            ),
            w=8,
            draw=cm.GraphDrawStyle.BARS,
            fill=60,
        )
    )
    d.with_panel(
        graph(
            44,
            "NATS queue and reconnects",
            "Messages waiting for NATS (bounded), and reconnections after a loss.",
            "short",
            queries(
                (f"sum by (instance) ({sel('sbus_nats_queued_messages')})", "{{instance}} queued"),
                (
                    f"sum by (instance) ({increase('sbus_nats_reconnects_total')})",
                    "{{instance}} reconnects",
                ),
            ),
            w=8,
        )
    )
    d.with_panel(
        graph(
            45,
            "NATS round trip",
            "PING to PONG with the NATS server the link is connected to.",
            "s",
            queries((sel("sbus_nats_rtt_seconds"), "{{instance}}")),
            w=8,
        )
    )
    d.with_panel(
        graph(
            46,
            "Other hosts and their interest",
            "Hosts heard from on NATS, and the distinct patterns they want from this one.",
            "short",
            queries(
                (sel("sbus_nats_remote_hosts"), "{{instance}} hosts"),
                (sel("sbus_nats_remote_patterns"), "{{instance}} patterns"),
            ),
            w=8,
        )
    )
    d.with_panel(
        graph(
            47,
            "Lost on the way from other hosts",
            "Messages other hosts sent this bus that never arrived, by origin and cause "
            "(counted here, once: docs/nats.md), and those refused rather than delivered "
            "out of order (duplicate, late); unconfirmed: what this bus handed to a NATS "
            "server that went away, at most lost (the receivers count what was).",
            "short",
            queries(
                (
                    f"sum by (instance, origin, cause) "
                    f"({increase('sbus_nats_lost_messages_total')})",
                    "{{instance}} lost from {{origin}} ({{cause}})",
                ),
                (
                    f"sum by (instance, origin, reason) "
                    f"({increase('sbus_nats_refused_messages_total')})",
                    "{{instance}} refused from {{origin}} ({{reason}})",
                ),
                (
                    f"sum by (instance) ({increase('sbus_nats_unconfirmed_messages_total')})",
                    "{{instance}} unconfirmed",
                ),
            ),
            w=8,
            draw=cm.GraphDrawStyle.BARS,
            fill=60,
        )
    )
    d.with_panel(
        graph(
            48,
            "NATS link process",
            "The link's process of its own: 1 while it runs (0 while it is started again), "
            "its restarts after it died, its threads and its resident memory.",
            "short",
            queries(
                (sel("sbus_nats_link_up"), "{{instance}} up"),
                (
                    f"sum by (instance) ({increase('sbus_nats_link_restarts_total')})",
                    "{{instance}} restarts",
                ),
                (sel("sbus_nats_link_threads"), "{{instance}} threads"),
                (sel("sbus_nats_link_resident_bytes"), "{{instance}} resident bytes"),
            ),
            w=8,
        ).override_by_regexp(
            ".* bytes",
            [
                dm.DynamicConfigValue(id_val="unit", value="bytes"),
                dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            ],
        )
    )


def clients_and_process(d: dash.Dashboard) -> None:
    d.with_row(dash.Row("Clients, patterns and process").id(25).collapsed(False))
    d.with_panel(
        graph(
            26,
            "Clients and patterns",
            "Clients connected, subscriptions stored (duplicates counted) and distinct patterns.",
            "short",
            queries(
                (f"sum by (instance) ({sel('sbus_clients_connected')})", "{{instance}} clients"),
                (f"sum by (instance) ({sel('sbus_patterns_stored')})", "{{instance}} patterns"),
                (f"sum by (instance) ({sel('sbus_patterns_distinct')})", "{{instance}} distinct"),
            ),
            w=8,
        )
    )
    d.with_panel(
        graph(
            27,
            "CPU",
            "CPU seconds per second used by each sbus process.",
            "percentunit",
            queries((rate("process_cpu_seconds_total"), "{{instance}}")),
            w=8,
        )
    )
    d.with_panel(
        graph(
            28,
            "Memory and file descriptors",
            "Resident memory and open fds of each sbus process.",
            "bytes",
            queries(
                (sel("process_resident_memory_bytes"), "{{instance}} rss"),
                (sel("process_open_fds"), "{{instance}} fds"),
            ),
            w=8,
        ).override_by_regexp(
            ".* fds",
            [
                dm.DynamicConfigValue(id_val="unit", value="short"),
                dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            ],
        )
    )


def variables(d: dash.Dashboard) -> None:
    d.with_variable(
        dash.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .hide(dm.VariableHide.DONT_HIDE)
        .multi(False)
        .include_all(False)
        .regex("")
    )
    for name, label, source in (
        ("job", "Job", "label_values(sbus_build_info, job)"),
        ("instance", "Instance", 'label_values(sbus_build_info{job=~"$job"}, instance)'),
    ):
        d.with_variable(
            dash.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query({"query": source, "refId": name})
            .hide(dm.VariableHide.DONT_HIDE)
            .include_all(True)
            .all_value(".*")
            .multi(True)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .regex("")
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
        )


def build() -> dm.Dashboard:
    d = (
        dash.Dashboard("sbus relay hierarchy")
        .uid("sbus-relay")
        .description(
            "sbus_relay master and relays: traffic, drops, queues, slow clients, upstream "
            "links. Metrics: docs/observability.md."
        )
        .tags(["sbus", "sbus_relay"])
        .timezone("browser")
        .version(1)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .time("now-1h", "now")
        .fiscal_year_start_month(0)
        .live_now(False)
        .week_start("")
        .annotation(
            dash.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
    )
    variables(d)
    for section in (
        overview,
        traffic,
        drops_and_disconnects,
        queues_and_slow_clients,
        who,
        upstream,
        nats,
        clients_and_process,
    ):
        section(d)
    return d.build()


def render() -> str:
    """The dashboard JSON exactly as committed."""
    return json.dumps(build(), cls=JSONEncoder, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the sbus Grafana dashboard JSON.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--out", type=Path, help="write the JSON to this file (default: stdout)")
    group.add_argument(
        "--check",
        type=Path,
        nargs="?",
        const=OUT,
        metavar="FILE",
        help="exit 1 if FILE (default: the committed sbus-dashboard.json) is not "
        "exactly the generated JSON",
    )
    args = parser.parse_args(argv)
    data = render().encode()
    if args.check:
        if not args.check.is_file():
            print(f"{args.check}: no such file", file=sys.stderr)
            return 1
        if args.check.read_bytes() != data:
            print(
                f"{args.check} is not the generator's output; regenerate it with\n"
                "    python grafana/dashboard.py --out grafana/sbus-dashboard.json",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.out:
        try:
            args.out.write_bytes(data)
        except OSError as exc:
            print(f"cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.buffer.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
