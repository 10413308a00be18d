"""The shipped deployment files, read as systemd (or compose) reads them, and
their commands turned into ones this machine can run (docs/deploy.md, "What
the tests run").

A unit's command names the installed program (``/usr/local/bin/sbus-relay``)
and its config under ``/etc/sbus/``.  ``exec_argv`` gives the same command
with only those two replaced: the program by this venv's copy, the config
directory by a test's directory.  Every flag stays as shipped, so a flag our
CLI does not take, or a config the command cannot read, fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import STOP_TIMEOUT, VENV_BIN

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
DEPLOY = CONFIGS / "deploy"
#: The unit files, by name.
MASTER_SOCKET = "sbus-master.socket"
MASTER_SERVICE = "sbus-master.service"
RELAY_TEMPLATE = "sbus-relay@.service"
UNITS = (MASTER_SOCKET, MASTER_SERVICE, RELAY_TEMPLATE)
#: Where the units expect the installed programs and their configs.
INSTALLED_BIN = "/usr/local/bin/"
CONFIG_DIR = "/etc/sbus/"
#: Our console scripts (pyproject.toml, [project.scripts]).
OUR_PROGRAMS = ("sbus-relay", "sbusd")
#: The unit keys that the socket-activation tests reproduce, per section.  A key
#: in neither this nor SANDBOX fails test_every_unit_key_is_reproduced_or_left_to_systemd:
#: decide whether the reproduction must change (tests/deploy) before adding it.
REPRODUCED = {
    "Unit": {"Description", "Requires", "After"},
    "Socket": {"ListenSequentialPacket", "SocketMode", "SocketUser", "SocketGroup", "RemoveOnStop"},
    "Service": {
        "Type",
        "NotifyAccess",
        "ExecStart",
        "ExecReload",
        "Environment",
        "Restart",
        "RestartSec",
    },
    "Install": {"WantedBy"},
}
#: Sandboxing that only systemd applies: checked by systemd-analyze verify, and
#: run for real only where systemd is PID 1 (test_units_under_systemd).
SANDBOX = {"NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths"}


@dataclass(frozen=True)
class Unit:
    """A parsed unit file: ``(section, key, value)`` in file order."""

    name: str
    entries: tuple[tuple[str, str, str], ...]

    def values(self, section: str, key: str) -> list[str]:
        return [v for s, k, v in self.entries if s == section and k == key]

    def value(self, section: str, key: str) -> str:
        """The one value of ``key``; fails if it is missing or repeated."""
        found = self.values(section, key)
        assert len(found) == 1, f"{self.name}: [{section}] {key}= appears {len(found)} times"
        return found[0]


def parse_unit(path: Path) -> Unit:
    """Read a unit file: sections, ``Key=value``, ``#``/``;`` comments, ``\\`` continuations."""
    entries: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep and section, f"{path.name}: cannot read line {raw!r}"
        entries.append((section, key.strip(), value.strip()))
    return Unit(path.name, tuple(entries))


def load(name: str) -> Unit:
    return parse_unit(DEPLOY / name)


def expand_specifiers(text: str, instance: str) -> str:
    """Expand the specifiers our units use (``%i``, ``%I``, ``%%``); fail on any other."""

    def one(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter in "iI":
            return instance
        if letter == "%":
            return "%"
        raise AssertionError(f"specifier %{letter} in {text!r}: teach tests/deploy/shipped.py")

    return re.sub(r"%(.)", one, text)


def exec_argv(unit: Unit, config_dir: Path, instance: str = "") -> list[str]:
    """``ExecStart=``, runnable here: this venv's program, configs in ``config_dir``."""
    line = expand_specifiers(unit.value("Service", "ExecStart"), instance)
    assert line[:1] not in "-@+!:", f"{unit.name}: ExecStart prefixes are not reproduced: {line}"
    argv = shlex.split(line)
    program = argv[0]
    assert program.startswith(INSTALLED_BIN), f"{unit.name}: {program} is not in {INSTALLED_BIN}"
    name = program[len(INSTALLED_BIN) :]
    assert name in OUR_PROGRAMS, f"{unit.name}: {program} is none of our programs {OUR_PROGRAMS}"
    local = os.path.join(VENV_BIN, name)
    assert os.access(local, os.X_OK), f"{local} is missing: is the package installed?"
    args = [
        str(config_dir) + "/" + arg[len(CONFIG_DIR) :] if arg.startswith(CONFIG_DIR) else arg
        for arg in argv[1:]
    ]
    return [local, *args]


#: Programs a unit's ``ExecReload=`` may run besides ours.
SYSTEM_PROGRAMS = ("/bin/kill",)


def reload_argvs(
    unit: Unit, config_dir: Path, main_pid: int, instance: str = ""
) -> list[list[str]]:
    """Every ``ExecReload=``, in order, runnable here: our programs as in
    ``exec_argv``, ``$MAINPID`` the service's pid (systemd runs them one after
    the other and stops at the first that fails)."""
    argvs = []
    for line in unit.values("Service", "ExecReload"):
        line = expand_specifiers(line, instance).replace("$MAINPID", str(main_pid))
        assert line[:1] not in "-@+!:", f"{unit.name}: ExecReload prefixes are not reproduced"
        argv = shlex.split(line)
        if argv[0] in SYSTEM_PROGRAMS:
            argvs.append(argv)
            continue
        single = Unit(unit.name, (("Service", "ExecStart", shlex.join(argv)),))
        argvs.append(exec_argv(single, config_dir, instance))
    return argvs


def config_files(unit: Unit, instance: str = "") -> list[str]:
    """The ``/etc/sbus/`` files the unit's command reads, by base name."""
    line = expand_specifiers(unit.value("Service", "ExecStart"), instance)
    return [arg[len(CONFIG_DIR) :] for arg in shlex.split(line) if arg.startswith(CONFIG_DIR)]


def environment(unit: Unit) -> list[str]:
    """``NAME=value`` of every ``Environment=`` of the service (what ``-E`` passes)."""
    pairs: list[str] = []
    for value in unit.values("Service", "Environment"):
        pairs.extend(shlex.split(value))
    return pairs


def scrape(port: int) -> dict[str, float]:
    """One scrape of ``/metrics`` as ``{'name{labels}': value}``, ``instance`` label dropped."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = re.sub(r'instance="[^"]*",?', "", name).replace(",}", "}").replace("{}", "")
            samples[name] = float(value)
    return samples


def listening_inode(path: str) -> int | None:
    """The inode of the listening SEQPACKET socket bound to ``path`` (/proc/net/unix)."""
    found = []
    with open("/proc/net/unix", encoding="latin-1") as table:
        next(table)
        for line in table:
            parts = line.rstrip("\n").split(None, 7)
            if len(parts) == 8 and parts[7] == path:
                flags, kind, inode = int(parts[3], 16), int(parts[4], 16), int(parts[6])
                if flags & 0x10000 and kind == socket.SOCK_SEQPACKET:
                    found.append(inode)
    assert len(found) <= 1, f"{len(found)} sockets listen on {path}"
    return found[0] if found else None


def write_config(shipped: Path, target: Path, **moved: str) -> None:
    """``shipped`` with the keys in ``moved`` changed, written to ``target``.

    Only keys the shipped file already has may change: the rest of it (limits,
    access, log format) runs as shipped.
    """
    document = yaml.safe_load(shipped.read_text())
    for key, value in moved.items():
        assert key in document, f"{shipped.name} has no {key}: nothing to move"
        document[key] = value
    target.write_text(yaml.safe_dump(document))


def log_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log events a server wrote to stderr (other lines skipped)."""
    events = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Signal a server and return its exit status; one that hangs is killed and fails."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"pid {proc.pid} ignored signal {sig} for {STOP_TIMEOUT}s") from None


def healthy(port: int) -> bool:
    """True when ``/healthz`` on ``port`` answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


#: Seconds systemd-analyze may take (it loads a whole unit graph).
VERIFY_TIMEOUT = 60


def find_systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip(
            "!!! systemd-analyze NOT FOUND: the units were NOT verified.  Install Debian's "
            "'systemd' package (it ships systemd-analyze; systemd need not be running). !!!"
        )
    return path


def verify(analyze: str, directory: Path, unit: str) -> list[str]:
    """What ``systemd-analyze verify`` says against ``unit`` (empty: all clean).

    verify exits 0 on some problems (a bad ``Type=`` is "ignored" with a
    warning), so every line it prints about our units or our directory counts,
    as does a non-zero exit.  Lines about the machine's own units (which verify
    loads as dependencies) are not ours to judge and are left out.
    """
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(directory / unit)],
        capture_output=True,
        text=True,
        timeout=VERIFY_TIMEOUT,
        check=False,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )
    ours = ("sbus-", str(directory))
    lines = (result.stdout + result.stderr).splitlines()
    problems = [line for line in lines if any(mark in line for mark in ours)]
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}: {lines}")
    return problems
