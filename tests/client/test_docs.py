"""docs/client.md's examples, run as written against a real bus."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.client.conftest import Master

pytestmark = pytest.mark.timeout(60)

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
#: What each example prints.
PRINTS = {
    "asyncio": "sensors/kitchen/temp 21.5\ntime: 12:00\n",
    "gevent": "jobs/0 job 0\njobs/1 job 1\njobs/2 job 2\n",
    "thread": "1000 items, the last item 999\n",
}


def examples() -> dict[str, str]:
    blocks = re.findall(r"```python\n(# example: (\w+)\n.*?)```", DOC.read_text(), re.S)
    return {name: code for code, name in blocks}


def test_every_example_is_found() -> None:
    assert set(examples()) == set(PRINTS)


def test_every_example_connects_where_make_run_listens_unless_told() -> None:
    makefile = (DOC.parents[1] / "Makefile").read_text()
    config = re.search(r"^run: .*\n\t.*-C (\S+)", makefile, re.M)
    assert config is not None
    listens = yaml.safe_load((DOC.parents[1] / config.group(1)).read_text())["address"]
    for name, code in examples().items():
        assert f'os.environ.get("SBUS_ADDRESS", "{listens}")' in code, name


@pytest.mark.parametrize("name", sorted(PRINTS))
def test_the_example_runs_as_written(name: str, master: Master, tmp_path: Path) -> None:
    script = tmp_path / f"example_{name}.py"  # not asyncio.py: that would shadow asyncio
    script.write_text(examples()[name])
    env = {**os.environ, "SBUS_ADDRESS": master.address}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == PRINTS[name], done.stderr
