"""The systemd units as files: ``systemd-analyze verify`` accepts them (and
rejects broken copies), every key is one the tests reproduce or leave to
systemd, and the units agree with the configs they read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sbus_relay.ops.config import load_config
from tests.deploy.shipped import (
    CONFIGS,
    DEPLOY,
    INSTALLED_BIN,
    MASTER_SERVICE,
    MASTER_SOCKET,
    RELAY_TEMPLATE,
    REPRODUCED,
    SANDBOX,
    UNITS,
    VERIFY_TIMEOUT,
    config_files,
    exec_argv,
    find_systemd_analyze,
    load,
    verify,
)
from tests.support import VENV_BIN


def installable_copy(directory: Path) -> Path:
    """The three units in ``directory``, their programs pointing at this venv.

    Nothing else changes: verify then checks the shipped files, and that the
    programs they start exist and are executable.
    """
    for name in UNITS:
        text = (DEPLOY / name).read_text()
        (directory / name).write_text(text.replace(INSTALLED_BIN, VENV_BIN + "/"))
    return directory


@pytest.mark.timeout(VERIFY_TIMEOUT * 2)
@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_verify_accepts_the_unit(unit: str, tmp_path: Path) -> None:
    analyze = find_systemd_analyze()
    assert verify(analyze, installable_copy(tmp_path), unit) == []


#: Broken copies: (unit, text replaced, replacement, what verify must say).
BREAKAGES = [
    pytest.param(
        MASTER_SOCKET, "ListenSequentialPacket=", "ListenSeqPacket=", "Unknown key",
        id="socket-unknown-key",
    ),
    pytest.param(
        MASTER_SERVICE, "Type=notify", "Type=notifi", "Failed to parse service type",
        id="service-bad-type-is-only-a-warning",
    ),
    pytest.param(
        RELAY_TEMPLATE, "bin/sbus-relay ", "bin/sbus-relai ", "is not executable",
        id="template-missing-program",
    ),
]  # fmt: skip


@pytest.mark.timeout(VERIFY_TIMEOUT * 2)
@pytest.mark.parametrize(("unit", "old", "new", "said"), BREAKAGES)
def test_systemd_analyze_verify_rejects_a_broken_copy(
    unit: str, old: str, new: str, said: str, tmp_path: Path
) -> None:
    analyze = find_systemd_analyze()
    directory = installable_copy(tmp_path)
    text = (directory / unit).read_text()
    assert old in text, f"{unit} no longer contains {old!r}: update this breakage"
    (directory / unit).write_text(text.replace(old, new))
    problems = verify(analyze, directory, unit)
    assert any(said in line for line in problems), problems


@pytest.mark.timeout(10)
@pytest.mark.parametrize("unit", UNITS)
def test_every_unit_key_is_reproduced_or_left_to_systemd(unit: str) -> None:
    # A new key (ExecStartPre=, User=, Accept=yes...) changes what runs: the
    # socket-activation tests must learn it before this passes again.
    for section, key, _ in load(unit).entries:
        known = REPRODUCED.get(section, set()) | (SANDBOX if section == "Service" else set())
        assert key in known, f"{unit}: [{section}] {key}= is not reproduced by tests/deploy"


@pytest.mark.timeout(10)
def test_unit_commands_run_our_programs_on_shipped_configs(tmp_path: Path) -> None:
    master = load(MASTER_SERVICE)
    assert exec_argv(master, tmp_path)[0] == os.path.join(VENV_BIN, "sbus-relay")
    assert config_files(master) == ["master.yaml"]
    load_config(str(CONFIGS / "master.yaml"))
    relay = load(RELAY_TEMPLATE)
    assert exec_argv(relay, tmp_path, "example")[0] == os.path.join(VENV_BIN, "sbus-relay")
    # sbus-relay@example.service reads the shipped example instance.
    assert config_files(relay, "example") == ["relay-example.yaml"]
    load_config(str(DEPLOY / "relay-example.yaml"))


@pytest.mark.timeout(10)
def test_units_and_configs_agree() -> None:
    socket_unit, master, relay = load(MASTER_SOCKET), load(MASTER_SERVICE), load(RELAY_TEMPLATE)
    listen = socket_unit.value("Socket", "ListenSequentialPacket")
    # systemd activates the service of the socket's own name.
    assert MASTER_SOCKET.removesuffix(".socket") == MASTER_SERVICE.removesuffix(".service")
    for service in (master, relay):
        assert MASTER_SOCKET in service.value("Unit", "Requires").split()
        assert MASTER_SOCKET in service.value("Unit", "After").split()
    # The master's config names the same socket (used only without activation).
    assert load_config(str(CONFIGS / "master.yaml")).address == listen
    example = load_config(str(DEPLOY / "relay-example.yaml"))
    assert example.upstream == listen
    # The template's sandbox lets the relay create its socket and lock file only
    # below ReadWritePaths.
    writable = relay.value("Service", "ReadWritePaths").split()
    assert any(example.address.startswith(path.rstrip("/") + "/") for path in writable), writable
    assert example.address != listen
