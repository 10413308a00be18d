"""The committed dashboard JSON is exactly what its generator writes.

``grafana/dashboard.py`` builds the dashboard with Grafana's foundation SDK;
``grafana/sbus-dashboard.json`` is its output, committed so that Grafana can
load it without Python.  These tests keep the two from drifting apart: a panel
changed in the JSON only, or in the code without regenerating, fails here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.metrics.dashboard_queries import DASHBOARD, REPO

pytestmark = pytest.mark.timeout(60)

GENERATOR = REPO / "grafana" / "dashboard.py"
REGENERATE = "python grafana/dashboard.py --out grafana/sbus-dashboard.json"


def generate(*args: str) -> subprocess.CompletedProcess[bytes]:
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        pytest.fail(
            "grafana-foundation-sdk is not installed: pip install -e '.[dev]' "
            "(the dashboard generator needs it)"
        )
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args], capture_output=True, cwd=REPO, timeout=50
    )


def test_committed_dashboard_is_the_generators_output_byte_for_byte() -> None:
    result = generate()
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == DASHBOARD.read_bytes(), (
        f"grafana/sbus-dashboard.json differs from the generator's output: {REGENERATE}"
    )


def test_out_writes_the_same_bytes_and_check_accepts_them(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.json"
    assert generate("--out", str(out)).returncode == 0
    assert out.read_bytes() == DASHBOARD.read_bytes()
    assert generate("--check").returncode == 0  # the committed file
    assert generate("--check", str(out)).returncode == 0


def test_check_rejects_a_hand_edited_copy(tmp_path: Path) -> None:
    original = DASHBOARD.read_bytes()
    changed = original.replace(b'"refresh": "10s"', b'"refresh": "5s"', 1)
    assert changed != original
    edited = tmp_path / "dashboard.json"
    edited.write_bytes(changed)
    result = generate("--check", str(edited))
    assert result.returncode == 1
    assert REGENERATE.encode() in result.stderr
