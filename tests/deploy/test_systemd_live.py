"""The units under a real systemd: only where systemd is PID 1 and we are root.

The three units are installed as runtime units (``/run/systemd/system``, gone
at reboot) under a unique prefix, their programs pointing at this venv and
their paths below a directory in ``/run``: the one tree every unit may see
(the master has PrivateTmp=, both have ProtectHome=) and the relay may write
(ReadWritePaths=/run).  Everything else runs as shipped, sandboxing included.
"""

from __future__ import annotations

import grp
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.deploy.shipped import (
    CONFIGS,
    DEPLOY,
    INSTALLED_BIN,
    MASTER_SERVICE,
    MASTER_SOCKET,
    RELAY_TEMPLATE,
    VERIFY_TIMEOUT,
    find_systemd_analyze,
    healthy,
    listening_inode,
    load,
    parse_unit,
    scrape,
    verify,
    write_config,
)
from tests.relay.helpers import Peer, wait_until
from tests.support import VENV_BIN, free_port

#: Where runtime system units live (systemd.unit(5)).
RUNTIME_UNITS = Path("/run/systemd/system")
#: Directories ProtectHome=yes hides from a service.
HIDDEN_BY_PROTECT_HOME = ("/home/", "/root/", "/run/user/")


def why_not_here() -> str | None:
    """Why the units cannot be started here, or None."""
    if not RUNTIME_UNITS.is_dir() or shutil.which("systemctl") is None:
        return "systemd is not PID 1 on this machine (no /run/systemd/system)"
    state = subprocess.run(
        ["systemctl", "is-system-running"], capture_output=True, text=True, timeout=20, check=False
    ).stdout.strip()
    if state in ("", "offline", "unknown"):
        return f"systemd is not running as PID 1 (systemctl is-system-running: {state or '?'})"
    if os.getuid() != 0:
        return (
            "not root: these are system units (the master's socket is root's, the relay "
            "writes /run), which a user manager cannot run as shipped"
        )
    return None


def systemctl(*args: str, check: bool = True) -> str:
    result = subprocess.run(
        ["systemctl", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"systemctl {' '.join(args)}: {result.returncode} {result.stderr}")
    return result.stdout.strip()


def journal(*units: str) -> str:
    argv = ["journalctl", "--no-pager", "-n", "40"]
    for unit in units:
        argv += ["-u", unit]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout


def needs_readable_home() -> bool:
    """True if this venv (or its interpreter) lives where ProtectHome=yes hides it."""
    paths = (VENV_BIN, os.path.realpath(sys.executable), sys.base_prefix)
    return any(os.path.realpath(p).startswith(HIDDEN_BY_PROTECT_HOME) for p in paths)


def live_units(prefix: str, work: Path) -> dict[str, str]:
    """The three units as the live test installs them: file name -> text.

    Renamed under ``prefix``; the programs are this venv's, the configs and the
    master's socket are in ``work``.  Two changes only where this machine
    needs them: the socket's group when ``sbus`` does not exist, and
    ProtectHome=read-only when this venv lives where ProtectHome=yes hides it.
    """
    listen = load(MASTER_SOCKET).value("Socket", "ListenSequentialPacket")
    group = load(MASTER_SOCKET).value("Socket", "SocketGroup")
    try:
        grp.getgrnam(group)
        group_exists = True
    except KeyError:
        group_exists = False
    units = {}
    for shipped, name in (
        (MASTER_SOCKET, f"{prefix}-master.socket"),
        (MASTER_SERVICE, f"{prefix}-master.service"),
        (RELAY_TEMPLATE, f"{prefix}-relay@.service"),
    ):
        text = (DEPLOY / shipped).read_text()
        text = text.replace(INSTALLED_BIN, VENV_BIN + "/").replace("/etc/sbus/", f"{work}/")
        text = text.replace(listen, str(work / "master.sock"))
        text = text.replace("sbus-master.", f"{prefix}-master.")
        if not group_exists:
            text = text.replace(f"SocketGroup={group}", f"SocketGroup={os.getgid()}")
        if needs_readable_home():
            text = text.replace("ProtectHome=yes", "ProtectHome=read-only")
        units[name] = text
    return units


@pytest.mark.timeout(VERIFY_TIMEOUT * 2)
def test_the_live_tests_units_verify(tmp_path: Path) -> None:
    # Runs wherever systemd-analyze does, so that the units the live test
    # installs are known to load even on machines where it must skip.
    analyze = find_systemd_analyze()
    units = live_units("sbus-tcheck", tmp_path / "work")
    assert set(units) == {
        "sbus-tcheck-master.socket", "sbus-tcheck-master.service", "sbus-tcheck-relay@.service"
    }  # fmt: skip
    directory = tmp_path / "units"
    directory.mkdir()
    for name, text in units.items():
        (directory / name).write_text(text)
        assert "sbus-master." not in text and "/etc/sbus/" not in text, name
    for name in units:
        assert verify(analyze, directory, name) == []
    socket_unit = parse_unit(directory / "sbus-tcheck-master.socket")
    listen = socket_unit.value("Socket", "ListenSequentialPacket")
    assert listen == str(tmp_path / "work" / "master.sock")


@pytest.mark.timeout(180)
def test_units_under_systemd() -> None:
    reason = why_not_here()
    if reason is not None:
        pytest.skip(
            f"!!! THE UNITS WERE NOT STARTED BY SYSTEMD: {reason}.  What can run without it "
            "did (test_systemd_units.py, test_socket_activation.py). !!!"
        )
    prefix = f"sbus-t{secrets.token_hex(3)}"
    socket_name = f"{prefix}-master.socket"
    master_name = f"{prefix}-master.service"
    relay_name = f"{prefix}-relay@live.service"
    work = Path(tempfile.mkdtemp(prefix="sbus-systemd-", dir="/run"))
    master_path = str(work / "master.sock")
    relay_path = str(work / "relay-live.sock")
    configured = str(work / "configured.sock")
    installed: list[Path] = []
    peers: list[Peer] = []
    try:
        master_port, relay_port = free_port(), free_port()
        write_config(
            CONFIGS / "master.yaml", work / "master.yaml",
            address=configured, pidfile=str(work / "master.pid"),
            metrics=f"127.0.0.1:{master_port}",
        )  # fmt: skip
        write_config(
            DEPLOY / "relay-example.yaml", work / "relay-live.yaml",
            address=relay_path, upstream=master_path, metrics=f"127.0.0.1:{relay_port}",
        )  # fmt: skip
        for name, text in live_units(prefix, work).items():
            installed.append(RUNTIME_UNITS / name)
            installed[-1].write_text(text)
        systemctl("daemon-reload")
        systemctl("start", socket_name)
        inode = listening_inode(master_path)
        assert inode is not None, journal(socket_name)
        assert systemctl("is-active", master_name, check=False) == "inactive"
        peers.append(Peer(master_path))  # starts the master
        peers[-1].sync()
        assert systemctl("is-active", master_name, check=False) == "active", journal(master_name)
        assert listening_inode(master_path) == inode
        assert not os.path.lexists(configured)
        systemctl("start", relay_name)
        wait_until(lambda: healthy(relay_port), "the relay's /healthz")
        below, above = Peer(relay_path), Peer(master_path)
        peers += [below, above]
        below.sub(b"live/")
        wait_until(
            lambda: scrape(master_port).get("sbus_patterns_stored") == 1,
            "the relay's SUB on the master",
        )
        sent = above.pub(b"live/x", b"under systemd")
        assert below.messages(1) == [sent], journal(master_name, relay_name)
        systemctl("stop", relay_name)
        assert not os.path.lexists(relay_path)
        systemctl("stop", master_name)
        assert systemctl("show", "-p", "Result", "--value", master_name) == "success"
        assert systemctl("show", "-p", "ExecMainStatus", "--value", master_name) == "0"
        assert listening_inode(master_path) == inode  # the socket outlives the service
        systemctl("stop", socket_name)
        assert not os.path.lexists(master_path)  # RemoveOnStop=yes
    finally:
        for peer in peers:
            peer.close()
        systemctl("stop", relay_name, master_name, socket_name, check=False)
        for target in installed:
            target.unlink(missing_ok=True)
        systemctl("daemon-reload", check=False)
        systemctl("reset-failed", relay_name, master_name, socket_name, check=False)
        shutil.rmtree(work, ignore_errors=True)
