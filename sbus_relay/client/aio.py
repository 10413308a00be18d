"""The asyncio client: ``AsyncClient``, over the protocol core (``session.py``).

What it owns: the asyncio face's I/O: its socket, its loop's reader and
writer, its futures and its reconnect task.  What it may touch: its Session
and its bookkeeping (client.session), client.sockets.

Native asyncio, no thread: the connection's socket is non-blocking and
watched with ``loop.add_reader``; what arrives is read in bursts, taken in by
the session, and queued for ``receive``/``messages`` (bounded: past
``CLIENT_PENDING_MESSAGES`` the client stops reading, the kernel's buffer
fills, and the bus's flood control for this client applies, as for any slow
subscriber).  Publishes queue in the session and are sent at the next turn of
the loop or as soon as a packed batch's worth is waiting, so that publishes
made together go together (packed, once the bus agreed to batches).  A lost
connection is taken up by a reconnect task with capped back-off; calls made
meanwhile are buffered (publishes) or wait (whoami, request, receive).

Names, arguments and errors are the blocking ``Client``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from types import TracebackType

from sbus_relay.ops.addresses import Address, connect, parse_address
from sbus_relay.protocol.errors import AddressError, BusClosed, PeerError, UsageError
from sbus_relay.protocol.limits import (
    BATCH_MESSAGES,
    CLIENT_BUFFER_BYTES,
    CLIENT_BUFFER_MESSAGES,
    CLIENT_PENDING_MESSAGES,
    CLIENT_READ_BATCH,
    CLIENT_RECONNECT_MIN,
    CLIENT_RESUBSCRIBE_GRACE,
    MAX_PACKET,
)

from .session import (
    FINAL_REASONS,
    Backoff,
    Callbacks,
    Data,
    Disconnected,
    Event,
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

#: Packets waiting for the socket past which ``publish`` waits for it to
#: take them (the writer's high-water mark); resumed below half of it.
WRITE_QUEUE_HIGH = 4 * BATCH_MESSAGES

#: Seconds ``close`` gives what is queued to reach the socket.
CLOSE_FLUSH = 1.0


class AsyncClient(Callbacks):
    """A connection to a bus for asyncio programs (``async with AsyncClient(address)``).

    The arguments are the blocking ``Client``'s; ``timeout`` applies to
    ``receive``, ``whoami`` and ``request`` unless they are given their own.
    """

    def __init__(
        self,
        address: str | Address,
        *,
        timeout: float | None = None,
        reconnect: bool = True,
        batch: bool = False,
        buffer_messages: int = CLIENT_BUFFER_MESSAGES,
        buffer_bytes: int = CLIENT_BUFFER_BYTES,
        on_disconnected: Disconnected | None = None,
        on_reconnected: Reconnected | None = None,
    ) -> None:
        self.address = parse_address(address) if isinstance(address, str) else address
        self.timeout = timeout
        self.reconnect = reconnect and self.address.kind != "fd"
        self.outages = Outages(on_disconnected, on_reconnected)
        self.session = Session(
            batch=batch, buffer_messages=buffer_messages, buffer_bytes=buffer_bytes
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._buffer = bytearray(MAX_PACKET + 1)
        self._view = memoryview(self._buffer)
        self._messages: deque[Message] = deque()
        self._arrived = asyncio.Event()
        self._whoamis: deque[asyncio.Future[bytes]] = deque()
        self._requests: dict[bytes, asyncio.Future[Message]] = {}
        self._writes: deque[bytes] = deque()
        self._drained: asyncio.Future[None] | None = None
        self._flush_soon = False
        self._reading = False
        self._reconnector: asyncio.Task[None] | None = None
        self._closed = False
        self._final: BusClosed | None = None
        self._request_keys = Requests()

    # --- lifetime ------------------------------------------------------------

    async def connect(self) -> None:
        """Connect (the first time; later ones are the client's own business)."""
        if self._loop is not None:
            raise UsageError("connect() once; the client reconnects by itself")
        self._loop = asyncio.get_running_loop()
        self._attach(connect(self.address))

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Send what is queued (briefly), then close; buffered publishes still
        waiting for the bus are lost and counted (``stats.unsent``)."""
        if self._closed:
            return
        if self._sock is not None and (
            self._writes or self.session.pending_output or self.session.holding
        ):
            with contextlib.suppress(TimeoutError, BusClosed):
                await self.flush(CLOSE_FLUSH)
        self._shut(None)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def buffered(self) -> int:
        """Messages received and waiting for ``receive``."""
        return len(self._messages)

    @property
    def stats(self) -> ClientStats:
        return ClientStats.of(self.session, self.outages.history)

    # --- sending -------------------------------------------------------------

    async def subscribe(self, pattern: Data) -> None:
        """``SUB pattern``, held across reconnects."""
        self._check_open()
        self.session.subscribe(pattern)
        self._flush()

    async def unsubscribe(self, pattern: Data) -> None:
        """``UNSUB pattern``: one hold of it."""
        self._check_open()
        self.session.unsubscribe(pattern)
        self._flush()

    async def publish(self, key: Data, payload: Data = b"") -> None:
        """``MSG key\\0payload``: sent with the others of this turn of the loop;
        buffered while the bus is away (``BufferFull`` when full)."""
        self._check_open()
        session = self.session
        session.publish(key, payload)
        if session.pending_output >= BATCH_MESSAGES:
            self._flush()
        elif not self._flush_soon and session.state is not State.DISCONNECTED:
            self._flush_soon = True
            self._get_loop().call_soon(self._flush)
        if len(self._writes) >= WRITE_QUEUE_HIGH:
            await self._drain(WRITE_QUEUE_HIGH // 2)

    async def publish_many(self, items: Iterable[tuple[Data, Data]]) -> int:
        """Several ``(key, payload)`` at once, packed where the bus agreed; how many."""
        self._check_open()
        count = self.session.publish_many(items)
        self._flush()
        if len(self._writes) >= WRITE_QUEUE_HIGH:
            await self._drain(WRITE_QUEUE_HIGH // 2)
        return count

    async def flush(self, timeout: float | None = None) -> None:
        """Wait (within ``timeout``) until the bus is there and has been handed
        every publish, the buffered ones too; ``TimeoutError`` if it is still away."""
        self._check_open()
        limit = self.timeout if timeout is None else timeout
        async with asyncio.timeout(limit):
            await self._connected(None)
            self._release()
            self._flush()
            await self._drain(0)

    async def control(self, key: Data, payload: Data | None = None) -> None:
        """``CMSG key[\\0payload]`` to the bus, on this connection (waiting, within
        the client's timeout, for one while the bus is away)."""
        self._check_open()
        await self._connected(self.timeout)
        self.session.control(key, payload)
        self._flush()

    async def echo(self, on: bool) -> None:
        """Receive (or not) our own publishes (docs/protocol.md, Echo)."""
        self._check_open()
        self.session.set_echo(on)
        self._flush()

    async def flood(self, mode: str) -> None:
        """A flood-control mode, e.g. ``"blocking/soft/discard"``."""
        self._check_open()
        self.session.set_flood(mode)
        self._flush()

    async def _connected(self, timeout: float | None) -> None:
        """Wait until a connection is up (the reconnect task makes it)."""
        async with asyncio.timeout(timeout):
            while self._sock is None:
                self._check_open()
                await asyncio.sleep(CLIENT_RECONNECT_MIN)

    # --- receiving -----------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; raises ``TimeoutError`` or ``BusClosed``."""
        messages = self._messages
        if messages and self._reading:  # the common case, without a timer
            return messages.popleft()
        limit = self.timeout if timeout is None else timeout
        async with asyncio.timeout(limit):
            while not self._messages:
                self._check_open()
                self._arrived.clear()
                await self._arrived.wait()
        message = self._messages.popleft()
        if not self._reading and len(self._messages) < CLIENT_PENDING_MESSAGES // 2:
            self._read_again()
        return message

    async def messages(self, timeout: float | None = None) -> AsyncIterator[Message]:
        """Messages until the client closes for good (``TimeoutError`` propagates)."""
        while True:
            try:
                yield await self.receive(timeout)
            except BusClosed:
                return
            except UsageError:
                if self._closed:
                    return
                raise

    async def whoami(self, timeout: float | None = None) -> str:
        """Our credentials as the bus sees them, e.g. ``"!/cred/100/1000/1111"``."""
        self._check_open()
        future: asyncio.Future[bytes] = self._get_loop().create_future()
        self._whoamis.append(future)
        self.session.ask_whoami()
        self._flush()
        limit = self.timeout if timeout is None else timeout
        try:
            identity = await asyncio.wait_for(asyncio.shield(future), limit)
        except TimeoutError:
            # still answered later, in order: the future stays in line, unread
            raise
        return identity.decode("utf-8", "surrogateescape")

    async def request(
        self, key: Data, payload: Data = b"", timeout: float | None = None
    ) -> Message:
        """Publish a request to ``key``; its reply comes to our own secret inbox."""
        self._check_open()
        limit = self.timeout if timeout is None else timeout
        async with asyncio.timeout(limit):
            reply_to, request = self._request_keys.new(await self._inbox(), payload)
            future: asyncio.Future[Message] = self._get_loop().create_future()
            self._requests[reply_to] = future
            try:
                await self.publish(key, request)
                return await future
            finally:
                self._requests.pop(reply_to, None)

    async def reply(self, request: Message, payload: Data = b"") -> None:
        """Answer a request received with ``receive`` or ``messages``."""
        await self.publish(Requests.reply_key(request), payload)

    # --- inside: reading ---------------------------------------------------------

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise UsageError("not connected: use 'async with AsyncClient(...)' or connect()")
        return self._loop

    async def _inbox(self) -> bytes:
        session = self.session
        if session.identity is None:
            await self.whoami(None)
        inbox = session.inbox()
        if inbox not in session.patterns:
            session.subscribe(inbox)
            await self.whoami(None)  # the answer means the SUB is in place
            inbox = session.inbox()
        return inbox

    def _readable(self, flush: bool = True) -> None:
        sock = self._sock
        if sock is None:
            return
        session = self.session
        view = self._view
        views = [view]
        try:
            for _ in range(CLIENT_READ_BATCH):
                try:
                    size, _anc, flags, _addr = sock.recvmsg_into(views)
                except BlockingIOError:
                    break
                packet = received(view, size, flags)
                messages = session.messages(packet)
                if messages is not None and not self._requests:
                    self._messages.extend(messages)  # the common case
                else:
                    self._take(session.receive(packet) if messages is None else messages)
                    if self._sock is not sock:
                        return  # lost or closed while taking what it meant
                if len(self._messages) >= CLIENT_PENDING_MESSAGES:
                    self._stop_reading()
                    break
        except (ConnectionResetError, BrokenPipeError) as exc:
            self._lost(BusClosed(f"the bus closed the connection: {exc}"))
        except BusClosed as exc:
            self._lost(exc)
        except PeerError as exc:
            self._lost(BusClosed(f"the bus broke the protocol: {exc}", exc.reason), final=True)
        if self._messages:
            self._arrived.set()
        if flush:
            self._flush()

    def _take(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, Message):
                future = self._requests.get(event.key) if self._requests else None
                if future is not None and not future.done():
                    future.set_result(event)
                else:
                    self._messages.append(event)
            elif isinstance(event, WhoamiReply):
                while self._whoamis:
                    waiter = self._whoamis.popleft()
                    if not waiter.done():
                        waiter.set_result(event.identity)
                        break
            elif isinstance(event, Ready):
                self.outages.ready(event, time.monotonic())
            else:
                self._lost(event.error(), final=event.final)

    def _stop_reading(self) -> None:
        if self._reading and self._sock is not None:
            self._get_loop().remove_reader(self._sock.fileno())
        self._reading = False

    def _read_again(self) -> None:
        if not self._reading and self._sock is not None:
            self._get_loop().add_reader(self._sock.fileno(), self._readable)
            self._reading = True

    # --- inside: writing ---------------------------------------------------------

    def _flush(self) -> None:
        self._flush_soon = False
        if self._sock is None:
            return
        packets = self.session.outgoing()
        if packets:
            self._writes.extend(packets)
        self._write()

    def _write(self) -> None:
        sock = self._sock
        writes = self._writes
        if sock is None:
            return
        try:
            while writes:
                sock.send(writes[0])
                writes.popleft()
        except BlockingIOError:
            self._get_loop().add_writer(sock.fileno(), self._writable)
            return
        except OSError as exc:
            # the bus's notice of why may be waiting behind what it sent us
            self._readable(flush=False)
            self._lost(BusClosed(f"the bus closed the connection: {exc}"))
            return
        self._wake_drain()

    def _writable(self) -> None:
        if self._sock is not None:
            self._get_loop().remove_writer(self._sock.fileno())
        self._write()
        self._wake_drain()

    def _wake_drain(self) -> None:
        drained = self._drained
        if drained is not None and not drained.done() and len(self._writes) <= self._drain_to:
            drained.set_result(None)

    async def _drain(self, to: int) -> None:
        while len(self._writes) > to and self._sock is not None:
            self._drain_to = to
            if self._drained is None or self._drained.done():
                self._drained = self._get_loop().create_future()
            await asyncio.shield(self._drained)
            self._check_open()

    _drain_to = 0

    # --- inside: connections -----------------------------------------------------

    def _attach(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        ready = self.session.connection_made()
        if self.session.holding:
            self._get_loop().call_later(CLIENT_RESUBSCRIBE_GRACE, self._release, sock)
        self._reading = False
        self._read_again()
        self._flush()
        if ready is not None:
            self.outages.ready(ready, time.monotonic())

    def _release(self, sock: socket.socket | None = None) -> None:
        """Send what was buffered while away (its grace is over, or a flush or a
        close wants it now); not for a connection that is gone since."""
        if self.session.holding and (sock is None or sock is self._sock):
            self.session.release()
            self._flush()

    def _detach(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        loop = self._get_loop()
        if self._reading:
            loop.remove_reader(sock.fileno())
        loop.remove_writer(sock.fileno())
        self._reading = False
        drain_and_close(sock)
        self.session.put_back(list(self._writes))
        self._writes.clear()
        self.session.connection_lost()

    def _lost(self, exc: BusClosed, final: bool = False) -> None:
        if self._sock is None:
            return
        final = final or exc.reason in FINAL_REASONS
        self._detach()
        if final or not self.reconnect:
            self._shut(exc)
            return
        self.outages.lost(exc.reason, time.monotonic())
        self._wake_drain_all()
        self._reconnector = self._get_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        backoff = Backoff()
        while not self._closed and self._sock is None:
            try:
                sock = connect(self.address)
            except AddressError:
                await asyncio.sleep(backoff.failed(time.monotonic()))
                continue
            self._attach(sock)

    def _wake_drain_all(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _shut(self, why: BusClosed | None) -> None:
        """Close for good: wake everyone who waits, with ``why`` (or closed)."""
        if self._closed:
            return
        self._detach()
        self._closed = True
        self._final = why
        self.session.give_up()
        if self._reconnector is not None and self._reconnector is not asyncio.current_task():
            self._reconnector.cancel()
        error = why or BusClosed("the client is closed")
        waiters: list[asyncio.Future[bytes] | asyncio.Future[Message]]
        waiters = [*self._whoamis, *self._requests.values()]
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(BusClosed(str(error), error.reason))
                waiter.exception()  # retrieved: no "never retrieved" warning
        self._whoamis.clear()
        self._wake_drain_all()
        self._arrived.set()

    def _check_open(self) -> None:
        if self._final is not None:
            raise BusClosed(str(self._final), self._final.reason)
        if self._closed:
            raise UsageError("the client is closed")
