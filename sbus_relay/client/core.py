"""A small sbus client: one SEQPACKET connection, one packet per message.

Blocking with the stdlib ``socket``.  Cooperative under gevent either when
gevent has monkey-patched ``socket`` (``addresses.connect`` then builds a gevent
socket) or with ``Client(..., cooperative=True)``.

The server keeps no state for us beyond subscriptions and modes (the protocol
"No state-keeping required in clients"), so this class is thin: it encodes with
``codec``, receives into one reusable buffer one byte larger than the largest
legal packet so that an over-long packet is detected (docs/protocol.md,
Packets), and keeps a bounded backlog of messages that arrived while it waited
for a reply.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType

from sbus_relay.ops.addresses import Address, connect
from sbus_relay.protocol.codec import (
    Control,
    Publish,
    decode,
    encode_cmsg,
    encode_msg,
    encode_sub,
    encode_unsub,
)
from sbus_relay.protocol.errors import BusClosed, PeerError, UsageError
from sbus_relay.protocol.limits import CLIENT_PENDING_MESSAGES, MAX_PACKET

#: The credentials request and reply key (docs/protocol.md, "Credentials").
WHOAMI_KEY = b"!/cred/whoami"
#: The server's notice, just before it closes us, of why (docs/protocol.md).
DISCONNECT_KEY = b"disconnect"
#: Packets read, without waiting, to find the server's disconnect notice after
#: a failed send: it is behind at most the messages already queued to us.
NOTICE_SCAN_PACKETS = 64
#: Flood-control modes a client may ask for (docs/protocol.md, Flood control).
FLOOD_MODES = frozenset(
    {
        "blocking/soft/queue",
        "blocking/soft/discard",
        "blocking/soft/block",
        "blocking/soft/error",
        "blocking/hard/discard",
        "blocking/hard/block",
        "blocking/hard/error",
        "order/queue",
        "order/stack",
        "order/random",
    }
)

Data = str | bytes


@dataclass(frozen=True, slots=True)
class Message:
    """One received packet: a publish (``control=False``) or a server control message."""

    control: bool
    key: bytes
    payload: bytes
    packet: bytes


def _bytes(value: Data) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


class Client:
    """A connection to a bus.  ``timeout`` (seconds, None = forever) applies to
    every send and to ``receive``/``whoami`` unless they are given their own."""

    def __init__(
        self, address: str | Address, *, timeout: float | None = None, cooperative: bool = False
    ) -> None:
        sock = connect(address)
        if cooperative:
            from gevent import socket as gsocket

            sock = gsocket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self._sock: socket.socket = sock
        self.timeout = timeout
        # One buffer for the connection's life: MAX_PACKET + 1 bytes, so a packet
        # that fills it is over-long even if MSG_TRUNC were not reported.
        self._buffer = bytearray(MAX_PACKET + 1)
        self._view = memoryview(self._buffer)
        self._pending: deque[Message] = deque()
        self._closed = False

    # --- sending -------------------------------------------------------------

    def send_raw(self, packet: bytes) -> None:
        """Send one packet as is (tests use it to send malformed ones)."""
        self._check_open()
        self._sock.settimeout(self.timeout)
        try:
            sent = self._sock.send(packet)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self._closed_error(str(exc)) from exc
        if sent != len(packet):  # cannot happen on SEQPACKET; be loud if it does
            raise BusClosed(f"short send: {sent} of {len(packet)} bytes")

    def _send(self, packet: bytes) -> None:
        if len(packet) > MAX_PACKET:
            raise UsageError(f"packet of {len(packet)} bytes is over the {MAX_PACKET}-byte limit")
        self.send_raw(packet)

    def subscribe(self, pattern: Data) -> None:
        """``SUB pattern``; the same pattern twice needs two unsubscribes."""
        self._send(encode_sub(_bytes(pattern)))

    def unsubscribe(self, pattern: Data) -> None:
        """``UNSUB pattern``."""
        self._send(encode_unsub(_bytes(pattern)))

    def publish(self, key: Data, payload: Data = b"") -> None:
        """``MSG key\\0payload``."""
        self._send(encode_msg(_bytes(key), _bytes(payload)))

    def control(self, key: Data, payload: Data | None = None) -> None:
        """``CMSG key[\\0payload]`` to the server."""
        self._send(encode_cmsg(_bytes(key), None if payload is None else _bytes(payload)))

    def echo(self, on: bool) -> None:
        """Receive (or not) our own publishes when subscribed (docs/protocol.md, Echo)."""
        self.control(b"echo/on" if on else b"echo/off")

    def flood(self, mode: str) -> None:
        """Ask for a flood-control mode, e.g. ``"blocking/soft/discard"`` (docs/protocol.md)."""
        if mode not in FLOOD_MODES:
            raise UsageError(f"unknown flood mode {mode!r}; one of {sorted(FLOOD_MODES)}")
        self.control(mode)

    # --- receiving -----------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Message:
        """The next message; raises ``TimeoutError`` or ``BusClosed``.

        ``timeout`` None means the client's own timeout.
        """
        if self._pending:
            return self._pending.popleft()
        return self._next(self.timeout if timeout is None else timeout)

    def iter_messages(self, timeout: float | None = None) -> Iterator[Message]:
        """Messages until the bus closes the connection (``TimeoutError`` propagates)."""
        while True:
            try:
                yield self.receive(timeout)
            except BusClosed:
                return

    def whoami(self, timeout: float | None = None) -> str:
        """Our credentials as the server sees them, e.g. ``"!/cred/100/1000/1111"``.

        Messages that arrive before the reply are kept for ``receive`` (bounded by
        ``CLIENT_PENDING_MESSAGES``), so asking never loses one.
        """
        limit = self.timeout if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit
        self.control(WHOAMI_KEY)
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            message = self._next(remaining)
            if message.control and message.key == WHOAMI_KEY:
                return message.payload.decode("utf-8", "surrogateescape")
            if len(self._pending) >= CLIENT_PENDING_MESSAGES:
                raise UsageError(
                    f"over {CLIENT_PENDING_MESSAGES} messages arrived while waiting for"
                    " whoami; receive() them first"
                )
            self._pending.append(message)

    @property
    def buffered(self) -> int:
        """Messages already received and waiting for ``receive`` (select() won't see them)."""
        return len(self._pending)

    def _next(self, timeout: float | None) -> Message:
        """The next packet as a Message; the server's disconnect notice raises BusClosed."""
        message = self._parse(self._recv(timeout))
        if message.control and message.key == DISCONNECT_KEY:
            reason = message.payload.decode("utf-8", "replace")
            raise BusClosed(f"the bus closed the connection: {reason}", reason)
        return message

    def _closed_error(self, error: str) -> BusClosed:
        """A send failed: the reason is the disconnect notice still waiting to be read."""
        try:
            for _ in range(NOTICE_SCAN_PACKETS):
                message = self._next(0.0)
                if len(self._pending) < CLIENT_PENDING_MESSAGES:
                    self._pending.append(message)
        except BusClosed as exc:
            if exc.reason:
                return exc
        except (OSError, PeerError):
            pass
        return BusClosed(f"the bus closed the connection: {error}")

    def _recv(self, timeout: float | None) -> bytes:
        self._check_open()
        self._sock.settimeout(timeout)
        try:
            size, _ancdata, flags, _addr = self._sock.recvmsg_into([self._view])
        except (ConnectionResetError, BrokenPipeError) as exc:
            # A reset is reported once, before the packets still queued to us
            # (the server's disconnect notice among them): read those first.
            try:
                self._sock.settimeout(0.0)
                size, _ancdata, flags, _addr = self._sock.recvmsg_into([self._view])
            except OSError:
                size = 0
            if size == 0:
                raise BusClosed(f"the bus closed the connection: {exc}") from exc
        if size == 0:
            # The server never sends empty packets, so 0 bytes is end of stream.
            raise BusClosed("the bus closed the connection")
        if flags & socket.MSG_TRUNC or size > MAX_PACKET:
            raise PeerError("protocol_error", f"server sent a packet over {MAX_PACKET} bytes")
        return bytes(self._view[:size])

    @staticmethod
    def _parse(packet: bytes) -> Message:
        event = decode(packet)
        if isinstance(event, Publish):
            return Message(False, event.key, event.payload, packet)
        if isinstance(event, Control):
            return Message(True, event.key, event.payload or b"", packet)
        raise PeerError("protocol_error", "server sent a SUB or UNSUB packet")

    # --- lifetime ------------------------------------------------------------

    def fileno(self) -> int:
        """The socket's descriptor, for select/poll (mind ``buffered``)."""
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        """True after ``close``."""
        return self._closed

    def close(self) -> None:
        """Close the connection (idempotent); the server forgets our subscriptions."""
        if not self._closed:
            self._closed = True
            self._view.release()
            self._sock.close()

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the client is closed")

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
