"""The new process's confirmation, and what it learns when the old one does not read it."""

import os
import socket
import subprocess
import sys

from sbus_relay.ops.handover import CONFIRMED, PREDECESSOR_GONE, PREDECESSOR_SERVES, confirm


def test_a_predecessor_that_ended_is_no_error() -> None:
    """Everything was handed over before: the new process serves on."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    # a pid that was a process and is no more (reaped)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert confirm(ours, proc.pid) == PREDECESSOR_GONE
    assert ours.fileno() == -1  # closed all the same


def test_a_predecessor_that_gave_up_and_serves_on_is_told_apart() -> None:
    """It closed the exchange but lives (it thawed and serves): the new one must leave."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    assert confirm(ours, os.getpid()) == PREDECESSOR_SERVES
    assert ours.fileno() == -1


def test_a_living_predecessor_reads_the_confirmation() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        assert confirm(ours, os.getpid()) == CONFIRMED
        theirs.settimeout(5)
        assert theirs.recv(4096)
