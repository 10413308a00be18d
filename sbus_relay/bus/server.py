"""The sbus server: accepting clients, and everything but the routing of MSG.

What it owns: the listening socket and accepting, the set of clients and their
accounts, the subscription index and interest listeners, the identity prefix,
reloads, and carrying out what a client's session decides.  What it may touch:
its connections through their methods, the upstream and NATS links through
theirs, protocol's decisions.

Theory of operation.  One gevent hub runs everything, and no greenlet exists
per client: the hub calls a connection's callbacks when its socket is ready.
A published message never passes through this class: ``Connection`` reads
it, ``Router`` matches it once and offers it to each recipient, and each
recipient sends, batches, queues or drops it (``bus/connection.py`` follows
one message from ``recvmmsg`` to ``sendmmsg``).

What the server owns is the rest: accepting (with per-user quotas, at
accept and for each new pattern, ``protocol.quota``), SUB, UNSUB and CMSG
(``handle``), the subscription index, the interest notices to relays below,
and on a relay the identity prefix.  There, ``upstream`` is the link to the
parent bus (docs/protocol.md, "Relays"): the index's first/last callbacks
feed it SUB/UNSUB, its connection is one more recipient in the index
(holding what the upstream wants), and it calls back through the
``UpstreamHost`` methods at the end of this class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import gevent
import structlog
from gevent.event import Event

from sbus_relay import accel
from sbus_relay.ops.addresses import peer_ucred, socket_mode
from sbus_relay.ops.config import Reload, ServerConfig, plan_reload
from sbus_relay.protocol import accounting, codec, control, quota, session
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.index import SubscriptionIndex, canonical
from sbus_relay.protocol.interest import InterestTracker
from sbus_relay.protocol.keys import CRED, WHOAMI, Credentials, check_pattern
from sbus_relay.protocol.limits import (
    ACCEPT_BACKOFF_MAX,
    ACCEPT_BACKOFF_MIN,
    ACCEPT_BATCH,
    LISTEN_BACKLOG,
    SEND_BUFFER,
)
from sbus_relay.protocol.stats import Gauges, Stats

from . import handover, views
from .connection import Connection, Router
from .upstream import UpstreamLink

if TYPE_CHECKING:  # imported when a link is set up: nats-py and ssl are megabytes
    from .natslink import NatsLink

#: closed-connection totals kept beyond two per live client before the
#: accounting forgets those of keys nobody uses (bounds its memory)
_TRIM_SLACK = 1024


class Server:
    """A full local bus; also a relay when ``config.upstream`` is set."""

    def __init__(
        self,
        config: ServerConfig,
        listener: socket.socket,
        *,
        stats: Stats | None = None,
        log: Any = None,
        socket_file: str | None = None,
    ) -> None:
        self.config = config
        self.listener = listener
        #: the socket file this server made (None: systemd's, inherited or
        #: abstract); its mode follows ``group_access``/``other_access`` on a reload
        self.socket_file = socket_file
        self.stats = stats if stats is not None else Stats()
        self.log = log if log is not None else structlog.get_logger("sbus_relay")
        self.clients: dict[int, Connection] = {}
        self.index: SubscriptionIndex = SubscriptionIndex(
            on_first=self._first_subscriber, on_last=self._last_subscriber
        )
        self.interest: InterestTracker[Connection] = InterestTracker(self.index)
        self.router = Router(
            self.index,
            self.stats,
            self.log,
            config.hard_limit_bytes,
            config.hard_limit_messages,
        )
        #: traffic of the clients that have gone, for the totals
        self.departed = views.Traffic()
        self.client_limits = config.client_limits()
        self._quotas = dict(config.user_quotas)
        self._default_quota = config.user_quota()
        #: uid -> what that user's connections hold (``protocol.quota``)
        self.accounts: dict[int, quota.Account] = {}
        self.upstream: UpstreamLink | None = None
        #: traffic per child relay and per user, for the bounded per-who series
        self.by_relay = accounting.Tally(config.accounting_top)
        self.by_user = accounting.Tally(config.accounting_top)
        self.started = time.time()
        #: our identity prefix: empty on a master, ``<upstream's whoami reply>/`` on a
        #: relay, None until the upstream has answered
        self.prefix: bytes | None = b""
        #: connections holding a packet until the prefix is known
        self._awaiting_prefix: list[Connection] = []
        self.stopped = Event()
        #: set once a newer process has taken the bus over (``hand_over``): this
        #: one leaves its socket file and pid file to it
        self.handed_over = False
        #: the metrics listening socket, handed over with the bus (set by the CLI)
        self.web_listener: socket.socket | None = None
        #: where it listens, as said in its log (set by the CLI), handed over too
        self.address = config.address
        self._next_cid = 0
        self._ever_connected = False
        self._allowed = frozenset(config.users) | {os.geteuid()} if config.users else None
        loop = gevent.get_hub().loop
        self._loop = loop
        self._accept_watcher: Any = None
        self._accept_timer: Any = None
        self._backoff = ACCEPT_BACKOFF_MIN
        if config.upstream:
            self.prefix = None
            self.upstream = UpstreamLink(self, config, self.log)
            self.index.quiet = self.upstream.conn
        #: the link to NATS (docs/nats.md): the index's quiet holder on a master
        self.nats: NatsLink | None = None
        if config.nats is not None:
            from .natslink import NatsLink

            self.nats = NatsLink(self, config, self.log)
            self.index.quiet = self.nats.conn
            if config.nats.identities:
                from sbus_relay.protocol.natsinterest import host_identity

                # our clients' identities cross, under this host's own (docs/nats.md)
                self.prefix = host_identity(self.nats.name)

    # --- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Start accepting clients (and connecting upstream, on a relay)."""
        # Listening again makes this process the one its clients' SO_PEERCRED
        # names (not the parent that bound it before daemonising, nor the
        # process it took the bus over from): `sbus-relay upgrade` signals it.
        self.listener.listen(LISTEN_BACKLOG)
        self.listener.setblocking(False)
        self._accept_watcher = self._loop.io(self.listener.fileno(), 1)
        self._accept_watcher.start(self._on_acceptable)
        if self.upstream is not None:
            self.upstream.start()
        if self.nats is not None:
            self.nats.start()
        self.log.info("server.started", relay=self.upstream is not None, hot_path=accel.mode())

    def serve_forever(self) -> None:
        """Start, then block until ``stop()``."""
        if self._accept_watcher is None:
            self.start()
        self.stopped.wait()

    def stop(self) -> None:
        """Stop accepting, disconnect every client, drop the upstream link.

        Nothing here waits: clients have no greenlets, so closing them is immediate.
        """
        if self.stopped.is_set():
            return
        for watcher in (self._accept_watcher, self._accept_timer):
            if watcher is not None:
                watcher.close()
        for conn in list(self.clients.values()):
            conn.close("server_stopping")
        if self.upstream is not None:
            self.upstream.stop()
        if self.nats is not None:
            self.nats.stop()
        self.listener.close()
        self.log.info("server.stopped")
        self.stopped.set()

    # --- reloading ---------------------------------------------------------

    def reconfigure(self, loaded: ServerConfig) -> Reload:
        """Take a config read afresh (a reload): every live field applies now,
        to the connections already here too; the fixed ones keep their running
        values (``config.FIXED_FIELDS``).  Logged in one line, with one more
        naming what was kept.  The CLI has applied the log settings already.
        """
        plan = plan_reload(self.config, loaded)
        new = self.config = plan.config
        self.client_limits = new.client_limits()
        self._quotas = dict(new.user_quotas)
        self._default_quota = new.user_quota()
        for uid, account in self.accounts.items():  # before the queues: they read it
            account.quota = self._quotas.get(uid, self._default_quota)
            account.max_bytes = account.quota.queued_bytes
        router = self.router
        router.queue_bytes = new.hard_limit_bytes
        router.queue_messages = new.hard_limit_messages
        for conn in self.clients.values():
            conn.set_limits(new.hard_limit_bytes, new.hard_limit_messages)
        self.by_relay.set_top(new.accounting_top)
        self.by_user.set_top(new.accounting_top)
        self._allowed = frozenset(new.users) | {os.geteuid()} if new.users else None
        if self._allowed is not None:
            for conn in list(self.clients.values()):
                if conn.uid not in self._allowed:
                    conn.close("user_not_allowed", "no longer among the allowed users")
        if self.upstream is not None:
            self.upstream.reconfigure(new)
        if self.socket_file is not None and {"group_access", "other_access"} & set(plan.changed):
            try:
                os.chmod(self.socket_file, socket_mode(new.group_access, new.other_access))
            except OSError as e:
                self.log.warning("config.socket_mode_failed", path=self.socket_file, error=str(e))
        self.stats.reloads["applied"] += 1
        self.stats.last_reload_ok = True
        self.log.info("config.reloaded", changed=list(plan.changed))
        if plan.kept:
            self.log.warning(
                "config.kept",
                fields=list(plan.kept),
                detail="these take effect at the next start: " + ", ".join(plan.kept),
            )
        return plan

    def refuse_reload(self, error: str) -> None:
        """A reload whose config has an error: nothing changes; said in one line."""
        self.stats.reloads["refused"] += 1
        self.stats.last_reload_ok = False
        self.log.error("config.refused", error=error, detail="still running on the config before")

    # --- accepting -------------------------------------------------------

    def _on_acceptable(self) -> None:
        """The hub's callback: accept the waiting clients, backing off on errors."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS...: back off, never spin
                self.stats.accept_errors += 1
                self.log.warning("accept.error", error=str(e), retry_in=self._backoff)
                self._accept_watcher.stop()
                self._accept_timer = self._loop.timer(self._backoff)
                self._accept_timer.start(self._accept_again)
                self._backoff = min(self._backoff * 2, ACCEPT_BACKOFF_MAX)
                return
            self._backoff = ACCEPT_BACKOFF_MIN
            try:
                self._admit(sock)
            except OSError as e:
                sock.close()
                self.log.warning("accept.error", error=str(e))

    def _accept_again(self) -> None:
        if not self.stopped.is_set():
            self._accept_watcher.start(self._on_acceptable)

    def _admit(self, sock: socket.socket) -> None:
        pid, uid, gid = peer_ucred(sock)
        account = self.accounts.get(uid)
        if account is None:
            account = quota.Account(self._quotas.get(uid, self._default_quota))
        why = None
        if self._allowed is not None and uid not in self._allowed:
            why = "user_not_allowed"
        elif len(self.clients) >= self.config.max_clients:
            why = "too_many_clients"
        else:
            why = quota.refuse_connection(account)
        if why is not None:
            self.stats.connections_refused += 1
            self.stats.refusals[why] = self.stats.refusals.get(why, 0) + 1
            self.log.warning("client.refused", reason=why, uid=uid, gid=gid, pid=pid)
            with contextlib.suppress(OSError):  # say why, best effort (docs/protocol.md)
                sock.setblocking(False)
                sock.send(control.disconnect(why))
            sock.close()
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._next_cid += 1
        # the connection keeps the descriptor alone: no socket object per client
        conn = self.add_client(sock.detach(), self._next_cid, Credentials(gid, uid, pid))
        self._ever_connected = True
        self.stats.connections_accepted += 1
        # said with the fields at hand: a bound logger is made only for a
        # client that has something more to say
        self.log.info("client.connected", **conn.who())

    def add_client(self, fd: int, cid: int, creds: Credentials) -> Connection:
        """A client on socket ``fd`` (accepted, or handed over), counted in its
        user's account."""
        account = self.accounts.get(creds.uid)
        if account is None:
            account = self.accounts[creds.uid] = quota.Account(
                self._quotas.get(creds.uid, self._default_quota)
            )
        account.connections += 1
        conn = Connection(self.router, self, fd, cid, creds, account)
        self.clients[cid] = conn
        return conn

    def lost(self, conn: Connection, reason: str, detail: str) -> None:
        """A client failed (it closed, misbehaved, or its socket did): close it."""
        conn.close(reason, detail)

    def forget(self, conn: Connection) -> None:
        """A connection closed: drop its patterns, interest and quota use."""
        self.clients.pop(conn.cid, None)
        self.departed.add(conn)
        if conn.interest:
            del self.interest.listeners[conn]
        for pattern in list(self.index.patterns_of(conn)):
            self._change(conn, pattern, add=False, everything=True)
        account = conn.account
        account.connections -= 1
        if not account.connections:
            self.accounts.pop(conn.creds.uid, None)
        counts = views.counters(conn)
        self.by_relay.closed(conn.label, counts)
        self.by_user.closed(str(conn.creds.uid), counts)
        if self.by_relay.tracked() + self.by_user.tracked() > 2 * len(self.clients) + _TRIM_SLACK:
            self.by_relay.trim(c.label for c in self.clients.values())
            self.by_user.trim(str(c.creds.uid) for c in self.clients.values())
        if self.config.exit_when_empty and self._ever_connected and not self.clients:
            gevent.spawn(self.stop)

    # --- everything but MSG ----------------------------------------------------

    def handle(self, conn: Connection, packet: bytes) -> None:
        """SUB, UNSUB and CMSG from a client: what each asks is decided by its
        session (``Connection.receive``, ``protocol.session``) and carried out
        here.  MSG and packed batches go through ``Router.publish``."""
        action = conn.receive(packet)
        kind = type(action)
        if kind is codec.Subscribe:
            self.stats.packets_in["sub"] += 1
            self._subscribe(conn, action.pattern, packet)  # type: ignore[union-attr]
        elif kind is codec.Unsubscribe:
            self.stats.packets_in["unsub"] += 1
            self._unsubscribe(conn, action.pattern, packet)  # type: ignore[union-attr]
        elif kind is codec.Publish or kind is session.Batch:
            # the reader's fast path takes these: one here means it missed it
            raise PeerError("protocol_error", "unexpected packet")
        else:
            self.stats.packets_in["cmsg"] += 1
            if action is not None:
                self._control(conn, action, packet)

    def _prefix_for(self, conn: Connection, pattern: bytes, packet: bytes) -> bytes | None:
        """Our prefix, or None after holding ``packet`` until the upstream tells it.

        Only secret patterns (and whoami) need it; a relay that has not heard
        from its upstream yet keeps reading everything else.
        """
        if self.prefix is None and pattern.startswith(b"!"):
            conn.hold()
            self._awaiting_prefix.append(conn)
            return None
        return self.prefix or b""

    def _subscribe(self, conn: Connection, pattern: bytes, packet: bytes) -> None:
        prefix = self._prefix_for(conn, pattern, packet)
        if prefix is None:
            return
        try:
            stored = canonical(check_pattern(pattern, conn.creds, prefix))
        except PeerError as e:
            if not conn.relay or e.reason != "secret_refused":
                raise
            # A relay carries many clients: refuse the pattern, keep the relay.
            conn.warn("client.pattern_refused", reason=e.reason, detail=e.detail)
            return
        if self.index.count_of(conn, stored) == 0:
            why = quota.refuse_pattern(
                stored,
                self.index.distinct_of(conn),
                conn.pattern_bytes,
                conn.account,
                self.client_limits,
                relay=conn.relay,
            )
            if why is not None:
                self.stats.refusals[why] = self.stats.refusals.get(why, 0) + 1
                if not conn.relay:
                    raise PeerError(why, "pattern of %d bytes refused" % len(stored))
                # A relay carries many clients: refuse the pattern, keep the relay.
                conn.warn("client.pattern_refused", reason=why)
                return
        self._change(conn, stored, add=True)

    def _unsubscribe(self, conn: Connection, pattern: bytes, packet: bytes) -> None:
        prefix = self._prefix_for(conn, pattern, packet)
        if prefix is None:
            return
        try:
            stored = canonical(check_pattern(pattern, conn.creds, prefix))
        except PeerError:
            stored = pattern  # cannot be held; counted as unknown below
        if self.index.count_of(conn, stored) == 0:
            self.stats.unknown_unsubscribes += 1
            conn.warn(
                "client.unknown_unsubscribe", pattern=pattern[:200].decode("utf-8", "replace")
            )
            return
        self._change(conn, stored, add=False)

    def _change(
        self, conn: Connection, pattern: bytes, *, add: bool, everything: bool = False
    ) -> None:
        """Add or remove subscriptions, keep the quota sums right (per distinct
        pattern) and tell interest listeners what changed."""
        listening = bool(self.interest.listeners)
        before = self.interest.before(pattern) if listening else []
        index = self.index
        held = index.count_of(conn, pattern)
        if add:
            index.add(conn, pattern)
        else:
            for _ in range(held if everything else 1):
                index.remove(conn, pattern)
        sign = (index.count_of(conn, pattern) > 0) - (held > 0)  # +1 came, -1 went, 0
        if sign:
            size = len(pattern) * sign
            conn.pattern_bytes += size
            account = conn.account
            account.patterns += sign
            account.pattern_bytes += size
        if listening:
            self._notify(self.interest.after(pattern, before))

    def _notify(self, notices: Iterable[tuple[Connection, bytes, bytes]]) -> None:
        # Each listener coalesces its own notices and sends them when its socket
        # can take them: a slow relay is never dropped for falling behind.
        for listener, verb, pattern in list(notices):
            listener.notify(pattern, verb == control.INTEREST_ADD)

    def _control(self, conn: Connection, action: Any, packet: bytes) -> None:
        """Carry out what a CMSG asks beyond its session's own state change."""
        kind = type(action)
        if kind is session.SetFlood:
            conn.set_flood(action.what, action.value)
        elif kind is session.Whoami:
            prefix = self._prefix_for(conn, WHOAMI, packet)
            if prefix is not None:
                conn.reply(codec.encode_cmsg(WHOAMI, prefix + conn.creds.identity()))
        elif kind is session.Listen:
            if action.new_relay:
                self._relabel(conn, accounting.credentials_label(conn.gid, conn.uid, conn.pid))
            self.interest.listeners[conn] = None
            for pattern in self.interest.snapshot(conn):
                conn.notify(pattern, True)
            conn.owe_ready()
        elif kind is session.Unlisten:
            del self.interest.listeners[conn]
        elif kind is session.NameRelay:
            if action.name is None:
                conn.warn("client.relay_name_refused", name=action.shown, relay=conn.relay)
            else:
                self._relabel(conn, action.name)
                conn.log.info("client.relay_named", name=action.name)
        elif kind is session.BatchOn:
            # our packed batches extension: say yes (what goes to it is packed now)
            conn.reply(codec.encode_cmsg(control.BATCH_ON, b""))
        elif kind is session.TakeOver:
            handover.hand_over(self, conn, action.takes)
        elif kind is session.DropsCount:
            conn.reply(control.drops_count(conn.dropped))

    def _relabel(self, conn: Connection, label: str) -> None:
        """A client's relay label changes; what it counted so far stays with the old one."""
        if label != conn.label:
            self.by_relay.moved(conn.label, label, views.counters(conn))
            conn.label = label

    # --- the relay: index callbacks, and the UpstreamHost interface ----------------

    def _first_subscriber(self, pattern: bytes) -> None:
        if self.upstream is not None:
            self.upstream.subscribe(pattern)
        if self.nats is not None:
            self.nats.subscribe(pattern)

    def _last_subscriber(self, pattern: bytes) -> None:
        if self.upstream is not None:
            self.upstream.unsubscribe(pattern)
        if self.nats is not None:
            self.nats.unsubscribe(pattern)

    def local_patterns(self) -> Iterable[bytes]:
        """Every distinct pattern held by a local client (not by the upstream link)."""
        quiet = self.index.quiet
        return [p for p in self.index.patterns() if self.index.holders(p) != (quiet,)]

    def set_prefix(self, prefix: bytes) -> None:
        """The upstream told us who we are: ``<whoami reply>/``.

        If that differs from before (we reconnected from another pid, or a
        relay above us did), the secret patterns our clients hold are
        rewritten to the new prefix.  Our own relays are told their new
        identity in place (``CMSG identity/changed``) and rename their own
        patterns, each one level down in turn: nobody is disconnected and
        the traffic between buses below us never stops.  A relay that did not
        say ``identity/follow`` (an older version) is disconnected instead,
        so that it redoes its handshake and learns its identity from us.
        """
        old = self.prefix
        if old is not None and old != prefix:
            self.log.warning("relay.identity_changed", old=old.decode(), new=prefix.decode())
            for listener in list(self.interest.listeners):  # every listener is a relay
                self._reidentify(listener, prefix)
            self._rewrite_secret_patterns(old, prefix)
        self.prefix = prefix
        waiting, self._awaiting_prefix = self._awaiting_prefix, []
        for conn in waiting:
            if conn.alive:
                conn.resume()

    def _reidentify(self, relay: Connection, prefix: bytes) -> None:
        """Tell a relay below its new identity, or disconnect it if its
        session says it cannot take one in place (or the notice could not
        even be queued)."""
        notice = relay.renamed(prefix + relay.creds.identity())
        if notice is None:
            relay.close("upstream_identity_changed")
            return
        dropped = relay.dropped
        relay.reply(notice)
        if relay.dropped != dropped:
            relay.close("upstream_identity_changed", "its queue could not take the notice")

    def _rewrite_secret_patterns(self, old: bytes, new: bytes) -> None:
        stale = old + CRED
        for conn in list(self.clients.values()):
            if conn.follows:
                continue  # it renames its own, with UNSUB and SUB (``_reidentify``)
            for pattern, count in self.index.patterns_of(conn).items():
                if not pattern.startswith(stale):
                    continue
                renamed = new + pattern[len(old) :]
                self._change(conn, pattern, add=False, everything=True)
                for _ in range(count):
                    self._change(conn, renamed, add=True)

    def upstream_interest(self, pattern: bytes, present: bool) -> None:
        """The upstream link comes to hold ``pattern`` (or one hold of it goes):
        what the upstream wants, so our own relays are told like of any pattern."""
        link = self.index.quiet
        assert link is not None
        if present or self.index.count_of(link, pattern):
            self._change(link, pattern, add=present)

    # --- a live upgrade (``bus.handover``): what it needs of the server ------------

    def freeze(self) -> None:
        """Stop accepting and stop every connection (the link too): nothing is
        read or written until the state is handed over or ``thaw``."""
        if self._accept_watcher is not None:
            self._accept_watcher.stop()
        for conn in self.clients.values():
            conn.freeze()
        if self.upstream is not None:
            self.upstream.freeze()
        if self.nats is not None:
            self.nats.conn.freeze()

    def thaw(self) -> None:
        """Undo ``freeze``: the hand-over failed, this process serves on."""
        if self._accept_watcher is not None and not self.stopped.is_set():
            self._accept_watcher.start(self._on_acceptable)
        for conn in self.clients.values():
            conn.thaw()
        if self.upstream is not None:
            self.upstream.thaw()
        if self.nats is not None:
            self.nats.conn.thaw()

    def let_go(self) -> None:
        """The bus lives on in the new process: close our copies of its sockets,
        telling no one, and stop."""
        for watcher in (self._accept_watcher, self._accept_timer):
            if watcher is not None:
                watcher.close()
        for conn in list(self.clients.values()):
            conn.let_go()
        if self.upstream is not None:
            self.upstream.let_go()
        if self.nats is not None:
            # its process goes on in the new one (or, for one that does not take it
            # up, stops: that one has joined NATS by now)
            self.nats.let_go()
        self.listener.close()  # (the metrics socket: the CLI's metrics server closes it)
        self.stopped.set()

    def totals(self) -> dict[str, Any]:
        """Its own counters and identity as plain data (part of the hand-over record)."""
        return {
            "stats": dataclasses.asdict(self.stats),
            "gone": self.departed.export(),
            "next_cid": self._next_cid,
            "started": self.started,
            "prefix": self.prefix,
            "ever_connected": self._ever_connected,
            "by_relay": self.by_relay.export(),
            "by_user": self.by_user.export(),
        }

    def restore_totals(self, state: dict[str, Any]) -> None:
        """Take back what ``totals`` gave (an earlier process's)."""
        for name, value in state["stats"].items():
            setattr(self.stats, name, value)
        self.departed = views.Traffic.adopt(state["gone"])
        self._next_cid = state["next_cid"]
        self.started = state["started"]
        self.prefix = state["prefix"]
        self._ever_connected = state["ever_connected"]
        self.by_relay.restore(state["by_relay"])
        self.by_user.restore(state["by_user"])

    def restore_patterns(self, conn: Connection, patterns: dict[bytes, int]) -> None:
        """``conn`` (handed over) holds ``patterns`` again, each that many times,
        and listens again if it did; its quota sums follow."""
        for pattern, count in patterns.items():
            for _ in range(count):
                self.index.add(conn, pattern)
        conn.account.patterns += len(patterns)
        conn.account.pattern_bytes += conn.pattern_bytes
        if conn.interest:
            self.interest.listeners[conn] = None

    def waits_for_prefix(self, conn: Connection) -> bool:
        """Whether ``conn`` is held until the upstream tells our identity."""
        return conn in self._awaiting_prefix

    def wait_for_prefix(self, conn: Connection) -> None:
        """Hold ``conn`` (paused) until the upstream tells our identity."""
        conn.pause()
        self._awaiting_prefix.append(conn)

    @classmethod
    def adopt(
        cls, config: ServerConfig, state: dict[str, Any], fds: list[int], log: Any = None
    ) -> Server:
        """The bus an earlier process handed over (``bus.handover.export``), on
        this config, not started yet."""
        server = cls(
            config, socket.socket(fileno=fds[0]), log=log, socket_file=state["socket_file"]
        )
        own = server.prefix
        handover.adopt(server, state, fds)
        if server.upstream is None and own != server.prefix:
            # a master whose identities began (or ceased) to cross hosts
            server.set_prefix(own if own is not None else b"")
        return server

    # --- what it shows of itself (``bus.views``) -------------------------------------

    def gauges(self) -> Gauges:
        """A snapshot for the metrics collector (``views.gauges``)."""
        return views.gauges(self)

    def who(self) -> dict[str, list[tuple[str, list[int], list[int]]]]:
        """The bounded per-relay and per-user rows (``views.who``)."""
        return views.who(self)

    def client_rows(self) -> list[dict[str, Any]]:
        """Every connection as ``/clients`` shows it (``views.client_rows``)."""
        return views.client_rows(self)
