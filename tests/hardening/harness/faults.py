"""Faults: the master SIGKILLed under load, relays killed, clients vanishing, no fds left.

What the protocol can promise here (docs/protocol.md):
a relay queues upward messages while its upstream is away (bounded, drops
counted) and sends them in order after reconnecting.  What it cannot promise:
packets already inside the dead master (its socket buffers and queues) are
gone, and the relay has no ack to know which.  ``master_kills`` measures both and
checks the bound that holds: no duplicates, order preserved, and every missing
message published in a window around a kill (from shortly before the kill until
the subscriber received again).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import threading
import time
from typing import Any

from .common import (
    WHOAMI,
    Child,
    Closed,
    Conn,
    ServerProc,
    cleanup_dir,
    connect_retry,
    raise_nofile,
    short_dir,
)

#: Seconds before a kill in which a published message may still be lost in flight
#: (inside the relay->master socket or the master's queues when it died).
IN_FLIGHT_WINDOW = 0.5


# --- the master SIGKILLed under load -----------------------------------------------------


def _publisher(address: str, rate: float, duration: float) -> list[float]:
    """Publish ``up/<seq>`` at ``rate`` per second through the relay; publish times."""
    times: list[float] = []
    with Conn(address, timeout=30.0) as conn:
        start = time.monotonic()
        seq = 0
        while True:
            now = time.monotonic()
            if now - start >= duration:
                break
            due = int((now - start) * rate) + 1
            while seq < due:
                times.append(time.monotonic())
                conn.pub(b"up/%d" % seq, b"%d" % seq)
                seq += 1
            time.sleep(0.001)
    return times


class _Counter(threading.Thread):
    """The master-side subscriber: reconnects after every kill, records what arrives."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.received: list[int] = []
        self.arrivals: list[float] = []
        #: per arrival, the time its connection subscribed (tells old master from new)
        self.epochs: list[float] = []
        self.stopping = False
        self.error: str | None = None

    def run(self) -> None:
        try:
            while not self.stopping:
                try:
                    conn = connect_retry(self.address, timeout=30.0)
                    conn.sub(b"up/")
                    epoch = time.monotonic()
                except (OSError, Closed):
                    time.sleep(0.005)
                    continue
                try:
                    while not self.stopping:
                        try:
                            packet = conn.recv(0.2)
                        except TimeoutError:
                            continue
                        if packet.startswith(b"MSG up/"):
                            self.received.append(int(packet[7 : packet.index(b"\0")]))
                            self.arrivals.append(time.monotonic())
                            self.epochs.append(epoch)
                except (Closed, OSError):
                    pass
                finally:
                    conn.close()
        except BaseException as e:  # reported by the caller
            self.error = repr(e)


def master_kills(
    *,
    kills: int = 20,
    interval: float = 1.0,
    rate: float = 1000.0,
    queue_messages: int = 10_000,
    seed: int = 3,
) -> dict[str, Any]:
    """SIGKILL the master ``kills`` times while a relay publishes upward at ``rate``/s."""
    rng = random.Random(seed)
    workdir = short_dir()
    master_path = os.path.join(workdir, "master")
    master = ServerProc(master_path)
    relay = ServerProc(
        os.path.join(workdir, "relay"),
        ["--upstream", master_path, "--reconnect-min", "0.01", "--reconnect-max", "0.1",
         "--upstream-queue-messages", str(queue_messages)],
        kind="host",
    )  # fmt: skip
    counter = _Counter(master_path)
    counter.start()
    kill_times: list[float] = []
    failures: list[str] = []
    try:
        with Conn(relay.address) as probe:
            probe.whoami()  # the relay is connected upstream
        # wait until the counter's subscription reached the relay
        deadline = time.monotonic() + 10
        with Conn(relay.address) as probe:
            while not counter.received and time.monotonic() < deadline:
                probe.pub(b"up/-1")
                time.sleep(0.02)
        counter.received.clear()
        counter.arrivals.clear()
        counter.epochs.clear()
        duration = interval * (kills + 1)
        publisher = Child(_publisher, relay.address, rate, duration)
        time.sleep(interval / 2)
        for _ in range(kills):
            time.sleep(interval * rng.uniform(0.5, 1.0))
            kill_times.append(time.monotonic())
            master.kill()
            time.sleep(rng.uniform(0.0, 0.1))
            master = ServerProc(master_path, remove_stale=True, log_path=master.log_path)
        times = publisher.result(duration + 60)
        total = len(times)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (
            not counter.received or counter.received[-1] < total - 1
        ):
            time.sleep(0.05)
        time.sleep(0.5)
        counter.stopping = True
        counter.join(5)
        stats = relay.stats()["stats"]
        relay_alive = relay.alive()
    finally:
        counter.stopping = True
        relay.kill()
        master.kill()
    received = counter.received
    arrivals = counter.arrivals
    got = set(received)
    duplicates = len(received) - len(got)
    out_of_order = sum(1 for a, b in itertools.pairwise(received) if b <= a)
    missing = sorted(set(range(total)) - got)
    overflow = stats["drops"]["upstream_queue_overflow"]
    # every missing message must have been published between IN_FLIGHT_WINDOW before
    # a kill and the first arrival after that kill (the recovery instant)
    # recovery: the first arrival over a connection made after the kill (arrivals just
    # after a kill may still be the old master's packets left in our socket)
    windows = []
    for k in kill_times:
        recovered = next((t for t, e in zip(arrivals, counter.epochs, strict=True) if e > k),
                         float("inf"))  # fmt: skip
        windows.append((k - IN_FLIGHT_WINDOW, recovered))
    outside = [s for s in missing if not any(a <= times[s] <= b for a, b in windows)]
    lead = 0.0  # how long before a kill the earliest message lost with it was published
    for k in kill_times:
        for s in missing:
            if k - IN_FLIGHT_WINDOW <= times[s] <= k:
                lead = max(lead, k - times[s])
    outage = [b - a - IN_FLIGHT_WINDOW for a, b in windows if b != float("inf")]
    if not relay_alive:
        failures.append("the relay died")
    if counter.error:
        failures.append(f"subscriber failed: {counter.error}")
    if duplicates:
        failures.append(f"{duplicates} duplicated messages")
    if out_of_order:
        failures.append(f"{out_of_order} messages out of order")
    if outside:
        failures.append(f"{len(outside)} missing messages outside the kill windows: {outside[:10]}")
    if overflow > len(missing):
        failures.append(f"relay counted {overflow} drops but only {len(missing)} are missing")
    if stats["upstream_reconnects"] < kills:
        failures.append(f"relay reconnected {stats['upstream_reconnects']} times for {kills} kills")
    if "Traceback" in relay.log_text() or "Traceback" in master.log_text():
        failures.append("a traceback in a server log")
    if not failures:
        cleanup_dir(workdir)
    return {
        "kills": kills,
        "published": total,
        "received": len(received),
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "missing": len(missing),
        "missing_counted_by_relay": overflow,
        "missing_lost_in_flight_or_unsubscribed": len(missing) - overflow,
        "missing_per_kill_max": max(
            (sum(1 for s in missing if a <= times[s] <= b) for a, b in windows), default=0
        ),
        "in_flight_lead_max_ms": round(1000 * lead, 1),
        "outage_max_ms": round(1000 * max(outage, default=0.0), 1),
        "relay_reconnects": stats["upstream_reconnects"],
        "rate_per_s": rate,
        "failures": failures,
    }


# --- relays killed and restarted ----------------------------------------------------------


def _interest_events(conn: Conn, timeout: float) -> list[bytes]:
    events: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            packet = conn.recv(max(0.01, deadline - time.monotonic()) if not events else 0.05)
        except TimeoutError:
            if events or time.monotonic() > deadline:
                return events
            continue
        if packet.startswith(b"CMSG interest/"):
            events.append(packet[5:])


def relay_kills(*, cycles: int = 10) -> dict[str, Any]:
    """SIGKILL a relay with a subscribed client ``cycles`` times; the master must clean up."""
    workdir = short_dir()
    master = ServerProc(os.path.join(workdir, "master"))
    relay_path = os.path.join(workdir, "relay")
    failures: list[str] = []
    delivered = 0
    fds: list[int] = []
    try:
        watcher = Conn(master.address)
        watcher.cmsg(b"interest/on")
        ready = _interest_events(watcher, 5)
        if ready != [b"interest/ready\0"]:
            failures.append(f"interest snapshot: {ready}")
        publisher = Conn(master.address)
        baseline = master.settled_fd_count()
        for n in range(cycles):
            relay = ServerProc(relay_path, ["--upstream", master.address], kind="serve",
                               remove_stale=True)  # fmt: skip
            client = Conn(relay.address)
            key = b"rk/%d" % n
            client.sub(key)
            client.sync()
            added = _interest_events(watcher, 5)
            if b"interest/add\0" + key not in added:
                failures.append(f"cycle {n}: no interest/add for {key!r}: {added}")
            packet = publisher.pub(key, b"down")
            try:
                if client.recv(5) == packet:
                    delivered += 1
                else:
                    failures.append(f"cycle {n}: wrong packet")
            except TimeoutError:
                failures.append(f"cycle {n}: nothing came down through the relay")
            relay.kill()
            removed = _interest_events(watcher, 5)
            if b"interest/remove\0" + key not in removed:
                failures.append(f"cycle {n}: no interest/remove after the relay died: {removed}")
            client.close()
            fds.append(master.fd_count())
        if fds[-1] != baseline:
            failures.append(f"master fds {baseline} before, {fds[-1]} after")
        publisher.close()
        watcher.close()
        if not master.alive():
            failures.append("the master died")
        if "Traceback" in master.log_text():
            failures.append("traceback in the master log")
    finally:
        master.kill()
    if not failures:
        cleanup_dir(workdir)
    return {"cycles": cycles, "delivered_through_relay": delivered,
            "master_fds_baseline": baseline, "master_fds_max": max(fds, default=0),
            "failures": failures}  # fmt: skip


# --- clients vanishing mid-send -----------------------------------------------------------


def _blaster(address: str, tag: int) -> None:
    """Publish ``v/<tag>/<seq>`` as fast as possible until killed; also hold a big sub."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(address)
    sock.send(b"SUB ")  # everything: the server queues for us as we never read
    seq = 0
    while True:
        sock.send(b"MSG v/%d/%d\0%s" % (tag, seq, b"x" * 200))
        seq += 1


def vanishing_clients(*, clients: int = 50, seed: int = 5) -> dict[str, Any]:
    """Kill publishing children mid-send; no gaps or duplicates in what got through."""
    rng = random.Random(seed)
    workdir = short_dir()
    server = ServerProc(os.path.join(workdir, "bus"))
    failures: list[str] = []
    got: dict[int, list[int]] = {}
    try:
        baseline = server.settled_fd_count()
        sub = Conn(server.address)
        # Publishers wait for this subscriber rather than have its messages
        # dropped: a gap can then only be a message the server lost.
        sub.send(b"CMSG blocking/hard/block")
        sub.sub(b"v/")
        sub.sync()
        alive: list[Child] = []
        for tag in range(clients):
            alive.append(Child(_blaster, server.address, tag))
            if len(alive) >= 8 or tag == clients - 1:
                time.sleep(rng.uniform(0.01, 0.1))
                for child in alive:
                    child.kill()
                    while True:  # keep up with the flood so the counter is not the bottleneck
                        try:
                            _take(sub, got, 0.0)
                        except TimeoutError:
                            break
                alive = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 1.0:
            try:
                _take(sub, got, 0.2)
                quiet_since = time.monotonic()
            except TimeoutError:
                pass
        sub.close()
        time.sleep(0.3)
        after = server.fd_count()
        with Conn(server.address) as fresh:
            fresh.sub(b"fresh")
            fresh.sync()
            packet = fresh.pub(b"fresh", b"x")
            ok = fresh.recv(5) == packet
        if not ok:
            failures.append("a fresh client could not pub/sub")
        if after != baseline:
            failures.append(f"server fds {baseline} before, {after} after the clients vanished")
        if not server.alive():
            failures.append("the server died")
        if "Traceback" in server.log_text():
            failures.append("traceback in the server log")
    finally:
        server.kill()
    gaps = dups = 0
    for seqs in got.values():
        dups += len(seqs) - len(set(seqs))
        gaps += sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1)
    if dups:
        failures.append(f"{dups} duplicates")
    if gaps:
        failures.append(f"{gaps} gaps in a vanished publisher's sequence")
    if not failures:
        cleanup_dir(workdir)
    return {"clients_killed": clients, "messages_through": sum(len(s) for s in got.values()),
            "gaps": gaps, "duplicates": dups, "failures": failures}  # fmt: skip


def _take(conn: Conn, got: dict[int, list[int]], timeout: float) -> None:
    if timeout == 0.0:
        conn.sock.setblocking(False)
        try:
            packet = conn.sock.recv(1 << 19)
        except BlockingIOError:
            raise TimeoutError from None
        finally:
            conn.sock.settimeout(conn.timeout)
    else:
        packet = conn.recv(timeout)
    tag, seq = packet[6 : packet.index(b"\0")].split(b"/")
    got.setdefault(int(tag), []).append(int(seq))


# --- the file-descriptor limit -----------------------------------------------------------


def fd_limit(*, nofile: int = 64, clients: int = 120) -> dict[str, Any]:
    """Run out of descriptors: the server stays up, logs, and serves again once fds free up."""
    raise_nofile(clients + 200)
    workdir = short_dir()
    server = ServerProc(os.path.join(workdir, "bus"), nofile=nofile)
    failures: list[str] = []
    conns: list[Conn] = []
    served = refused_connect = 0
    try:
        baseline = server.settled_fd_count()
        for _ in range(clients):
            try:
                conns.append(Conn(server.address, timeout=2.0))
            except OSError:
                refused_connect += 1  # the backlog is full: connect() says EAGAIN
        for conn in conns:  # which ones does the server actually serve?
            conn.cmsg(WHOAMI)
        time.sleep(0.5)
        for conn in conns:
            try:
                if conn.recv(0.01).startswith(b"CMSG " + WHOAMI):
                    served += 1
            except (TimeoutError, Closed):
                pass
        cpu_before = _cpu_seconds(server.pid)
        time.sleep(1.0)
        cpu_at_limit = _cpu_seconds(server.pid) - cpu_before
        log = server.log_text()
        if "accept.error" not in log:
            failures.append("no accept.error logged at the fd limit")
        if served >= len(conns):
            failures.append(f"all {served} clients served under a limit of {nofile} fds?")
        if cpu_at_limit > 0.5:
            failures.append(f"server spins at the limit: {cpu_at_limit:.2f} s CPU in 1 s")
        # free half of the served ones: the waiting ones must now get in
        for conn in conns[: served // 2]:
            conn.close()
        waiting = conns[served:]
        recovered = 0
        for conn in waiting[: served // 4]:  # their whoami was sent above
            try:
                if conn.recv(5.0).startswith(b"CMSG " + WHOAMI):
                    recovered += 1
            except (TimeoutError, Closed):
                pass
        if recovered < min(len(waiting), served // 4):
            failures.append(f"only {recovered} waiting clients served after fds were freed")
        for conn in conns:
            conn.close()
        time.sleep(0.5)
        with Conn(server.address) as fresh:
            fresh.whoami(timeout=5.0)
        time.sleep(0.2)
        after = server.fd_count()
        if after != baseline:
            failures.append(f"server fds {baseline} before, {after} after")
        if not server.alive():
            failures.append("the server died at the fd limit")
        if "Traceback" in server.log_text():
            failures.append("traceback in the server log")
        accept_errors = server.log_text().count("accept.error")
    finally:
        for conn in conns:
            conn.close()
        server.kill()
    if not failures:
        cleanup_dir(workdir)
    return {"nofile": nofile, "clients_tried": clients, "served_at_limit": served,
            "connect_refused": refused_connect, "served_after_freeing": recovered,
            "accept_error_logs": accept_errors, "cpu_s_per_s_at_limit": round(cpu_at_limit, 3),
            "failures": failures}  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_faults(quick: bool = False) -> dict[str, Any]:
    """Every fault run; ``quick`` for the short versions."""
    return {
        "master_kills": master_kills(kills=3, interval=0.6, rate=500) if quick else master_kills(),
        "master_kills_small_queue": master_kills(
            kills=2 if quick else 10, interval=1.0, rate=1000, queue_messages=50
        ),
        "relay_kills": relay_kills(cycles=3 if quick else 20),
        "vanishing_clients": vanishing_clients(clients=16 if quick else 200),
        "fd_limit": fd_limit(),
    }
