"""Many packets per system call (bus.batchio): the compiled helper and the pure
Python path behave alike, and a whole server runs on either."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sbus_relay.bus import batchio
from tests.server.rawclient import RawClient, running_bus

pytestmark = pytest.mark.timeout(60)

IMPLEMENTATIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "python": (batchio._recv_many_py, batchio._send_all_py),
}
SEND_ONE: dict[str, Callable[[int, bytes], None]] = {"python": batchio._send_one_py}
if batchio.COMPILED:
    IMPLEMENTATIONS["compiled"] = (batchio.recv_many, batchio.send_all)
    SEND_ONE["compiled"] = batchio.send_one


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def impl(request: pytest.FixtureRequest) -> tuple[Callable[..., Any], Callable[..., Any]]:
    return IMPLEMENTATIONS[request.param]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    yield a, b
    a.close()
    b.close()


def test_the_compiled_helper_is_built_where_a_compiler_is() -> None:
    # make test installs with gcc present: the fast path must be the one in use
    if os.environ.get("SBUS_PURE_PYTHON"):
        pytest.skip("pure Python asked for")
    assert batchio.COMPILED


def test_packets_come_and_go_whole_and_in_order(impl: Any, pair: Any) -> None:
    recv_many, send_all = impl
    a, b = pair
    packets = [b"MSG k/%d\0" % i + b"x" * i for i in range(300)]  # more than one sendmmsg
    assert send_all(a.fileno(), packets) == 300
    got: list[bytes] = []
    while len(got) < 300:
        got += recv_many(b.fileno(), 64)
    assert got == packets
    assert recv_many(b.fileno(), 64) == []  # nothing waiting: no error


def test_send_all_stops_where_the_socket_is_full(impl: Any, pair: Any) -> None:
    recv_many, send_all = impl
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
    packets = [b"y" * 4000] * 1000
    sent = send_all(a.fileno(), packets)
    assert 0 < sent < 1000
    assert send_all(a.fileno(), packets[sent:]) == 0  # still full: 0, not an error
    assert len(recv_many(b.fileno(), 64)) == min(sent, 64)


def test_send_all_reports_what_went_before_an_error(impl: Any, pair: Any) -> None:
    """Packets that went are counted; the error comes with the next call."""
    _, send_all = impl
    a, b = pair
    b.close()
    with pytest.raises(OSError):
        send_all(a.fileno(), [b"x"])


@pytest.mark.parametrize("name", sorted(SEND_ONE))
def test_one_packet_goes_whole_and_a_full_or_closed_socket_raises(name: str, pair: Any) -> None:
    send_one = SEND_ONE[name]
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    send_one(a.fileno(), b"MSG k\0one")
    assert b.recv(100) == b"MSG k\0one"
    with pytest.raises(BlockingIOError):
        for _ in range(10_000):
            send_one(a.fileno(), b"x" * 1000)
    b.close()
    with pytest.raises(OSError):  # the peer went: an error, never a signal
        send_one(a.fileno(), b"x")


def test_a_borrowed_socket_leaves_its_descriptor_open(pair: Any) -> None:
    a, b = pair
    with batchio.borrowed(a.fileno()) as sock:
        sock.send(b"via a borrowed socket")
    os.fstat(a.fileno())  # still open
    assert b.recv(100) == b"via a borrowed socket"
    a.send(b"and the owner's own")
    assert b.recv(100) == b"and the owner's own"


def test_an_over_long_packet_is_none_and_an_empty_one_ends_the_batch(impl: Any, pair: Any) -> None:
    recv_many, _ = impl
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    a.send(b"ok")
    a.send(b"z" * 409_601)
    assert recv_many(b.fileno(), 64) == [b"ok", None]
    a.send(b"one")
    a.send(b"")
    a.send(b"after")  # the sender broke the protocol: what follows does not count
    assert recv_many(b.fileno(), 64) == [b"one", b""]
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    d.setblocking(False)
    c.send(b"last")
    c.close()
    assert recv_many(d.fileno(), 64) == [b"last", b""]  # end of stream
    d.close()


@pytest.fixture
def pure_bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("SBUS_PURE_PYTHON", "1")
    with running_bus(tmp_path, "--hard-limit-messages", "100", command="serve") as bus:
        yield bus


def test_a_server_on_the_pure_python_path(pure_bus: Any) -> None:
    sub, pub, stalled = (RawClient(pure_bus.address) for _ in range(3))
    stalled.shrink_rcvbuf()
    stalled.sub(b"k/")  # never reads: hard/discard at 100 must not hold up the others
    sub.cmsg(b"blocking/hard/block")  # a lagging reader thread slows the publisher, loses none
    sub.sub(b"k/")
    packets = [b"MSG k/%d\0" % i + b"p" * 64 for i in range(5000)]
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(sub.recv_packet() for _ in packets))
    reader.start()
    for packet in packets:
        pub.send(packet)
    reader.join(30)
    assert got == packets
    pub.sync()
