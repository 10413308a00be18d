"""Load: many concurrent clients on one ``sbusd``, each checked message by message.

Every client subscribes to its own key and to one shared key, publishes one
message to its neighbour's key, and a separate publisher sends ``shared``
messages to the shared key.  Each client must receive exactly its neighbour's
message and every shared one, once each and in order; the server's fd count
must return to its baseline once they have all left.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from typing import Any

from .common import Conn, ServerProc, cleanup_dir, raise_nofile, short_dir

#: Seconds the whole exchange may take before the run fails.
LOAD_TIMEOUT = 120.0


def run_load(*, clients: int = 1000, shared: int = 20) -> dict[str, Any]:
    """``clients`` concurrent clients; figures and ``failures``."""
    raise_nofile(2 * clients + 256)
    workdir = short_dir()
    server = ServerProc(os.path.join(workdir, "bus"))
    failures: list[str] = []
    socks: list[socket.socket] = []
    t0 = time.monotonic()
    try:
        baseline_fds = server.settled_fd_count()
        baseline_rss = server.rss_kib()
        for _ in range(clients):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.settimeout(30.0)
            _connect(sock, server.address)
            socks.append(sock)
        connected = time.monotonic()
        for i, sock in enumerate(socks):
            sock.send(b"SUB ld/%d" % i)
            sock.send(b"SUB ld/all")
        for sock in socks:  # a whoami answer proves both SUBs took effect
            sock.send(b"CMSG !/cred/whoami")
        pending: dict[int, list[bytes]] = {i: [] for i in range(clients)}
        _collect(socks, pending, lambda i, got: any(p.startswith(b"CMSG ") for p in got))
        for got in pending.values():
            got.clear()
        subscribed = time.monotonic()
        for i, sock in enumerate(socks):
            sock.send(b"MSG ld/%d\0from %d" % ((i + 1) % clients, i))
        with Conn(server.address) as publisher:
            for n in range(shared):
                publisher.pub(b"ld/all", b"shared %d" % n)
            expected_each = 1 + shared
            _collect(socks, pending, lambda i, got: len(got) >= expected_each)
            time.sleep(0.3)  # duplicates or strays would arrive now
            _collect(socks, pending, lambda i, got: True, quiet=0.5)
        delivered = time.monotonic()
        peak_rss = server.rss_kib()
        wrong = 0
        for i, got in pending.items():
            want = [b"MSG ld/%d\0from %d" % (i, (i - 1) % clients)]
            want += [b"MSG ld/all\0shared %d" % n for n in range(shared)]
            mine = [p for p in got if p.startswith(b"MSG ld/%d\0" % i)]
            rest = [p for p in got if not p.startswith(b"MSG ld/%d\0" % i)]
            if mine != want[:1] or rest != want[1:]:
                wrong += 1
                if wrong <= 3:
                    failures.append(f"client {i}: got {got[:3]}... ({len(got)} packets)")
        if wrong:
            failures.append(f"{wrong} of {clients} clients did not get exactly their messages")
        for sock in socks:
            sock.close()
        socks = []
        deadline = time.monotonic() + 10
        while server.fd_count() != baseline_fds and time.monotonic() < deadline:
            time.sleep(0.05)
        after_fds = server.fd_count()
        if after_fds != baseline_fds:
            failures.append(f"server fds {baseline_fds} before, {after_fds} after")
        if not server.alive():
            failures.append("the server died")
        if "Traceback" in server.log_text():
            failures.append("traceback in the server log")
        after_rss = server.rss_kib()
    finally:
        for sock in socks:
            sock.close()
        server.kill()
    if not failures:
        cleanup_dir(workdir)
    messages = clients * (1 + shared)
    return {
        "clients": clients,
        "messages_checked": messages,
        "connect_s": round(connected - t0, 2),
        "subscribe_s": round(subscribed - connected, 2),
        "deliver_s": round(delivered - subscribed - 0.3, 2),
        "server_rss_kib": {"baseline": baseline_rss, "peak": peak_rss, "after": after_rss},
        "server_fds": {"baseline": baseline_fds, "after": after_fds},
        "failures": failures,
    }


def _connect(sock: socket.socket, address: str) -> None:
    """Connect, waiting while the listen backlog is full (EAGAIN)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            sock.connect(address)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _collect(socks: list[socket.socket], got: dict[int, list[bytes]], done: Any,
             quiet: float | None = None) -> None:  # fmt: skip
    """Read from every socket until ``done(i, packets)`` holds for all (or the timeout)."""
    selector = selectors.DefaultSelector()
    waiting = set()
    for i, sock in enumerate(socks):
        sock.setblocking(False)
        if not done(i, got[i]) or quiet is not None:
            selector.register(sock, selectors.EVENT_READ, i)
            waiting.add(i)
    deadline = time.monotonic() + (LOAD_TIMEOUT if quiet is None else quiet)
    try:
        while waiting and time.monotonic() < deadline:
            events = selector.select(0.05 if quiet is not None else 1.0)
            if not events and quiet is not None:
                return
            for key, _ in events:
                i = key.data
                sock = socks[i]
                try:
                    while True:
                        packet = sock.recv(1 << 19)
                        if not packet:
                            raise AssertionError(f"the server closed client {i}")
                        got[i].append(packet)
                except BlockingIOError:
                    pass
                if quiet is None and done(i, got[i]):
                    selector.unregister(sock)
                    waiting.discard(i)
    finally:
        selector.close()
        for sock in socks:
            sock.settimeout(30.0)
