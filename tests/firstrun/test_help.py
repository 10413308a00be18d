"""Help texts are for users: what a command does, one example, nothing about how it was built."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from sbus_relay.cli import COMMANDS
from tests.support import VENV_BIN

pytestmark = pytest.mark.timeout(60)

#: What help must never show: build notes, spec sections, reST quotes, paths
#: that exist only beside the repository.
FORBIDDEN = re.compile(r"SPEC|§|\(issue|issue \d|``|shared/|sbus-README")


def help_text(*argv: str) -> str:
    done = subprocess.run(
        [os.path.join(VENV_BIN, argv[0]), *argv[1:]],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    return done.stdout.decode()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_help_says_what_it_does_with_an_example(command: str) -> None:
    text = help_text("sbus-relay", command, "--help")
    assert not FORBIDDEN.search(text), FORBIDDEN.search(text)
    assert "example: sbus-relay " + command in text


@pytest.mark.parametrize("argv", [("sbus-relay", "--help"), ("sbusd", "-h")], ids=str)
def test_top_level_help_is_clean(argv: tuple[str, ...]) -> None:
    text = help_text(*argv)
    assert not FORBIDDEN.search(text), FORBIDDEN.search(text)
    assert "docs/protocol.md" in text
