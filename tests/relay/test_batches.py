"""A relay sends packed batches up only to an upstream that said it reads them.

The upstream here is this test: a bare listening socket that speaks the
protocol by hand, once as one of our buses (it answers ``CMSG batch/on``) and
once as a server that does not know the extension (the reference ``sbusd``
ignores it): the relay's publishes arrive packed, or one packet each.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbus_relay.protocol.codec import BATCH_HEAD
from tests.server.rawclient import RawClient
from tests.support import start_bus

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def upstream() -> Iterator[tuple[str, socket.socket]]:
    folder = tempfile.mkdtemp()
    path = folder + "/up"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(4)
    listener.settimeout(10)
    yield path, listener
    listener.close()
    shutil.rmtree(folder, ignore_errors=True)


def handshake(conn: socket.socket, *, packs: bool) -> list[bytes]:
    """Read the relay's hello, answer as an upstream would; the hello's packets."""
    hello = [conn.recv(65536) for _ in range(5)]
    if packs:
        conn.send(b"CMSG batch/on\0")
    conn.send(b"CMSG !/cred/whoami\0!/cred/0/0/1")
    conn.send(b"CMSG interest/add\0up/")
    conn.send(b"CMSG interest/ready\0")
    return hello


def received(conn: socket.socket, count: int) -> tuple[list[bytes], int]:
    """The MSG packets that came up (unpacked) and how many frames were packed."""
    got: list[bytes] = []
    frames = 0
    while len(got) < count:
        packet = conn.recv(409_601)
        if packet.startswith(BATCH_HEAD):
            frames += 1
            offset = len(BATCH_HEAD)
            while offset < len(packet):
                size = int.from_bytes(packet[offset : offset + 4], "big")
                got.append(packet[offset + 4 : offset + 4 + size])
                offset += 4 + size
        elif packet.startswith(b"MSG "):
            got.append(packet)
    return got, frames


@pytest.mark.parametrize("packs", [True, False], ids=["upstream-packs", "upstream-does-not"])
def test_publishes_go_up_packed_only_when_the_upstream_reads_batches(
    tmp_path: Path, upstream: tuple[str, socket.socket], packs: bool
) -> None:
    path, listener = upstream
    relay = start_bus(tmp_path, "--upstream", path, command="serve")
    try:
        conn, _ = listener.accept()
        conn.settimeout(10)
        hello = handshake(conn, packs=packs)
        assert b"CMSG batch/on" in hello
        deadline = time.monotonic() + 10
        while "upstream.interest_ready" not in relay.stderr_text():
            assert time.monotonic() < deadline, relay.stderr_text()
            time.sleep(0.02)
        pub = RawClient(relay.address)
        messages = [b"MSG up/%d\0x" % i for i in range(2000)]
        for packet in messages:
            pub.send(packet)
        got, frames = received(conn, len(messages))
        assert got == messages
        if packs:
            assert frames > 0
        else:
            assert frames == 0
        pub.close()
        conn.close()
    finally:
        relay.stop()
