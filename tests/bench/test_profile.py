"""The py-spy summary, and the one line printed when py-spy is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sbus_relay.bench import profile


@pytest.mark.timeout(10)
def test_summary_counts_own_and_total_samples() -> None:
    collapsed = (
        "main (a.py:1);loop (a.py:5);send (b.py:9) 4\n"
        "main (a.py:1);loop (a.py:5);send (b.py:10) 2\n"
        "main (a.py:1);loop (a.py:6) 2\n"
        "bad line\n"
    )
    summary = profile.summarize(collapsed)
    assert summary["samples"] == 8
    assert summary["own"][0] == {"function": "send (b.py)", "samples": 6, "percent": 75.0}
    totals = {row["function"]: row["samples"] for row in summary["total"]}
    assert totals == {"main (a.py)": 8, "loop (a.py)": 8, "send (b.py)": 6}
    lines = {row["function"]: row["samples"] for row in summary["lines"]}
    assert lines == {"send (b.py:9)": 4, "send (b.py:10)": 2, "loop (a.py:6)": 2}


@pytest.mark.timeout(10)
def test_missing_py_spy_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = profile.profile_one_to_one(None, None, tmp_path, 1, tmp_path / "x.svg", 1.0)  # type: ignore[arg-type]
    assert result == {"status": "unavailable", "reason": "py-spy not found (pip install py-spy)"}
    assert profile.format_summary(result) == "profile: py-spy not found (pip install py-spy)"
