"""The recorder: a bus client that writes what it receives into capture files.

One blocking loop owns one ``Client`` and one ``RotatingCaptureWriter``: receive
with a short timeout, append, and on each timeout rotate an old file and look at
the stop flag.  Memory is bounded by the writer's row group; the server queues
for us (SPEC §4: soft/queue, then hard/discard past 16 MiB) if we fall behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sbus_relay.client import Client
from sbus_relay.ops.addresses import Address

from .capture import RotatingCaptureWriter, decode_key

if TYPE_CHECKING:
    import threading

#: Receive timeout, seconds: how soon a stop request or a due rotation is seen.
TICK_SECONDS = 0.25
#: Seconds to wait for the whoami reply that proves our SUBs are in place.
READY_TIMEOUT = 5.0
#: On stop, keep recording until the bus is quiet this long (seconds): messages
#: already on their way to us when the signal came are not lost.
DRAIN_QUIET = 0.1
#: ... but drain for no longer than this (seconds): a busy bus never goes quiet.
DRAIN_MAX = 2.0
#: Seconds between progress callbacks (the terminal progress line).
PROGRESS_INTERVAL = 0.5


@dataclass
class RecorderStatus:
    """Live numbers for the progress line."""

    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    control_messages: int = 0


class Recorder:
    """Subscribe to ``patterns`` on the bus at ``address`` and feed ``writer``."""

    def __init__(
        self,
        address: str | Address,
        patterns: Sequence[str | bytes],
        writer: RotatingCaptureWriter,
    ) -> None:
        self.address = address
        self.patterns = list(patterns)
        self.writer = writer
        self.status = RecorderStatus()

    def run(
        self,
        stop: threading.Event | Callable[[], bool],
        *,
        progress: Callable[[Recorder], None] | None = None,
        on_ready: Callable[[], None] | None = None,
        max_messages: int | None = None,
        deadline: float | None = None,
    ) -> None:
        """Record until ``stop`` is set, ``max_messages`` are written, the monotonic
        ``deadline`` passes, or the bus closes (``BusClosed`` propagates).

        ``on_ready`` is called once the subscriptions are in place.

        The open file is always finished (renamed to ``*.parquet``) on the way out.
        """
        should_stop = stop.is_set if hasattr(stop, "is_set") else stop
        writer = self.writer
        next_progress = 0.0
        try:
            with Client(self.address) as client:
                for pattern in self.patterns:
                    client.subscribe(pattern)
                # The server handles one client's packets in order: the whoami
                # reply means every SUB above is in place.  A relay whose upstream
                # is away answers late (SPEC §6); record anyway.
                with contextlib.suppress(TimeoutError):
                    client.whoami(timeout=READY_TIMEOUT)
                self.status.ready = True
                if on_ready is not None:
                    on_ready()
                while not should_stop():
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        break
                    if progress is not None and now >= next_progress:
                        progress(self)
                        next_progress = now + PROGRESS_INTERVAL
                    try:
                        message = client.receive(TICK_SECONDS)
                    except TimeoutError:
                        writer.tick()
                        continue
                    if message.control:
                        self.status.control_messages += 1
                        continue
                    writer.append(time.time_ns(), decode_key(message.key), message.payload)
                    if max_messages is not None and writer.stats.messages >= max_messages:
                        break
                else:
                    self._drain(client)
        finally:
            writer.close()
            if progress is not None:
                progress(self)

    def _drain(self, client: Client) -> None:
        """After a stop request: record what is already in flight, briefly."""
        end = time.monotonic() + DRAIN_MAX
        while time.monotonic() < end:
            try:
                message = client.receive(DRAIN_QUIET)
            except TimeoutError:
                return
            if not message.control:
                self.writer.append(time.time_ns(), decode_key(message.key), message.payload)
