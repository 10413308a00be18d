"""``sbus-relay bench --only client``, quick-sized: every figure is there, the
subscribers got every message, and the restart run counted what it lost.
No speed is asserted (targets belong in the printed benchmark)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sbus_relay.bench.clientbench import NATS, VARIANTS, nats_server_path

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 2_000

pytestmark = [
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (the load generator)"),
    pytest.mark.timeout(240),
]


def test_client_scenario_measures_every_side(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "sbus_relay", "bench", "--only", "client", "--quick"]
    cmd += ["--messages", str(MESSAGES), "--repeat", "1", "--no-reference"]
    cmd += ["--json", str(out), "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=220, cwd=ROOT, check=False)
    assert out.exists(), done.stderr[-4000:]
    entry = json.loads(out.read_text())["scenarios"]["client"]
    assert entry["status"] == "ok", entry
    names = {name for name, _, _ in VARIANTS}
    if nats_server_path() is not None:
        names.add(NATS)
        assert set(entry["cpu_us_per_delivery_2to4"]) == {"ours", NATS}
        assert entry["sub_ratio"] > 0 and entry["cpu_ratio_2to4"] > 0
    assert set(entry["rates"]) == names and all(r > 0 for r in entry["rates"].values())
    restart = entry["restart"]
    assert restart["received"] + restart["lost"] == restart["published"] > 0
    assert restart["reordered"] == 0 and restart["pub_unsent"] == 0
    assert len(restart["sub_outage_ms"]) == 1  # it reconnected once
    assert {t["label"] for t in entry["targets"]} >= {"Python subscriber, best of ours / nats-py"}
    assert "client library" in done.stdout
