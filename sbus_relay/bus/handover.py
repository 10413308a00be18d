"""A live upgrade, the bus's side: the whole bus as plain data, and back.

What it owns: the hand-over record (what each connection, the upstream link
and the server put in it, and how a newer process rebuilds the bus from it)
and the exchange's orchestration on both sides.  What it may touch: what Bus
lists of the server, the public state of its connections and of its
UpstreamLink, while the bus is frozen or not started; the wire through
ops.handover.

* the running process answers ``CMSG upgrade/take-over`` (``hand_over``):
  it freezes the bus (``Server.freeze``: nothing read, written or
  accepted), exports it (``export``), sends the record and the descriptors
  (``ops.handover.send_state``), and when the new process says it serves
  (``ops.handover.wait_done``) lets go of its copies (``Server.let_go``);
  otherwise it thaws and serves on;
* the new process receives the record (``ops.handover.take_over``), builds
  the bus from it (``Server.adopt``, which makes the server and calls
  ``adopt`` here), starts it, and confirms (``ops.handover.confirm``).  A
  take-over the new process starts is those three calls, as ``sbus-relay
  serve`` makes them for an upgrade.

What it may touch: what ``Bus`` lists of the server, and the public state
of its connections and of its ``UpstreamLink``, while the bus is frozen
(exporting) or not started yet (adopting); nothing else.  What a connection
holds privately comes from ``Connection.held`` and goes back through
``Connection.hold_again``; the server's own totals through ``Server.totals``
and ``restore_totals``; the link's through ``UpstreamLink.export`` and
``adopt``.  The wire exchange and the descriptors are ``ops.handover``'s; it
knows nothing of what the state means.  The record's layout is kept from one
version to the next: a process adopts what an older one exported.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

from sbus_relay import __version__
from sbus_relay.ops import handover as wire
from sbus_relay.protocol import control
from sbus_relay.protocol.errors import UpgradeError
from sbus_relay.protocol.flood import Action
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.keys import Credentials

from .batchio import borrowed
from .connection import Connection
from .upstream import UpstreamLink

if TYPE_CHECKING:
    from .natslink import NatsLink


class Bus(Protocol):
    """What a hand-over needs of the server (``bus.server.Server``)."""

    listener: socket.socket
    web_listener: socket.socket | None
    socket_file: str | None
    address: str
    clients: dict[int, Connection]
    index: SubscriptionIndex
    upstream: UpstreamLink | None
    nats: NatsLink | None
    handed_over: bool
    log: Any

    def totals(self) -> dict[str, Any]:
        """Its own counters and identity, as plain data."""

    def restore_totals(self, state: dict[str, Any]) -> None:
        """Take back what ``totals`` gave."""

    def add_client(self, fd: int, cid: int, creds: Credentials) -> Connection:
        """A client on socket ``fd``, with its number and credentials."""

    def restore_patterns(self, conn: Connection, patterns: dict[bytes, int]) -> None:
        """``conn`` holds these patterns again (each that many times)."""

    def waits_for_prefix(self, conn: Connection) -> bool:
        """Whether ``conn`` waits for the identity prefix."""

    def wait_for_prefix(self, conn: Connection) -> None:
        """``conn`` waits for the identity prefix again (paused)."""

    def freeze(self) -> None:
        """Nothing is accepted, read or written until ``thaw`` or ``let_go``."""

    def thaw(self) -> None:
        """The hand-over failed: serve on."""

    def let_go(self) -> None:
        """The bus lives on elsewhere: close this process's copies and stop."""


def export_connection(conn: Connection) -> dict[str, Any]:
    """Everything about one connection but its socket, as plain data: who it
    is, its modes and flags, its counters, and every packet it holds, in the
    order it would have sent or handled them (``adopt_connection`` takes it)."""
    packets, times, notices, stash, ready_owed, retry = conn.held()
    q = conn.queue
    return {
        "cid": conn.cid,
        "creds": (conn.gid, conn.uid, conn.pid),
        "flags": {
            "echo": conn.echo,
            "interest": conn.interest,
            "relay": conn.relay,
            "packs": conn.packs,
            "follows": conn.follows,
            "batch": conn.batch,
            "open": conn.open,
            "holding": conn.holding,
            "ready_owed": ready_owed,
            "retry": retry,
        },
        "label": conn.label,
        "since": conn.since,
        "counters": (
            conn.msgs_in,
            conn.bytes_in,
            conn.msgs_out,
            conn.bytes_out,
            conn.dropped,
            conn.pattern_bytes,
        ),
        "modes": None if q is None else (q.soft, q.hard, q.order),
        "queued": (packets, times),
        "shed": conn.shed,
        "notices": notices,
        "stash": stash,
    }


def adopt_connection(conn: Connection, state: dict[str, Any]) -> None:
    """Make a connection just built on its old socket what ``state`` says it
    was.  Its pauses are restored by whoever held them."""
    if state["modes"] is not None:
        soft, hard, order = state["modes"]
        conn.set_flood("soft", soft)
        conn.set_flood("hard", hard)
        conn.set_flood("order", order)
    flags = state["flags"]
    conn.echo = flags["echo"]
    conn.interest = flags["interest"]
    conn.relay = flags["relay"]
    conn.packs = flags["packs"]
    conn.follows = flags.get("follows", False)  # (an older process's record has none)
    conn.batch = flags["batch"]
    conn.open = flags["open"]
    conn.holding = flags["holding"]
    conn.label = state["label"]
    conn.since = state["since"]
    (
        conn.msgs_in,
        conn.bytes_in,
        conn.msgs_out,
        conn.bytes_out,
        conn.dropped,
        conn.pattern_bytes,
    ) = state["counters"]
    conn.shed = state["shed"]
    packets, times = state["queued"]  # in sending order
    conn.hold_again(
        (packets, times, state["notices"], state["stash"], flags["ready_owed"], flags["retry"])
    )


def export(
    server: Bus, skip: Connection | None = None, takes: bytes = b""
) -> tuple[dict[str, Any], list[int]]:
    """The whole bus as plain data, and the descriptors it refers to by position:
    the listener first, then the metrics socket (if any), the clients', the link's,
    the NATS link's when the process taking over takes it up (``takes``).
    ``skip``: the connection of the process taking over."""
    fds = [server.listener.fileno()]
    web = None
    if server.web_listener is not None:
        web = len(fds)
        fds.append(server.web_listener.fileno())
    clients = []
    for conn in server.clients.values():
        if conn is skip:
            continue
        state = export_connection(conn)
        state["fd"] = len(fds)
        fds.append(conn.fd)
        state["patterns"] = server.index.patterns_of(conn)
        state["waiters"] = [(p.cid, a.name) for p, a in conn.waiters]
        state["held"] = server.waits_for_prefix(conn)
        clients.append(state)
    link = None
    if server.upstream is not None:
        link = server.upstream.export()
        link["conn"] = export_connection(server.upstream.conn)
        link["patterns"] = server.index.patterns_of(server.upstream.conn)
        if server.upstream.conn.fd >= 0:
            link["fd"] = len(fds)
            fds.append(server.upstream.conn.fd)
    nats_link = None
    nats = server.nats
    if nats is not None and takes == control.TAKES_NATS_LINK:
        # the running link process goes on: its socket comes with the clients'
        handing = nats.handing()
        if handing is not None:
            nats_link, pidfd = handing
            nats_link["conn"] = export_connection(nats.conn)
            nats_link["patterns"] = server.index.patterns_of(nats.conn)
            nats_link["fd"] = len(fds)
            fds.append(nats.conn.fd)
            if pidfd is not None:  # (ours to close once sent: ``hand_over``)
                nats_link["pidfd"] = len(fds)
                fds.append(pidfd)
    state = {
        "version": __version__,
        "socket_file": server.socket_file,
        "address": server.address,
        "web": web,
        **server.totals(),
        "clients": clients,
        "upstream": link,
        # what the other hosts want: held by the new process's link until its own view
        # is in (a process that does not take the link process up starts its own)
        "nats": server.index.patterns_of(server.nats.conn) if server.nats is not None else None,
        "nats_link": nats_link,
    }
    return state, fds


def adopt(server: Bus, state: dict[str, Any], fds: list[int]) -> None:
    """Make a server just built on the handed-over listener (``fds[0]``) the
    bus an earlier process exported (``export``); it is not started yet."""
    if state["web"] is not None:
        server.web_listener = socket.socket(fileno=fds[state["web"]])
    server.restore_totals(state)
    index = server.index
    # the upstream and our relays know every pattern already: no SUB, no notice
    on_first, on_last = index.on_first, index.on_last
    index.on_first = index.on_last = None
    byid: dict[int, Connection] = {}
    for cstate in state["clients"]:
        gid, uid, pid = cstate["creds"]
        conn = server.add_client(fds[cstate["fd"]], cstate["cid"], Credentials(gid, uid, pid))
        adopt_connection(conn, cstate)
        server.restore_patterns(conn, cstate["patterns"])
        byid[conn.cid] = conn
    for cstate in state["clients"]:
        conn = byid[cstate["cid"]]
        for cid, action in cstate["waiters"]:
            conn.hold_back(byid[cid], Action[action])
        if cstate["held"]:
            server.wait_for_prefix(conn)
    link = state["upstream"]
    if link is not None and server.upstream is not None:
        up = server.upstream
        fd = fds[link["fd"]] if "fd" in link else None
        if fd is not None:
            up.conn.attach(fd)
        adopt_connection(up.conn, link["conn"])
        up.adopt(link, fd)
        for pattern, count in link["patterns"].items():
            for _ in range(count):
                index.add(up.conn, pattern)
    handed = state.get("nats_link")
    nats = server.nats
    if handed is not None and nats is not None and nats.same_link(handed):
        # the link process goes on, ours now, until we cut over to our own
        nats.conn.attach(fds[handed["fd"]])
        adopt_connection(nats.conn, handed["conn"])
        nats.adopt_link(handed, fds[handed["pidfd"]] if "pidfd" in handed else None)
        for pattern, count in handed["patterns"].items():
            for _ in range(count):
                index.add(nats.conn, pattern)
    else:
        if handed is not None:
            # no NATS here now, or another host name: that link ends (its goodbye)
            # once the old process lets go of its copy too
            os.close(fds[handed["fd"]])
            if "pidfd" in handed:
                os.close(fds[handed["pidfd"]])
        if state.get("nats") and nats is not None:
            nats.adopt(state["nats"])
    index.on_first, index.on_last = on_first, on_last


def hand_over(server: Bus, conn: Connection, takes: bytes = b"") -> None:
    """``CMSG upgrade/take-over`` from ``conn``: hand the whole bus to the
    process behind it if it runs as the bus's own user (or root), then end
    quietly; if it fails, serve on.  ``takes``: what more the new process
    takes up (``control.TAKES_NATS_LINK``: the running NATS link process).  A
    cut of the NATS link being made is finished first (the request waits)."""
    if not wire.allowed(conn.uid):
        conn.warn("upgrade.refused", reason="not the bus's own user")
        conn.reply(control.upgrade_refused("not the bus's own user"))
        return
    if server.nats is not None and not server.nats.hand_over(conn):
        return  # handled again once the cut is done (``conn`` is held)
    log = server.log
    others = len(server.clients) - 1
    log.info("upgrade.handing_over", to_pid=conn.pid, clients=others)
    started = time.monotonic()
    server.freeze()
    state, fds = export(server, skip=conn, takes=takes)
    try:
        with borrowed(conn.fd) as sock:
            wire.send_state(sock, state, fds)
            wire.wait_done(sock)
    except (OSError, UpgradeError) as exc:
        _close_lent(state, fds)
        server.thaw()
        log.warning("upgrade.failed", to_pid=conn.pid, reason=str(exc))
        conn.close("upgrade_failed", str(exc))
        return
    _close_lent(state, fds)
    server.handed_over = True
    if state["nats_link"] is not None and server.nats is not None:
        server.nats.handed_on = True  # it goes on in the new process: ``let_go`` leaves it be
    log.info(
        "upgrade.handed_over",
        to_pid=conn.pid,
        clients=others,
        seconds=round(time.monotonic() - started, 3),
    )
    server.let_go()


def _close_lent(state: dict[str, Any], fds: list[int]) -> None:
    """Close what was opened only to be sent (the NATS link's pidfd)."""
    link = state.get("nats_link")
    if link is not None and "pidfd" in link:
        os.close(fds[link["pidfd"]])
