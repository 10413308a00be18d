"""Without the optional extra, record, analyze and spark-server say how to install
it, in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

#: Run the CLI with the extra's modules made unimportable (sys.modules[name] = None).
HIDE = (
    "import sys\n"
    "for m in ('pyarrow', 'pyspark', 'matplotlib', 'plotly'): sys.modules[m] = None\n"
    "from sbus_relay.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("command", ["record", "analyze", "spark-server"])
def test_missing_extra_is_one_line(command: str, tmp_path: Path) -> None:
    args = ["record", "--out", str(tmp_path / "cap"), "--duration", "1"]
    if command == "analyze":
        (tmp_path / "cap").mkdir()
        args = ["analyze", str(tmp_path / "cap"), "--out", str(tmp_path / "report")]
    if command == "spark-server":
        args = ["spark-server", "--port", "1"]
    result = subprocess.run(
        [sys.executable, "-c", HIDE, *args], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"sbus-relay {command}: needs pyarrow")
    assert "install 'sbus_relay[spark]'" in lines[0]
