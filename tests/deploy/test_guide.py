"""docs/deploy.md stays true to the tests and the files it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.shipped import REPO

GUIDE = REPO / "docs" / "deploy.md"
HERE = Path(__file__).resolve().parent


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.timeout(10)
def test_guide_names_every_deploy_test_file_and_only_those() -> None:
    named = set(re.findall(r"`(test_\w+\.py)`", GUIDE.read_text()))
    assert named == {p.name for p in HERE.glob("test_*.py")}


@pytest.mark.timeout(10)
def test_guide_links_and_paths_resolve() -> None:
    text = GUIDE.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        target, _, anchor = link.partition("#")
        path = GUIDE.parent / target if target else GUIDE
        assert path.exists(), f"docs/deploy.md links to missing {target}"
        if anchor:
            assert anchor in anchors(path.read_text()), f"no heading for {link}"
    for name in re.findall(r"`((?:configs|grafana)/[\w./@-]*\w)", text):
        assert (REPO / name).exists(), f"docs/deploy.md names missing {name}"
