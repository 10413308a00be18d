"""The README's picture: shown, and exactly what its source draws.

``docs/overview.py`` is the picture's source; ``docs/overview.svg`` is its
output, committed so that the README shows it anywhere.  An edit of one
without regenerating the other fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "docs" / "overview.py"
PICTURE = ROOT / "docs" / "overview.svg"
REGENERATE = "python docs/overview.py --out docs/overview.svg"


def draw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SOURCE), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=30, check=False,
    )  # fmt: skip


def test_the_committed_picture_is_its_source_s_output() -> None:
    done = draw()
    assert done.returncode == 0, done.stderr
    assert done.stdout == PICTURE.read_text(), f"docs/overview.svg is not current: {REGENERATE}"
    assert draw("--check").returncode == 0


def test_check_rejects_an_edited_picture(tmp_path: Path) -> None:
    edited = tmp_path / "overview.svg"
    edited.write_text(PICTURE.read_text().replace("NATS cluster", "NATS", 1))
    done = draw("--check", str(edited))
    assert done.returncode == 1 and REGENERATE.split(" --out")[0] in done.stdout


def test_the_picture_is_valid_svg_naming_every_part() -> None:
    root = ET.fromstring(PICTURE.read_text())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    words = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    for part in ("master bus", "relay", "container", "NATS cluster", "PySpark", "metrics"):
        assert part in words, part


def test_the_readme_shows_it_and_says_how_it_is_made() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = re.search(rf"!\[([^\]]+)\]\({re.escape(str(PICTURE.relative_to(ROOT)))}\)", readme)
    assert shown is not None and len(shown.group(1)) > 40  # a description, not a name
    assert readme.index("docs/overview.svg") < readme.index("## ")  # before anything else
    assert REGENERATE in readme
