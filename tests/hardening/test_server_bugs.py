"""Regression tests for server bugs the hardening runs found.

Each was first committed as a strict xfail that reproduced the bug; the mark
went with the fix, so each now guards against the bug's return.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.hardening.harness.common import Conn, ServerProc, cleanup_dir, short_dir

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server() -> Iterator[ServerProc]:
    workdir = short_dir()
    proc = ServerProc(os.path.join(workdir, "bus"))
    yield proc
    proc.kill()
    cleanup_dir(workdir)


def test_unsub_while_a_relay_disconnects_keeps_the_client_alive(server: ServerProc) -> None:
    """protocol.md interest: a relay vanishing must not harm any other client.

    Found by the harness's ``fuzz`` run (secret rounds: the relay stopped while children left).
    Expected: the client's whoami is answered and the log has no traceback.
    Actual: the whoami is never answered; the log shows the RuntimeError.
    """
    client = Conn(server.address, timeout=5.0)
    listeners = [Conn(server.address) for _ in range(4)]
    for listener in listeners:
        listener.cmsg(b"interest/on")
        listener.whoami()
    client.sub(b"p")
    client.whoami()
    for listener in listeners:  # the relays go away ...
        listener.close()
    client.unsub(b"p")  # ... while a notice about 'p' is being sent to them
    try:
        client.whoami(timeout=2.0)
        answered = True
    except TimeoutError:
        answered = False
    assert server.alive()
    assert "Traceback" not in server.log_text(), server.log_text()[-2000:]
    assert answered, "the client is never served again"
