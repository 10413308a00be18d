"""Many packets per system call: ``recvmmsg``/``sendmmsg`` when compiled, else one by one.

What it owns: how many packets go in one system call, and the compiled
helper's choice.  What it may touch: the descriptors it is given.

The bus reads a client's waiting packets as one batch and sends each
recipient what a batch routed to it in one call.  A connection keeps only
its socket's file descriptor (a socket object would cost every idle client
its size), so each function takes the descriptor:

* ``recv_many(fd, limit)``: up to ``limit`` waiting packets; None for
  an over-long one, b"" for an empty packet or the end of stream (nothing is
  read after either);
* ``send_all(fd, packets)``: send in order until the socket would
  block; how many it took;
* ``send_packed(fd, packets, head)``: the same in packed batches
  (``codec.pack``; the compiled helper gathers the same frames from the
  packets without copying, ``head`` being ``codec.BATCH_HEAD``); how many
  packets went, in whole batches;
* ``send_one(fd, packet)``: one packet; BlockingIOError when the socket is full.

The compiled helper
(``_batchio``, built from ``_batchio.c`` when the package is installed with a
C compiler) does that with one system call per batch; without it, or with
``SBUS_PURE_PYTHON=1`` in the environment (``accel``), the functions below do
the same one packet per call.  Both are tested (``tests/server/test_batchio.py``).
The rare calls that need a socket object (a peek, passing descriptors) make
one over the descriptor for that call alone (``borrowed``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from collections.abc import Iterator
from types import ModuleType

from sbus_relay.accel import pure_python_requested
from sbus_relay.protocol.codec import pack
from sbus_relay.protocol.limits import MAX_PACKET

_compiled: ModuleType | None = None
if not pure_python_requested():
    with contextlib.suppress(ImportError):
        _compiled = importlib.import_module("sbus_relay.bus._batchio")

#: True when the compiled helper is in use.
COMPILED = _compiled is not None

_buffer = bytearray(MAX_PACKET + 1)
_view = memoryview(_buffer)


def _recv_many_py(fd: int, limit: int) -> list[bytes | None]:
    """Up to ``limit`` waiting packets; None for an over-long one, b"" for an empty
    packet or the end of stream (nothing is read after either).  (A read of a
    SEQPACKET socket takes one packet and cuts off what does not fit, so a
    packet that fills the whole buffer is an over-long one.)"""
    out: list[bytes | None] = []
    readv = os.readv
    buffers = [_buffer]
    for _ in range(limit):
        try:
            n = readv(fd, buffers)
        except BlockingIOError:
            break
        if n > MAX_PACKET:
            out.append(None)
            break
        out.append(bytes(_view[:n]))
        if n == 0:
            break
    return out


def _send_one_py(fd: int, packet: bytes) -> None:
    """Send one packet without blocking (a write to a SEQPACKET socket is one
    packet; the descriptor is non-blocking, ``Connection.attach``)."""
    os.write(fd, packet)


def _send_all_py(fd: int, packets: list[bytes]) -> int:
    """Send ``packets`` in order until the socket would block; how many it took.
    An error after some went is left for the next call to raise."""
    write = os.write
    sent = 0
    for packet in packets:
        try:
            write(fd, packet)
        except BlockingIOError:
            break
        except OSError:
            if not sent:
                raise
            break
        sent += 1
    return sent


def _send_packed_py(fd: int, packets: list[bytes], head: bytes) -> int:
    """``packets`` in packed batches (``codec.pack``) until the socket would
    block; how many went.  A packet that is not a MSG goes alone, as it is."""
    del head  # always codec.BATCH_HEAD, which codec.pack writes
    frames, counts = pack(packets)
    went = _send_all_py(fd, frames)
    return sum(counts[:went])


@contextlib.contextmanager
def borrowed(fd: int) -> Iterator[socket.socket]:
    """A socket object over ``fd`` for one rare call; ``fd`` stays open after it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fd)
    try:
        yield sock
    finally:
        sock.detach()


if _compiled is not None:
    recv_many = _compiled.recv_many
    send_all = _compiled.send_all
    send_packed = _compiled.send_packed
    send_one = _compiled.send_one
else:
    recv_many = _recv_many_py
    send_all = _send_all_py
    send_packed = _send_packed_py
    send_one = _send_one_py
