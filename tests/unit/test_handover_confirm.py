"""The new process's confirmation to an old one that has already ended."""

import socket

from sbus_relay.ops.handover import confirm


def test_a_predecessor_that_ended_is_no_error() -> None:
    """Everything was handed over before: the new process serves on (False says so)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    assert confirm(ours) is False
    assert ours.fileno() == -1  # closed all the same


def test_a_living_predecessor_reads_the_confirmation() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        assert confirm(ours) is True
        theirs.settimeout(5)
        assert theirs.recv(4096)
