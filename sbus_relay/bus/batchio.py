"""Many packets per system call: ``recvmmsg``/``sendmmsg`` when compiled, else one by one.

The bus reads a client's waiting packets as one batch and sends each
recipient what a batch routed to it in one call.  The compiled helper
(``_batchio``, built from ``_batchio.c`` when the package is installed with a
C compiler) does that with one system call per batch; without it, or with
``SBUS_PURE_PYTHON=1`` in the environment (``accel``), the functions below do
the same one packet per call.  Both are tested (``tests/server/test_batchio.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import socket
from types import ModuleType

from sbus_relay.accel import pure_python_requested
from sbus_relay.protocol.limits import MAX_PACKET

_TRUNC = socket.MSG_TRUNC

_compiled: ModuleType | None = None
if not pure_python_requested():
    with contextlib.suppress(ImportError):
        _compiled = importlib.import_module("sbus_relay.bus._batchio")

#: True when the compiled helper is in use.
COMPILED = _compiled is not None

_buffer = bytearray(MAX_PACKET + 1)
_view = memoryview(_buffer)


def _recv_many_py(sock: socket.socket, fd: int, limit: int) -> list[bytes | None]:
    """Up to ``limit`` waiting packets; None for an over-long one, b"" for an empty
    packet or the end of stream (nothing is read after either)."""
    del fd
    out: list[bytes | None] = []
    recv_into = sock.recv_into
    for _ in range(limit):
        try:
            n = recv_into(_buffer, MAX_PACKET + 1, _TRUNC)
        except BlockingIOError:
            break
        if n > MAX_PACKET:
            out.append(None)
            break
        out.append(bytes(_view[:n]))
        if n == 0:
            break
    return out


def _send_many_py(sock: socket.socket, fd: int, packets: list[bytes], start: int) -> int:
    """Send ``packets[start:]`` until the socket would block; how many it took."""
    del fd
    send = sock.send
    sent = 0
    for i in range(start, len(packets)):
        try:
            send(packets[i])
        except BlockingIOError:
            break
        sent += 1
    return sent


def _recv_many_c(sock: socket.socket, fd: int, limit: int) -> list[bytes | None]:
    del sock
    assert _compiled is not None
    result: list[bytes | None] = _compiled.recv_many(fd, limit)
    return result


def _send_many_c(sock: socket.socket, fd: int, packets: list[bytes], start: int) -> int:
    del sock
    assert _compiled is not None
    sent: int = _compiled.send_many(fd, packets, start)
    return sent


recv_many = _recv_many_c if COMPILED else _recv_many_py
send_many = _send_many_c if COMPILED else _send_many_py


def send_all(sock: socket.socket, fd: int, packets: list[bytes]) -> int:
    """Send as many of ``packets`` as the socket takes now, in order; how many."""
    sent = 0
    total = len(packets)
    while sent < total:
        n = send_many(sock, fd, packets, sent)
        if not n:
            break
        sent += n
    return sent
