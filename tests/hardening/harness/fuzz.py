"""Live fuzz: hostile clients and well-behaved ones on one real ``sbusd``.

Fuzz children (one process each, several connections each) send packets from
``packets.generate``: mutated SUB/UNSUB/MSG/CMSG, random bytes, over-long and
empty packets, NULs, reserved '!' uses, secret patterns with wrong credentials
and random flood-control modes.  A connection the server closes is replaced.
Meanwhile a well-behaved child runs clients with disjoint exact subscriptions
that publish to each other.  Afterwards the server must be alive, must not
have logged a traceback, every well-behaved client must have received exactly
its messages (no loss, no duplicate, no foreign one, in order per sender), and
a fresh client must still be able to publish and receive.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import time
from collections import Counter
from typing import Any

from .common import Child, Closed, Conn, ServerProc, cleanup_dir, short_dir
from .packets import KINDS, generate

#: Server bugs already reported (tests/hardening/test_server_bugs.py), by a line of
#: their traceback: their hits are counted apart so that a new bug stands out.
KNOWN_SERVER_BUGS = {
    "interest_notice_iteration": "RuntimeError: dictionary changed size during iteration",
}
#: Send buffer for fuzz connections: room for over-long packets (protocol.md limit + slack).
FUZZ_SNDBUF = 1 << 20
#: Seconds a fuzz send may wait for the server to read (backpressure paces the fuzzer).
SEND_PATIENCE = 0.5
#: Chance, per input, that a fuzz connection is dropped without a word.
VANISH_RATE = 0.002
#: Inputs between two drains of a fuzz connection's incoming packets.
DRAIN_EVERY = 16


def _fuzz_child(address: str, seed: int, inputs: int, conns: int) -> dict[str, Any]:
    """Send ``inputs`` hostile packets over ``conns`` connections; count what happened."""
    rng = random.Random(seed)
    own = (os.getgid(), os.getuid(), os.getpid())
    socks: list[socket.socket | None] = [None] * conns
    tried: Counter[str] = Counter()
    outcome: Counter[str] = Counter()

    def drain(sock: socket.socket) -> bool:
        sock.setblocking(False)
        try:
            while True:
                if not sock.recv(1 << 19):
                    return False
                outcome["received"] += 1
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            sock.settimeout(SEND_PATIENCE)

    for n in range(inputs):
        i = rng.randrange(conns)
        sock = socks[i]
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FUZZ_SNDBUF)
            sock.settimeout(5.0)
            if not _connect(sock, address):
                outcome["connect_refused_busy"] += 1
                sock.close()
                continue
            sock.settimeout(SEND_PATIENCE)
            socks[i] = sock
            outcome["connections"] += 1
        kind, packet = generate(rng, own)
        tried[kind] += 1
        try:
            sock.send(packet)
            outcome["sent"] += 1
        except TimeoutError:
            # not read for SEND_PATIENCE: paused by a block mode, or a connection
            # the server no longer serves (see KNOWN_SERVER_BUGS); give up on it
            outcome["send_timed_out"] += 1
            sock.close()
            socks[i] = None
            continue
        except OSError as e:
            outcome["closed_by_server" if e.errno in (errno.EPIPE, errno.ECONNRESET) else
                    "send_error_" + errno.errorcode.get(e.errno or 0, "?")] += 1  # fmt: skip
            sock.close()
            socks[i] = None
            continue
        if n % DRAIN_EVERY == 0:
            for j, other in enumerate(socks):
                if other is not None and not drain(other):
                    other.close()
                    socks[j] = None
                    outcome["closed_by_server"] += 1
        if rng.random() < VANISH_RATE:  # now and then vanish without a word
            sock.close()
            socks[i] = None
            outcome["vanished"] += 1
    for sock in socks:
        if sock is not None:
            sock.close()
    return {"tried": dict(tried), "outcome": dict(outcome)}


def _connect(sock: socket.socket, address: str, patience: float = 30.0) -> bool:
    """Connect, waiting while the listen backlog is full (EAGAIN); False on giving up."""
    deadline = time.monotonic() + patience
    while True:
        try:
            sock.connect(address)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def _good_child(address: str, clients: int, messages: int, nonce: str, pace: float) -> dict:
    """Clients with disjoint subscriptions publishing to each other; what each received."""
    keys = [b"wb/%s/%d" % (nonce.encode(), i) for i in range(clients)]
    conns = [Conn(address, timeout=60.0) for _ in range(clients)]
    for conn, key in zip(conns, keys, strict=True):
        conn.sub(key)
        conn.sync()
    expected: list[list[bytes]] = [[] for _ in range(clients)]
    got: list[list[bytes]] = [[] for _ in range(clients)]

    def drain(i: int, timeout: float = 0.0) -> None:
        conn = conns[i]
        while True:
            try:
                got[i].append(conn.recv(timeout) if timeout else _nowait(conn))
            except (TimeoutError, BlockingIOError):
                return
            timeout = 0.0

    for seq in range(messages):
        for i, conn in enumerate(conns):
            target = (i + 1 + seq % (clients - 1)) % clients
            payload = b"%d:%d" % (i, seq)
            expected[target].append(conn.pub(keys[target], payload))
        for i in range(clients):
            drain(i)
        if pace:
            time.sleep(pace)
    deadline = time.monotonic() + 60.0
    for i in range(clients):
        while len(got[i]) < len(expected[i]) and time.monotonic() < deadline:
            drain(i, 0.5)
    time.sleep(0.3)  # anything extra (a duplicate, a foreign packet) would arrive now
    for i in range(clients):
        drain(i)
    report: dict[str, Any] = {"expected": 0, "received": 0, "missing": 0, "duplicates": 0,
                              "foreign": 0, "out_of_order": 0}  # fmt: skip
    for i in range(clients):
        want, have = expected[i], got[i]
        report["expected"] += len(want)
        report["received"] += len(have)
        counts = Counter(have)
        report["duplicates"] += sum(c - 1 for c in counts.values() if c > 1)
        wanted = set(want)
        report["foreign"] += sum(1 for p in counts if p not in wanted)
        report["missing"] += sum(1 for p in want if p not in counts)
        # per sender, payload sequence numbers must increase
        last: dict[bytes, int] = {}
        for packet in have:
            sender, _, number = packet.rpartition(b"\0")[2].partition(b":")
            n = int(number or b"0")
            if last.get(sender, -1) >= n:
                report["out_of_order"] += 1
            last[sender] = n
    for conn in conns:
        conn.close()
    return report


def _nowait(conn: Conn) -> bytes:
    if conn.pending:
        return conn.pending.popleft()
    conn.sock.setblocking(False)  # a timeout socket would wait despite MSG_DONTWAIT
    try:
        data = conn.sock.recv(1 << 19)
    finally:
        conn.sock.settimeout(conn.timeout)
    if not data:
        raise Closed("EOF")
    return data


def fresh_client_works(address: str) -> bool:
    """A new client can subscribe, publish and receive its own message."""
    with Conn(address, timeout=5.0) as conn:
        conn.sub(b"fresh/check")
        conn.sync()
        packet = conn.pub(b"fresh/check", b"ok")
        return conn.recv() == packet


def run_fuzz(
    *,
    inputs: int = 200_000,
    fuzzers: int = 8,
    conns_per_fuzzer: int = 8,
    good_clients: int = 6,
    good_messages: int = 2000,
    seed: int = 7,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Fuzz a live ``sbusd``; figures and a list of ``failures`` (empty when all held)."""
    workdir = short_dir()
    address = os.path.join(workdir, "bus")
    server = ServerProc(address)
    started = time.monotonic()
    try:
        nonce = "%016x" % random.Random(seed).getrandbits(64)
        good = Child(_good_child, address, good_clients, good_messages, nonce, 0.001)
        per = inputs // fuzzers
        children = [
            Child(_fuzz_child, address, seed * 1000 + k, per, conns_per_fuzzer)
            for k in range(fuzzers)
        ]
        tried: Counter[str] = Counter()
        outcome: Counter[str] = Counter()
        for child in children:
            result = child.result(timeout)
            tried.update(result["tried"])
            outcome.update(result["outcome"])
        good_report = good.result(timeout)
        alive = server.alive()
        fresh = alive and fresh_client_works(address)
        log = server.log_text()
        # a greenlet that died of an exception (gevent's report), or one the
        # server contained by closing that client (client.internal_error)
        crashes = log.count(" failed with ") + log.count("client.internal_error")
        known = {name: log.count(line) for name, line in KNOWN_SERVER_BUGS.items()}
        rss = server.rss_kib() if alive else 0
        fds = server.fd_count() if alive else 0
        stop_status = server.stop() if alive else server.proc.returncode
    finally:
        server.kill()
    failures = []
    if not alive:
        failures.append(f"server died (status {server.proc.returncode})")
    if not fresh:
        failures.append("a fresh client could not pub/sub after the fuzz")
    if crashes > sum(known.values()) or ("Traceback" in log and not crashes):
        first = log.index("Traceback")
        failures.append(f"new crash in {server.log_path}: {log[first : first + 1500]}")
    if stop_status != 0:
        failures.append(f"server exited {stop_status} on SIGINT")
    for what in ("missing", "duplicates", "foreign", "out_of_order"):
        if good_report[what]:
            failures.append(f"well-behaved clients: {good_report[what]} {what}")
    if not failures and not any(known.values()):  # keep the log of a failed run
        cleanup_dir(workdir)
    return {
        "seed": seed,
        "inputs_tried": sum(tried.values()),
        "inputs_delivered": outcome.get("sent", 0),
        "inputs_by_kind": {k: tried.get(k, 0) for k in KINDS},
        "outcome": dict(outcome),
        "fuzz_clients": fuzzers * conns_per_fuzzer,
        "well_behaved": good_report,
        "server_alive": alive,
        "greenlet_crashes": crashes,
        "known_bug_hits": known,
        "server_rss_kib_after": rss,
        "server_fds_after": fds,
        "seconds": round(time.monotonic() - started, 1),
        "failures": failures,
    }
