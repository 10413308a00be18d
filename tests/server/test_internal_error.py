"""A bug of ours while serving one client costs that client only.

The server runs in this process under gevent so that a fault can be injected
into its packet handler; the clients are cooperative sockets.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import gevent
import pytest
from gevent import socket as gsocket

from sbus_relay.bus.server import Server
from sbus_relay.ops.config import ServerConfig

pytestmark = pytest.mark.timeout(30)


def _client(path: str) -> Any:
    s = gsocket.socket(gsocket.AF_UNIX, gsocket.SOCK_SEQPACKET)
    s.connect(path)
    s.settimeout(5)
    return s


def test_an_exception_in_a_handler_disconnects_only_that_client() -> None:
    folder = tempfile.mkdtemp()
    path = folder + "/bus"
    listener = gsocket.socket(gsocket.AF_UNIX, gsocket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    server = Server(ServerConfig(address=path), listener)
    real_handle = server.handle

    def faulty(conn: Any, packet: bytes) -> None:
        if packet == b"CMSG boom":
            raise RuntimeError("injected")
        real_handle(conn, packet)

    server.handle = faulty  # type: ignore[method-assign]
    server.start()
    try:
        victim, bystander = _client(path), _client(path)
        bystander.send(b"SUB k")
        bystander.send(b"CMSG !/cred/whoami")
        assert bystander.recv(1000).startswith(b"CMSG !/cred/whoami\0")
        victim.send(b"CMSG boom")
        # Told why, then disconnected, not left hanging.
        assert victim.recv(1000) == b"CMSG disconnect\0internal_error: RuntimeError('injected')"
        assert victim.recv(1000) == b""
        victim.close()
        fresh = _client(path)
        fresh.send(b"MSG k\0still here")
        assert bystander.recv(1000) == b"MSG k\0still here"
        assert server.stats.disconnects["internal_error"] == 1
        assert len(server.clients) == 2  # the victim's fd and patterns are gone
        fresh.close()
        bystander.close()
    finally:
        server.stop()
        gevent.sleep(0)
        shutil.rmtree(folder, ignore_errors=True)


class _Recorder:
    """A logger that keeps the events it is given (bound loggers share the list)."""

    def __init__(self, events: list[str] | None = None) -> None:
        self.events = [] if events is None else events

    def bind(self, **_fields: Any) -> _Recorder:
        return _Recorder(self.events)

    def _record(self, event: str, *_args: Any, **_fields: Any) -> None:
        self.events.append(event)

    info = warning = error = exception = debug = _record


def test_a_client_gone_while_its_own_batch_is_read_costs_no_internal_error() -> None:
    """Its packets are read in one batch after it closed: the echo of its own
    message fails to send before its next packet, which closes it; that packet
    is then not handled (it used to raise "a packet for a connection closed
    already" as an internal error).  A relay caught up by a restarted bus meets
    the same (protocol.hold)."""
    folder = tempfile.mkdtemp()
    path = folder + "/bus"
    listener = gsocket.socket(gsocket.AF_UNIX, gsocket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    log = _Recorder()
    server = Server(ServerConfig(address=path), listener, log=log)
    server.start()
    try:
        for _ in range(20):
            gone = _client(path)
            gone.send(b"SUB k")
            gone.send(b"MSG k\0to itself")  # echo is on: it is its own recipient
            gone.send(b"CMSG !/cred/whoami")
            gone.close()  # before the server has read any of it
            gevent.sleep(0.01)
        assert "client.internal_error" not in log.events
        assert server.stats.disconnects["io_error"] + server.stats.disconnects["closed"] == 20
        assert not server.clients
    finally:
        server.stop()
        gevent.sleep(0)
        shutil.rmtree(folder, ignore_errors=True)
