"""The nats-py engine of the link: the fallback where nats.c was not built.

What it owns: one nats-py ``Client`` and its asyncio tasks, connecting with
back-off while no server answers.  What it may touch: the link's ``Sink``
(on the loop's thread: nats-py runs there), and nats-py's private parts only
through ``natspy_private``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import Any

from sbus_relay.protocol.natsenvelope import HEADER

from . import natspy_private
from .engine import (
    CONNECT_TIMEOUT,
    PENDING_BYTES,
    PING_INTERVAL,
    PINGS,
    RECONNECT_WAIT,
    SUB_PENDING_BYTES,
    SUB_PENDING_MESSAGES,
    EngineSettings,
    Outgoing,
    Sink,
)

#: The cap of the back-off while no server at all can be reached at start.
CONNECT_BACKOFF_MAX = 2.0


class NatsPyEngine:
    """The ``Engine`` on nats-py (``engine.Engine`` says what each call does)."""

    name = "nats-py"

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._nc: Any = None
        self._sink: Sink | None = None
        self._subs: dict[int, tuple[bytes, bool]] = {}  # sid -> (subject, bounded)
        self._live: dict[int, Any] = {}  # sid -> nats-py Subscription
        self._connecting: asyncio.Task[None] | None = None
        self._closing = False
        self._failures = 0

    def _options(self) -> dict[str, Any]:
        c = self.settings
        options: dict[str, Any] = {
            "servers": list(c.servers),
            "name": c.name,
            "no_echo": True,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": RECONNECT_WAIT,
            "connect_timeout": CONNECT_TIMEOUT,
            "ping_interval": PING_INTERVAL,
            "max_outstanding_pings": PINGS,
            "pending_size": PENDING_BYTES,
            "skip_subject_validation": True,
            "dont_randomize": c.ordered,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
        }
        if c.user is not None:
            options["user"], options["password"] = c.user, c.password
        if c.token is not None:
            options["token"] = c.token
        if c.creds is not None:
            options["user_credentials"] = c.creds
        if c.nkey is not None:
            options["nkeys_seed"] = c.nkey
        if c.tls:
            options["tls"] = ssl.create_default_context(cafile=c.tls_ca)
        return options

    async def start(self, sink: Sink) -> None:
        self._sink = sink
        self._connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        import nats  # here: a link on nats.c never imports it
        import nats.errors

        assert self._sink is not None
        delay = RECONNECT_WAIT
        while not self._closing:
            try:
                self._nc = await nats.connect(**self._options())
            except (TimeoutError, OSError, nats.errors.Error) as e:
                self._sink.on_error(f"connect failed: {str(e) or type(e).__name__}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, CONNECT_BACKOFF_MAX)
                continue
            await self._joined(again=False)
            return

    async def _joined(self, *, again: bool) -> None:
        nc = self._nc
        assert self._sink is not None
        for sid in [s for s in self._subs if s not in self._live]:
            await self._subscribe_now(sid)
        server = str(nc.connected_url.netloc) if nc.connected_url else ""
        self._sink.on_connected(server, again)

    async def _on_reconnected(self) -> None:
        await self._joined(again=True)

    async def _on_disconnected(self) -> None:
        if self._sink is not None and not self._closing:
            self._sink.on_disconnected()

    async def _on_error(self, e: Exception) -> None:
        import nats.errors

        assert self._sink is not None
        if isinstance(e, nats.errors.SlowConsumerError):
            self._sink.on_slow_consumer(1)
        else:
            self._sink.on_error(str(e) or type(e).__name__)

    async def publish(self, batch: list[Outgoing]) -> int:
        import nats.errors

        nc = self._nc
        if nc is None:
            return len(batch)
        refused = 0
        for subject, envelope, payload in batch:
            try:
                headers = None if envelope is None else {HEADER: envelope}
                await nc.publish(subject.decode("ascii"), payload, headers=headers)
            except (nats.errors.Error, OSError, UnicodeDecodeError):
                refused += 1  # its reconnect buffer full, a payload too large, closed
        return refused

    async def subscribe(self, sid: int, subject: bytes, bounded: bool) -> None:
        self._subs[sid] = (subject, bounded)
        if self._nc is not None and self._nc.is_connected:
            await self._subscribe_now(sid)

    async def _subscribe_now(self, sid: int) -> None:
        import nats.errors

        subject, bounded = self._subs[sid]
        limits: dict[str, int] = (
            {"pending_msgs_limit": SUB_PENDING_MESSAGES, "pending_bytes_limit": SUB_PENDING_BYTES}
            if bounded
            else {"pending_msgs_limit": -1, "pending_bytes_limit": -1}
        )
        # (not connected now: subscribed again on joining)
        with contextlib.suppress(nats.errors.Error, OSError):
            self._live[sid] = await self._nc.subscribe(
                subject.decode("ascii"), cb=self._receiver(sid), **limits
            )

    async def unsubscribe(self, sid: int) -> None:
        import nats.errors

        self._subs.pop(sid, None)
        sub = self._live.pop(sid, None)
        if sub is not None:
            # (a connection that is away: the server forgot it with it)
            with contextlib.suppress(nats.errors.Error, OSError):
                await sub.unsubscribe()

    def _receiver(self, sid: int) -> Any:
        sink = self._sink
        assert sink is not None

        async def receive(msg: Any) -> None:
            headers = msg.headers
            envelope = headers.get(HEADER) if headers else None
            sink.on_message(sid, msg.subject.encode("utf-8", "replace"), envelope, msg.data)

        return receive

    async def round_trip(self, timeout: float) -> float | None:
        import nats.errors

        nc = self._nc
        if nc is None or not nc.is_connected:
            return None
        try:
            await natspy_private.write_held(nc, timeout)
            if not nc.is_connected:
                return None  # what it holds goes to the next server: not confirmed here
            start = time.monotonic()
            await nc.flush(timeout=timeout)
        except (TimeoutError, nats.errors.Error, OSError):
            return None
        return time.monotonic() - start

    async def close(self, timeout: float) -> None:
        import nats.errors

        self._closing = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        nc = self._nc
        if nc is None:
            return
        try:
            if nc.is_connected:
                await natspy_private.write_held(nc, timeout)
                await nc.flush(timeout=timeout)
        except (TimeoutError, nats.errors.Error, OSError):
            pass  # the goodbye may be lost: the others forget this host 6 s later
        with contextlib.suppress(nats.errors.Error, OSError):
            await nc.close()
