"""A relay carries only what it uses: what a real relay process has imported.

The relay runs ``sbus-relay serve --upstream`` through the command's own
``main``, with one hook: when it exits (SIGINT, a clean stop) it writes the
names in its ``sys.modules`` to a file.  Before that it has connected to its
master and carried a message, so whatever it imports on its first client is
counted too.  The same run with ``--metrics`` and with a config file shows
that the check sees what each of them brings.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from sbus_relay import accel
from sbus_relay.client import Client
from tests.support import is_listening, short_dir, start_bus

pytestmark = pytest.mark.timeout(60)

#: The relay's ``main``, writing its module names to argv[1] when it exits.
RUN_AND_LIST = (
    "import atexit, sys\n"
    "out = sys.argv.pop(1)\n"
    "def _list():\n"
    "    with open(out, 'w') as f:\n"
    "        f.write('\\n'.join(sorted(sys.modules)))\n"
    "atexit.register(_list)\n"
    "from sbus_relay.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
#: Seconds for the relay to listen, and to stop.
WAIT = 15.0
#: What an idle relay without --metrics and without a config file never needs.
NEVER: tuple[str, ...] = ("prometheus_client", "yaml", "pyspark", "pyarrow")
NEVER += ("sbus_relay.pipeline", "sbus_relay.bench")
#: The only command modules a relay may hold: the package, its own command,
#: and the flags it shares with the others.
OWN_COMMAND = {"sbus_relay.cli", "sbus_relay.cli.serve", "sbus_relay.cli.options"}


def relay_modules(tmp_path: Path, *flags: str) -> set[str]:
    """The modules of a relay of a fresh master, after it carried one message."""
    listing = tmp_path / "modules.txt"
    folder = short_dir()
    try:
        with start_bus(tmp_path) as master:
            address = os.path.join(folder, "relay")
            argv = [sys.executable, "-c", RUN_AND_LIST, str(listing), "serve", "-f"]
            argv += ["-a", address, "--upstream", master.address, *flags]
            with open(tmp_path / "relay.err", "wb") as err:
                relay = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
            try:
                carry_one(address, relay)
                relay.send_signal(signal.SIGINT)
                assert relay.wait(WAIT) == 0, (tmp_path / "relay.err").read_text()
            finally:
                if relay.poll() is None:
                    relay.kill()
                    relay.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return set(listing.read_text().split())


def carry_one(address: str, relay: subprocess.Popen[bytes]) -> None:
    """Wait until the relay listens; one message from a client to another through it."""
    deadline = time.monotonic() + WAIT
    while not is_listening(address):
        assert relay.poll() is None, "the relay exited before listening"
        assert time.monotonic() < deadline, "the relay is not listening"
        time.sleep(0.02)
    with Client(address, timeout=WAIT) as sub, Client(address, timeout=WAIT) as pub:
        sub.subscribe("footprint/")
        sub.whoami()
        pub.publish("footprint/probe", b"x")
        assert sub.receive(WAIT).key == b"footprint/probe"


def held(modules: set[str], names: Sequence[str]) -> list[str]:
    """The modules of ``modules`` that are one of ``names`` or inside one."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_an_idle_relay_imports_only_what_it_uses(tmp_path: Path) -> None:
    modules = relay_modules(tmp_path)
    assert "sbus_relay.bus.server" in modules and "sbus_relay.bus.upstream" in modules
    assert not held(modules, NEVER)
    assert not held(modules, ("hashlib", "secrets")), "OpenSSL is megabytes a bus never uses"
    if accel.compiled():  # the relay runs the path this process would
        assert not held(modules, ("Cython", "cython")), "the compiled path needs no Cython"
    commands = {m for m in modules if m.startswith("sbus_relay.cli")}
    assert commands <= OWN_COMMAND, commands - OWN_COMMAND


def test_metrics_and_a_config_file_bring_their_libraries(tmp_path: Path) -> None:
    config = tmp_path / "relay.yaml"
    config.write_text("max_clients: 64\n")
    modules = relay_modules(tmp_path, "--metrics", "127.0.0.1:0", "-C", str(config))
    assert "prometheus_client" in modules and "yaml" in modules
    assert not held(modules, NEVER[2:])
