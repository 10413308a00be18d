"""The blocking client: ``Client``, over the protocol core (``session.py``).

What it owns: the blocking face's I/O: its socket, its timeouts and its waits.
What it may touch: its Session and its bookkeeping (client.session),
client.sockets.

Blocking with the stdlib ``socket``.  Cooperative under gevent either when
gevent has monkey-patched ``socket`` and ``time`` (``addresses.connect`` then
builds a gevent socket) or with ``Client(..., cooperative=True)``.

There is no thread and no greenlet behind a ``Client``: everything happens in
the caller's own calls.  A lost connection is noticed by the call that meets
it (a send that fails, a receive that reads the end); with ``reconnect`` on,
that call connects again with capped back-off (within its own timeout: a
``receive`` still times out), the session sends its handshake, and the call
goes on.  A ``publish`` while away is buffered and returns at once; it tries
one connection if the back-off allows, without waiting.

Every packet is received into one reusable buffer one byte larger than the
largest legal packet, so that an over-long packet is detected
(docs/protocol.md, Packets).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import deque
from collections.abc import Iterable, Iterator
from types import TracebackType

from sbus_relay.ops.addresses import Address, connect, parse_address
from sbus_relay.protocol.errors import (
    AddressError,
    BusClosed,
    PeerError,
    SbusError,
    UsageError,
)
from sbus_relay.protocol.keys import WHOAMI
from sbus_relay.protocol.limits import (
    CLIENT_BUFFER_BYTES,
    CLIENT_BUFFER_MESSAGES,
    CLIENT_PENDING_MESSAGES,
    CLIENT_RESUBSCRIBE_GRACE,
    MAX_PACKET,
    NOTICE_SCAN_PACKETS,
)

from .session import (
    FINAL_REASONS,
    FLOOD_MODES,
    Backoff,
    Callbacks,
    Closing,
    Data,
    Disconnected,
    Message,
    Outages,
    Ready,
    Reconnected,
    Requests,
    Session,
    State,
    WhoamiReply,
)
from .sockets import drain_and_close, received
from .stats import ClientStats

__all__ = ["FLOOD_MODES", "WHOAMI_KEY", "Client", "Message"]

#: The credentials request and reply key (docs/protocol.md, "Credentials").
WHOAMI_KEY = WHOAMI


class Client(Callbacks):
    """A connection to a bus that comes back by itself.

    ``timeout`` (seconds, None = forever) applies to every send and to
    ``receive``/``whoami``/``request`` unless they are given their own.
    ``reconnect=False`` makes a lost connection final (``BusClosed``).
    ``batch=True`` asks the bus for packed batches (docs/protocol.md,
    "Packed batches"); a bus that does not know them is detected.
    """

    def __init__(
        self,
        address: str | Address,
        *,
        timeout: float | None = None,
        cooperative: bool = False,
        reconnect: bool = True,
        batch: bool = False,
        buffer_messages: int = CLIENT_BUFFER_MESSAGES,
        buffer_bytes: int = CLIENT_BUFFER_BYTES,
        on_disconnected: Disconnected | None = None,
        on_reconnected: Reconnected | None = None,
    ) -> None:
        self.address = parse_address(address) if isinstance(address, str) else address
        self.timeout = timeout
        self.cooperative = cooperative
        # An inherited descriptor cannot be connected again.
        self.reconnect = reconnect and self.address.kind != "fd"
        self.outages = Outages(on_disconnected, on_reconnected)
        self.session = Session(
            batch=batch, buffer_messages=buffer_messages, buffer_bytes=buffer_bytes
        )
        self._buffer = bytearray(MAX_PACKET + 1)
        self._view = memoryview(self._buffer)
        self._views = [self._view]
        #: the timeout the socket has now: set again only when it changes
        #: (each change is a system call)
        self._sock_timeout: float | None = -1.0
        self._pending: deque[Message] = deque()
        self._answers: deque[bytes] = deque()
        self._closed = False
        #: why the client closed for good, when the bus decided it
        self._final: BusClosed | None = None
        self._sock: socket.socket | None = None
        self._backoff = Backoff()
        self._release_at = 0.0
        self._requests = Requests()
        self._attach(connect(self.address))

    # --- sending -------------------------------------------------------------

    def send_raw(self, packet: bytes) -> None:
        """Send one packet as is, on this connection (tests send malformed ones)."""
        self._check_open()
        self._flush()
        sock = self._connected_socket(self._deadline(None))
        self._set_timeout(sock, self.timeout)
        try:
            sock.send(packet)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self._closed_error(str(exc)) from exc

    def subscribe(self, pattern: Data) -> None:
        """``SUB pattern``, held across reconnects; the same pattern twice needs
        two unsubscribes."""
        self._check_open()
        self.session.subscribe(pattern)
        self._flush()

    def unsubscribe(self, pattern: Data) -> None:
        """``UNSUB pattern``: one hold of it."""
        self._check_open()
        self.session.unsubscribe(pattern)
        self._flush()

    def publish(self, key: Data, payload: Data = b"") -> None:
        """``MSG key\\0payload``.  While the bus is away it waits in the buffer
        (``BufferFull`` when that is full) and goes out, in order, once back."""
        self._ready_to_publish()
        self.session.publish(key, payload)
        self._flush()

    def publish_many(self, items: Iterable[tuple[Data, Data]]) -> int:
        """Publish several ``(key, payload)`` at once: packed batches where the bus
        agreed to them, else one packet each; how many."""
        self._ready_to_publish()
        count = self.session.publish_many(items)
        self._flush()
        return count

    def _ready_to_publish(self) -> None:
        """Before a publish: connect or move the handshake on where it can, and
        let out what the buffer holds once its wait after a reconnect is over."""
        self._check_open()
        state = self.session.state
        if state is not State.READY:
            if state is State.DISCONNECTED:
                self._try_now()
            self._advance_handshake()
        if self.session.holding:
            self._release(time.monotonic() >= self._release_at)

    def flush(self, timeout: float | None = None) -> None:
        """Wait (within ``timeout``) until the bus is there and has been handed
        every publish, the buffered ones too; ``TimeoutError`` if it is still away."""
        self._check_open()
        deadline = self._deadline(timeout)
        while self.session.buffered or self._sock is None:
            self._connected_socket(deadline)
            self._release(True)
            self._flush()

    def control(self, key: Data, payload: Data | None = None) -> None:
        """``CMSG key[\\0payload]`` to the bus, on this connection."""
        self._check_open()
        self._connected_socket(self._deadline(None))
        self.session.control(key, payload)
        self._flush()

    def echo(self, on: bool) -> None:
        """Receive (or not) our own publishes when subscribed (docs/protocol.md, Echo)."""
        self._check_open()
        self.session.set_echo(on)
        self._flush()

    def flood(self, mode: str) -> None:
        """Ask for a flood-control mode, e.g. ``"blocking/soft/discard"`` (docs/protocol.md)."""
        self._check_open()
        self.session.set_flood(mode)
        self._flush()

    # --- receiving -----------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Message:
        """The next message; raises ``TimeoutError`` or ``BusClosed``.

        ``timeout`` None means the client's own timeout.
        """
        pending = self._pending
        if pending:
            return pending.popleft()
        deadline = self._deadline(timeout)
        while not pending:
            self._step(deadline)
        return pending.popleft()

    def messages(self, timeout: float | None = None) -> Iterator[Message]:
        """Messages until the client closes for good (``TimeoutError`` propagates)."""
        while True:
            try:
                yield self.receive(timeout)
            except BusClosed:
                return

    iter_messages = messages

    def whoami(self, timeout: float | None = None) -> str:
        """Our credentials as the bus sees them, e.g. ``"!/cred/100/1000/1111"``.

        Messages that arrive before the reply are kept for ``receive`` (bounded by
        ``CLIENT_PENDING_MESSAGES``), so asking never loses one.
        """
        self._check_open()
        deadline = self._deadline(timeout)
        self.session.ask_whoami()
        self._flush()
        while not self._answers:
            self._step(deadline, waiting=True)
        return self._answers.popleft().decode("utf-8", "surrogateescape")

    def request(self, key: Data, payload: Data = b"", timeout: float | None = None) -> Message:
        """Publish a request to ``key`` and wait for its reply, which comes to
        this client's own secret inbox (docs/client.md, "Request and reply")."""
        self._check_open()
        deadline = self._deadline(timeout)
        reply_to, request = self._requests.new(self._inbox(deadline), payload)
        self.publish(key, request)
        while True:
            for i, message in enumerate(self._pending):
                if message.key == reply_to and not message.control:
                    del self._pending[i]
                    return message
            self._step(deadline, waiting=True)

    def reply(self, request: Message, payload: Data = b"") -> None:
        """Answer a request received with ``receive``."""
        self.publish(Requests.reply_key(request), payload)

    @property
    def buffered(self) -> int:
        """Messages already received and waiting for ``receive`` (select() won't see them)."""
        return len(self._pending)

    @property
    def stats(self) -> ClientStats:
        """What happened to this client so far (reconnects, outages, buffered, lost)."""
        return ClientStats.of(self.session, self.outages.history)

    # --- inside ------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float | None:
        limit = self.timeout if timeout is None else timeout
        return None if limit is None else time.monotonic() + limit

    def _inbox(self, deadline: float | None) -> bytes:
        """This client's reply inbox, subscribed (and confirmed) on first use."""
        session = self.session
        if session.identity is None:
            self.whoami(_left(deadline))
        inbox = session.inbox()
        if inbox not in session.patterns:
            session.subscribe(inbox)
            self.whoami(_left(deadline))  # its answer means the SUB is in place
            inbox = session.inbox()
        return inbox

    def _step(self, deadline: float | None, waiting: bool = False) -> None:
        """Read one packet (connecting again first if need be) and take in what it means."""
        self._check_open()
        sock = self._connected_socket(deadline)
        now = time.monotonic()
        remaining = None if deadline is None else max(0.0, deadline - now)
        holding = self.session.holding
        if holding:
            if now >= self._release_at:
                self._release(True)
                return
            until = self._release_at - now
            remaining = until if remaining is None else min(remaining, until)
        try:
            packet = self._recv(sock, remaining)
        except BusClosed as exc:
            self._lost(exc)
            return
        except TimeoutError:
            if holding and time.monotonic() >= self._release_at:
                self._release(True)
                return
            raise
        messages = self.session.messages(packet)
        if messages is not None:  # the common case: nothing but messages
            self._pending.extend(messages)
            if waiting and len(self._pending) > CLIENT_PENDING_MESSAGES:
                raise UsageError(
                    f"over {CLIENT_PENDING_MESSAGES} messages arrived while waiting for"
                    " a reply; receive() them first"
                )
            return
        self._take(self.session.receive(packet), waiting)

    def _take(self, events: list[Message | WhoamiReply | Ready | Closing], waiting: bool) -> None:
        for event in events:
            if isinstance(event, Message):
                if waiting and len(self._pending) >= CLIENT_PENDING_MESSAGES:
                    raise UsageError(
                        f"over {CLIENT_PENDING_MESSAGES} messages arrived while waiting for"
                        " a reply; receive() them first"
                    )
                self._pending.append(event)
            elif isinstance(event, WhoamiReply):
                self._answers.append(event.identity)
            elif isinstance(event, Ready):
                self.outages.ready(event, time.monotonic())
            else:
                self._lost(event.error(), final=event.final)
        self._flush()

    def _release(self, due: bool) -> None:
        """Send what was buffered while away, once its grace is over."""
        if due and self.session.holding:
            self.session.release()
            self._flush()

    def _advance_handshake(self) -> None:
        """Take in, without waiting, what already arrived while a handshake is
        under way: a client that only publishes never reads otherwise, and its
        handshake (batched delivery, secret patterns) would wait until it does."""
        while self._sock is not None and self.session.state is State.HANDSHAKE:
            try:
                self._step(time.monotonic())
            except TimeoutError:
                return

    def _connected_socket(self, deadline: float | None) -> socket.socket:
        """The live socket, connecting again (within ``deadline``) if it is gone."""
        while self._sock is None:
            self._check_open()
            now = time.monotonic()
            if now < self._backoff.next_try:
                wait = self._backoff.next_try - now
                if deadline is not None and now + wait > deadline:
                    self._sleep(max(0.0, deadline - now))
                    raise TimeoutError("the bus is away; still trying to connect")
                self._sleep(wait)
            self._try_now()
        return self._sock

    def _try_now(self) -> None:
        """One connection attempt if the back-off allows it now."""
        now = time.monotonic()
        if self._sock is not None or now < self._backoff.next_try or self._closed:
            return
        try:
            sock = connect(self.address)
        except AddressError:
            self._backoff.failed(now)
            return
        self._attach(sock)

    def _attach(self, sock: socket.socket) -> None:
        if self.cooperative:
            from gevent import socket as gsocket

            sock = gsocket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self._sock = sock
        self._sock_timeout = -1.0
        self._backoff.connected()
        ready = self.session.connection_made()
        self._release_at = time.monotonic() + CLIENT_RESUBSCRIBE_GRACE
        self._flush()
        if ready is not None:
            self.outages.ready(ready, time.monotonic())

    def _flush(self) -> None:
        """Send what the session queued; a failure is a lost connection."""
        sock = self._sock
        if sock is None:
            return
        packets = self.session.outgoing()
        if not packets:
            return
        self._set_timeout(sock, self.timeout)
        for i, packet in enumerate(packets):
            try:
                sock.send(packet)
            except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError) as exc:
                self.session.put_back(packets[i:])
                self._lost(self._closed_error(str(exc)))
                return
            except TimeoutError:
                self.session.put_back(packets[i:])
                raise

    def _lost(self, exc: BusClosed, final: bool = False) -> None:
        """The connection is gone: connect again later, or (no reconnect, or a
        final refusal) close for good and raise."""
        final = final or exc.reason in FINAL_REASONS
        if self._sock is None:
            if final or not self.reconnect:
                self._give_up(exc)
                raise exc
            return
        self._sock.close()
        self._sock = None
        self.session.connection_lost()
        if final or not self.reconnect:
            self._give_up(exc)
            raise exc
        self._backoff.lost()
        self.outages.lost(exc.reason, time.monotonic())

    def _give_up(self, why: BusClosed | None = None) -> None:
        if self._final is None:
            self._final = why
        if not self._closed:
            self.session.give_up()
            self._closed = True
            self._view.release()

    def _closed_error(self, error: str) -> BusClosed:
        """A send failed: the reason is the disconnect notice still waiting to be read."""
        sock = self._sock
        if sock is None:
            return BusClosed(f"the bus closed the connection: {error}")
        try:
            for _ in range(NOTICE_SCAN_PACKETS):
                for event in self.session.receive(self._recv(sock, 0.0)):
                    if isinstance(event, Closing):
                        return event.error()
                    if isinstance(event, Message) and len(self._pending) < CLIENT_PENDING_MESSAGES:
                        self._pending.append(event)
        except (OSError, PeerError, BusClosed):
            pass  # no notice to be had: the send's error says what there is
        return BusClosed(f"the bus closed the connection: {error}")

    def _recv(self, sock: socket.socket, timeout: float | None) -> bytes:
        """One packet.  A read that does not wait is tried first: while packets
        are waiting that is one system call per packet, where a socket with a
        timeout polls before every read."""
        try:
            if self._sock_timeout != 0.0:
                sock.settimeout(0.0)
                self._sock_timeout = 0.0
            try:
                size, _ancdata, flags, _addr = sock.recvmsg_into(self._views)
            except BlockingIOError:
                if timeout == 0.0:
                    raise TimeoutError("timed out") from None
                sock.settimeout(timeout)
                self._sock_timeout = timeout
                size, _ancdata, flags, _addr = sock.recvmsg_into(self._views)
        except (ConnectionResetError, BrokenPipeError) as exc:
            # A reset is reported once, before the packets still queued to us
            # (the server's disconnect notice among them): read those first.
            try:
                sock.settimeout(0.0)
                self._sock_timeout = 0.0
                size, _ancdata, flags, _addr = sock.recvmsg_into(self._views)
            except OSError:
                size = 0
            if size == 0:
                raise BusClosed(f"the bus closed the connection: {exc}") from exc
        return received(self._view, size, flags)

    def _set_timeout(self, sock: socket.socket, timeout: float | None) -> None:
        if self._sock_timeout != timeout:
            sock.settimeout(timeout)
            self._sock_timeout = timeout

    def _sleep(self, seconds: float) -> None:
        if self.cooperative:
            import gevent

            gevent.sleep(seconds)
        else:
            time.sleep(seconds)

    # --- lifetime ------------------------------------------------------------

    def fileno(self) -> int:
        """The current connection's descriptor, for select/poll (mind ``buffered``;
        it changes when the client connects again)."""
        if self._sock is None:
            raise BusClosed("not connected: the bus is away")
        return self._sock.fileno()

    @property
    def connected(self) -> bool:
        """A connection is up (it may still be in its handshake)."""
        return self._sock is not None

    @property
    def closed(self) -> bool:
        """True after ``close``, or once the client gave up for good."""
        return self._closed

    def close(self) -> None:
        """Close the connection (idempotent); the bus forgets our subscriptions.
        Publishes still buffered are lost, and counted (``stats.unsent``)."""
        if not self._closed:
            if self._sock is not None and self.session.holding:
                with contextlib.suppress(OSError, SbusError):
                    self._release(True)  # connected: the buffered ones go, not lost
            if self._sock is not None:
                drain_and_close(self._sock)
                self._sock = None
            self._give_up()

    def _check_open(self) -> None:
        if self._final is not None:
            raise BusClosed(str(self._final), self._final.reason)
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


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
