"""Read the shipped Grafana dashboard and turn its panel queries into plain PromQL."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "grafana" / "sbus-dashboard.json"
PROMETHEUS_CONFIG = REPO / "configs" / "prometheus.yml"

#: What Grafana would put in place of each variable when "All" is selected,
#: with intervals long enough for a test that scrapes every second.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "${instance}": ".*",
    "$instance": ".*",
    "${job}": ".*",
    "$job": ".*",
}


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel."""

    panel: str
    ref_id: str
    expr: str

    def promql(self) -> str:
        """The expression with every Grafana variable replaced."""
        return substitute(self.expr)


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def row_panels(dashboard: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under the row titled ``title`` (expanded or collapsed)."""
    panels: list[dict[str, Any]] = dashboard["panels"]
    for i, panel in enumerate(panels):
        if panel["type"] == "row" and panel["title"] == title:
            if panel.get("panels"):
                return list(panel["panels"])
            rest = panels[i + 1 :]
            ends = [j for j, p in enumerate(rest) if p["type"] == "row"]
            return rest[: ends[0]] if ends else rest
    raise AssertionError(f"no row titled {title!r}")


def panel_queries(dashboard: dict[str, Any] | None = None) -> list[PanelQuery]:
    dashboard = dashboard or load_dashboard()
    return [
        PanelQuery(panel["title"], target["refId"], target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def substitute(expr: str) -> str:
    # Longest names first, so "$instance" never eats into "${instance}".
    for name in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(name, SUBSTITUTIONS[name])
    left = re.findall(r"\$\{?\w+", expr)
    if left:
        raise AssertionError(f"unsubstituted Grafana variables {left} in {expr!r}")
    return expr
