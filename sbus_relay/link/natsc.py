"""The nats.c engine of the link: the official C client, through ``link/_natsc.pyx``.

What it owns: one ``_natsc.Client`` and its place in the link's asyncio loop
(the queue's eventfd as a reader; the calls that block, connect, flush and
close, in the loop's executor thread with the GIL released).  What it may
touch: the link's ``Sink``, from the loop's thread only.
"""

from __future__ import annotations

import asyncio

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


class NatsCEngine:
    """The ``Engine`` on nats.c (``engine.Engine`` says what each call does)."""

    name = "nats.c"

    def __init__(self, settings: EngineSettings) -> None:
        from . import _natsc  # type: ignore[attr-defined]

        self.settings = settings
        s = settings
        self._client = _natsc.Client(
            list(s.servers),
            s.name,
            int(RECONNECT_WAIT * 1000),
            int(CONNECT_TIMEOUT * 1000),
            PING_INTERVAL * 1000,
            PINGS,
            PENDING_BYTES,
            user=s.user,
            password=s.password,
            token=s.token,
            creds=s.creds,
            tls=s.tls,
            tls_ca=s.tls_ca,
        )
        self._error = _natsc.NatsError
        self._subs: dict[int, tuple[bytes, bool]] = {}
        self._sink: Sink | None = None
        self._made = False  # the natsConnection exists: subscriptions go to it

    async def start(self, sink: Sink) -> None:
        self._sink = sink
        loop = asyncio.get_running_loop()
        loop.add_reader(self._client.fileno(), self._client.drain, _Netloc(sink))
        # the first attempt blocks up to CONNECT_TIMEOUT: off the loop
        try:
            now = await loop.run_in_executor(None, self._client.connect)
        except self._error as e:  # refused settings (a creds file nats.c cannot read...)
            sink.on_error(str(e))
            return
        self._made = True
        for sid in list(self._subs):
            self._subscribe_now(sid)
        if now:  # (the connected callback is for a connect that succeeds later)
            sink.on_connected(_netloc(self._client.server()), False)
        else:
            sink.on_error("no server answered; trying again every %.2f s" % RECONNECT_WAIT)

    async def publish(self, batch: list[Outgoing]) -> int:
        refused: int = self._client.publish(batch)
        return refused

    async def subscribe(self, sid: int, subject: bytes, bounded: bool) -> None:
        self._subs[sid] = (subject, bounded)
        if self._made:
            self._subscribe_now(sid)

    def _subscribe_now(self, sid: int) -> None:
        subject, bounded = self._subs[sid]
        limits = (SUB_PENDING_MESSAGES, SUB_PENDING_BYTES) if bounded else (-1, -1)
        try:
            self._client.subscribe(sid, subject, *limits)
        except self._error as e:  # refused by nats.c: said, and the pattern stays unserved
            assert self._sink is not None
            self._sink.on_error(f"subscribing {subject.decode('ascii', 'replace')}: {e}")

    async def unsubscribe(self, sid: int) -> None:
        self._subs.pop(sid, None)
        self._client.unsubscribe(sid)

    async def round_trip(self, timeout: float) -> float | None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        ok = await loop.run_in_executor(None, self._client.flush, timeout)
        return loop.time() - start if ok else None

    async def close(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        if timeout > 0:
            await loop.run_in_executor(None, self._client.flush, timeout)
        loop.remove_reader(self._client.fileno())
        await loop.run_in_executor(None, self._client.close)


def _netloc(url: str) -> str:
    """``host:port`` of a server URL, as the link names a server everywhere."""
    return url.partition("://")[2] or url


class _Netloc:
    """The sink, with the server nats.c names by its URL named by ``host:port``."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self.on_disconnected = sink.on_disconnected
        self.on_error = sink.on_error
        self.on_slow_consumer = sink.on_slow_consumer
        self.on_message = sink.on_message

    def on_connected(self, server: str, again: bool) -> None:
        self._sink.on_connected(_netloc(server), again)
