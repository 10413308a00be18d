"""The raw sbus client core: bare SOCK_SEQPACKET packets, nothing hidden.

``RawConnection`` speaks the wire protocol over a plain ``AF_UNIX`` socket and
never imports ``sbus_relay.client``, so whatever passes against it works with any
reference-protocol client.  The hardening harness (``tests/hardening/harness``,
``Conn``) and the test suite's ``tests/server/rawclient.py`` (``RawClient``)
both build on it; each adds its own ``send`` and its own defaults.

``seqpacket_listening`` reads ``/proc/net/unix`` to tell whether a server is
listening without connecting to it (a probe connection would itself be a client).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from typing import Self

#: Receive buffer: one byte over the largest legal packet (docs/protocol.md) so truncation shows.
RECV_BUFFER = 409_601
WHOAMI = b"!/cred/whoami"
#: /proc/net/unix: the flag of a listening socket and the SEQPACKET type.
_SO_ACCEPTCON = 0x10000
_SOCK_SEQPACKET = 5


def seqpacket_listening(name: str) -> bool:
    """True when a SEQPACKET socket listens on ``name`` as /proc/net/unix shows it
    (an absolute path, or an abstract name with ``@`` for its NUL bytes)."""
    with open("/proc/net/unix", encoding="latin-1") as table:
        next(table)
        for line in table:
            parts = line.rstrip("\n").split(None, 7)
            if len(parts) == 8 and parts[7] == name:
                flags, kind = int(parts[3], 16), int(parts[4], 16)
                if flags & _SO_ACCEPTCON and kind == _SOCK_SEQPACKET:
                    return True
    return False


#: What the server sends just before it closes a client, the reason after it.
DISCONNECT = b"CMSG disconnect\0"


class Closed(Exception):
    """The server closed this connection (EOF or ECONNRESET)."""


class RawConnection:
    """One raw connection: packets in, with those read out of turn kept pending.

    Subclasses define ``send`` (what a failed send raises is theirs to choose).
    """

    def __init__(
        self,
        address: str | bytes | None,
        timeout: float,
        *,
        sock: socket.socket | None = None,
    ) -> None:
        """Connect to ``address`` (a path, or a whole abstract sun_path), or wrap ``sock``."""
        own = sock is None
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = sock
        self.timeout = timeout
        self.sock.settimeout(timeout)
        if address is not None:
            try:
                self.sock.connect(address)
            except BaseException:
                if own:
                    self.sock.close()
                raise
        # Packets read while waiting for something else (see ``_whoami``).
        self.pending: deque[bytes] = deque()
        #: the reason the server gave when it closed us, if it did
        self.disconnect_reason: str | None = None

    def send(self, packet: bytes) -> None:
        raise NotImplementedError

    def pub(self, key: bytes, payload: bytes = b"") -> bytes:
        """Publish; returns the packet sent (what subscribers must receive)."""
        packet = b"MSG " + key + b"\0" + payload
        self.send(packet)
        return packet

    def cmsg(self, key: bytes, payload: bytes | None = None) -> None:
        self.send(b"CMSG " + key + (b"" if payload is None else b"\0" + payload))

    def _next_packet(self, timeout: float) -> bytes:
        """The next packet, pending ones first; ``TimeoutError`` or ``Closed``."""
        if self.pending:
            return self.pending.popleft()
        return self._recv(timeout)

    def _recv(self, timeout: float) -> bytes:
        """The next packet off the socket itself; ``TimeoutError`` or ``Closed``."""
        self.sock.settimeout(timeout)
        try:
            data, _anc, flags, _addr = self.sock.recvmsg(RECV_BUFFER)
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise Closed(str(exc)) from exc
        finally:
            self.sock.settimeout(self.timeout)
        # The server never sends an empty packet, so b"" is EOF.
        if not data:
            raise Closed("EOF")
        if flags & socket.MSG_TRUNC:
            raise AssertionError("the server sent a packet over 409,600 bytes")
        if data.startswith(DISCONNECT):
            # The server says why it closes us, then closes (docs/protocol.md).
            self.disconnect_reason = data[len(DISCONNECT) :].decode("utf-8", "replace")
        return data

    def _whoami(self, timeout: float) -> bytes:
        """Ask for our identity chain; packets that arrive meanwhile stay pending, in order.

        The server handles one client's packets in order, so its answer also proves
        that everything sent before it took effect.
        """
        self.cmsg(WHOAMI)
        prefix = b"CMSG " + WHOAMI + b"\0"
        deadline = time.monotonic() + timeout
        held: list[bytes] = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no whoami reply")
                packet = self._recv(left)
                if packet.startswith(prefix):
                    return packet[len(prefix) :]
                held.append(packet)
        finally:
            self.pending.extend(held)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
