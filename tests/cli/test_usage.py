"""A command's unknown option is refused by that command: its own usage, the
option named, and the option nearest to a misspelled one."""

from __future__ import annotations

import pytest

from sbus_relay.cli import COMMANDS
from tests.support import run_cli

pytestmark = pytest.mark.timeout(60)

#: What each command needs besides options to get as far as its options.
REQUIRED: dict[str, tuple[str, ...]] = {
    "sub": ("k/",),
    "up": ("tree.yaml",),
    "analyze": ("captures", "--out", "report"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_option_is_named_under_the_commands_own_usage(command: str) -> None:
    done = run_cli(command, *REQUIRED.get(command, ()), "--no-such-option")
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(f"usage: sbus-relay {command} "), err
    assert f"sbus-relay {command}: error: unrecognized arguments: --no-such-option" in err
    assert "did you mean" not in err  # nothing is near it
    assert done.stdout == b""


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (("serve", "--metircs", "127.0.0.1:1"), "--metrics"),
        (("serve", "--log-levl=debug"), "--log-level"),
        (("top", "--onec"), "--once"),
        (("record", "--ot", "somewhere"), "--out"),
    ],
    ids=str,
)
def test_a_misspelled_option_gets_the_nearest_one(argv: tuple[str, ...], meant: str) -> None:
    done = run_cli(*argv)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(f"usage: sbus-relay {argv[0]} "), err
    assert err.rstrip().endswith(f"(did you mean {meant}?)"), err


def test_an_unknown_option_before_the_command_is_the_top_levels() -> None:
    done = run_cli("--no-such-option", "serve")
    err = done.stderr.decode()
    assert done.returncode == 2
    assert err.startswith("usage: sbus-relay [-h]"), err
    assert "unrecognized arguments: --no-such-option" in err
