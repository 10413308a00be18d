"""The bus's side of its NATS link (docs/nats.md, "How it is built").

What it owns: the link process's life, the link's holds, what the link last
reported. What it may touch: its ``Connection`` and, through ``UpstreamHost``,
its bus.

Theory of operation.  The link is a process of its own, the bus's child
(``python -m sbus_relay.cli.link``, its code in ``sbus_relay/link/``), joined
to the bus by one ``SOCK_SEQPACKET`` socket pair: nothing else is shared, so
the link never takes the hub's GIL and the hub never waits on it.  The bus's
end is a ``Connection`` like any client's, made once and kept across the
link process's restarts (what it queues survives them).  To the bus the link
is what a relay's upstream link is: one more recipient in the subscription
index, its *quiet* holder, holding the patterns the other hosts want, so one
match serves local subscribers and NATS alike, and a message goes to NATS
only when another host wants it.  Its connection reads, batches, queues
(bounded, in order) and drops (counted, with the drop episode) exactly as a
client's does, and as the upstream link's it is never paused.

* The index's first/last callbacks become ``SUB``/``UNSUB`` notices on the
  connection (coalesced per pattern); the link subscribes on NATS and tells
  the other hosts.
* What the link sends back is ``MSG`` from other hosts (routed like any
  publish, never back to the link: its echo is off), ``SUB``/``UNSUB`` as
  the other hosts' interest changes (the link's holds,
  ``UpstreamHost.upstream_interest``), and control packets
  (``protocol.linkwire``): settled, synced, its stats, its log records.
* The process is started, supervised and restarted here: if it dies, the
  link's holds are let go, every public key is held again, and a new process
  starts after a back-off (``RESTART_MIN`` doubling to ``RESTART_MAX``),
  logged.  It ends when the bus closes its end of the socket pair (or dies:
  the kernel closes it), never by the parent-death signal: a live upgrade
  hands that end to the next bus with the clients' sockets, and the link
  process goes on, untouched; the new bus then cuts over to a link process of
  its own (``linkcut``).  Nothing here ever waits for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import time
from typing import Any

import gevent

from sbus_relay.ops import children
from sbus_relay.ops.config import ServerConfig
from sbus_relay.protocol import codec, linkwire, natsorigins
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.flood import OutboundQueue
from sbus_relay.protocol.limits import SEND_BUFFER

from .batchio import send_one
from .connection import Connection
from .linkcut import RETRY_MAX, RETRY_MIN, LinkCut, OldLink, pidfd_of
from .upstream import UpstreamHost, link_connection

#: Seconds between two looks at the link while waiting for it to join.
JOIN_POLL = 0.005
#: Seconds a new process of a live upgrade waits for its link to join NATS
#: before it lets the old one go (well within the hand-over's UPGRADE_TIMEOUT).
JOIN_WAIT = 3.0
#: What the link holds until the other hosts' interest is known: every public key.
EVERYTHING = b""
#: Seconds before a link process that died is started again, doubling up to
#: the most; a link that ran ``RESTART_RESET`` seconds starts from the least again.
RESTART_MIN = 0.5
RESTART_MAX = 30.0
RESTART_RESET = 60.0
#: Seconds a link process whose socket closed may take to end before it is
#: killed, and between two looks at it meanwhile.
LINGER = 1.0
REAP_POLL = 0.01
#: The link process's module (its command line: ``sys.executable -m`` it).
LINK_MODULE = "sbus_relay.cli.link"
#: The lowest level of the records the link process sends: all of them (the
#: bus's own level, reloaded with its config, decides what is written).
LINK_LOG_LEVEL = "debug"


class NatsLink:
    """A bus's link to NATS: its connection to the link process, and that process."""

    def __init__(self, host: UpstreamHost, config: ServerConfig, log: Any) -> None:
        nats = config.nats
        assert nats is not None
        self.host = host
        self.name = nats.host or config.instance
        self.config = nats
        self.log = log.bind(link="nats")
        queue = OutboundQueue(nats.queue_bytes, nats.queue_messages, upward=True)
        self.conn = link_connection(host, self, queue, self.log)
        self.conn.label = "nats"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = False
        self.stopping = False
        self.join_wait = JOIN_WAIT
        #: holds taken over from the process before a live upgrade (``adopt``)
        self.adopted: dict[bytes, int] = {}
        self.holding = False  # holds every public key until the others' interest is known
        self.synced = False  # the link's server has every local pattern (``wait_joined``)
        #: what the link process last reported (``protocol.linkwire.Stats``)
        self.stats = linkwire.Stats()
        self.restarts = 0
        self._delay = RESTART_MIN
        self._since = 0.0  # when the running process started (monotonic)
        self._restart: Any = None  # the timer of the next start
        self._reaper: Any = None  # the timer that reaps the process after a stop
        #: a live upgrade: the link process taken over from the old bus (not our
        #: child), until the cut to one of our own (``linkcut``)
        self.old: OldLink | None = None
        self.cut: LinkCut | None = None
        self._cut_delay = RETRY_MIN
        self._cut_timer: Any = None
        #: this bus handed its link process on with its sockets (``let_go``)
        self.handed_on = False

    @property
    def identity(self) -> bytes | None:
        """The prefix of this host's identities when they cross (None: they stay home)."""
        from sbus_relay.protocol.natsinterest import host_identity

        return host_identity(self.name) if self.config.identities else None

    def adopt(self, holds: dict[bytes, int]) -> None:
        """A live upgrade: hold what the old process's link held (the other
        hosts' interest as it knew it) until this link's own view is in."""
        for pattern, count in holds.items():
            for _ in range(count):
                self.host.upstream_interest(pattern, True)
        self.adopted = holds

    def start(self) -> None:
        """Hold every public key, start the link process, tell it every local
        pattern; or, with a link process taken over (``adopt_link``), cut over
        from it to one of our own."""
        if self.old is not None:
            self.started = True
            self.synced = True  # it is on NATS, and has every local pattern
            self.log.info("nats.link_taken_over", host=self.name, pid=self.old.pid)
            self._begin_cut()
            return
        # until the link says the other hosts' interest is known, every public
        # key goes to NATS (where only hosts subscribed to it get it)
        self.host.upstream_interest(EVERYTHING, True)
        self.holding = True
        self.started = True
        self._spawn()
        identity = self.identity
        self.log.info(
            "nats.starting",
            host=self.name,
            servers=list(self.config.servers),
            identities=identity.decode() if identity is not None else None,
            pid=self.proc.pid if self.proc is not None else None,
        )

    def _hello(self, adopt: bool = False, prefer: str = "") -> bytes:
        """The link's settings: every ``nats`` setting the hello carries, by name
        (a cut's new link: the old link's server first, tried in order)."""
        c = self.config
        same: dict[str, Any] = {
            f.name: list(v) if isinstance(v := getattr(c, f.name), tuple) else v
            for f in dataclasses.fields(linkwire.Hello)
            if hasattr(c, f.name)
        }
        # every record of the link's crosses (they are events, never one a
        # message): the bus writes them through its own logger, whose level
        # is the one a reload sets, so one level rules both processes
        more: dict[str, Any] = {"host": self.name, "log_level": LINK_LOG_LEVEL}
        if adopt:
            servers = list(c.servers)
            first = [u for u in servers if (u.partition("://")[2] or u) == prefer]
            rest = [u for u in servers if u not in first]
            more.update(adopt=True, ordered=True, servers=first + rest)
        return linkwire.encode_hello(linkwire.Hello(**{**same, **more}))

    def start_process(
        self, adopt: bool = False, prefer: str = ""
    ) -> tuple[subprocess.Popen[bytes], socket.socket] | None:
        """A new link process on a new socket pair, its hello written; our end.
        ``adopt``: a cut's new link (the old link's record follows the hello),
        on the NATS server ``prefer`` (host:port) if it can.  None if it could
        not be started (said)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (ours, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        send_one(ours.fileno(), self._hello(adopt, prefer))  # first, before anything else
        argv = [sys.executable, "-m", LINK_MODULE, "--fd", str(theirs.fileno())]
        try:
            # no parent-death signal: a live upgrade hands the link on with its
            # socket, whose closing alone ends it (the module's doc)
            proc = children.spawn(argv, pass_fds=(theirs.fileno(),), outlive_parent=True)
        except OSError as e:
            ours.close()
            theirs.close()
            self.log.error("nats.link_not_started", error=str(e))
            return None
        theirs.close()
        return proc, ours

    def _spawn(self) -> None:
        """A new link process on a new socket pair; the connection serves our end."""
        started = self.start_process()
        if started is None:
            self._schedule_restart()
            return
        self.proc, ours = started
        self._attach(ours.detach())

    def _attach(self, fd: int) -> None:
        """The link's connection serves ``fd``, a link process's new socket:
        every local pattern, then ``interest/ready``, then what waits."""
        self._since = time.monotonic()
        self.synced = False
        self.conn.attach(fd)
        self.conn.packs = True  # the link reads packed batches
        for pattern in self.host.local_patterns():
            self.conn.notify(pattern, True)
        self.conn.owe_ready()  # answered ``link/synced`` once NATS has them all
        self.conn.opened()

    def wait_joined(self, timeout: float) -> bool:
        """Wait (cooperatively) until the link is on NATS with every local
        pattern subscribed there: a new process of a live upgrade does, before
        the old one lets its own link go.  False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.synced:
                return True
            gevent.sleep(JOIN_POLL)
        return False

    def stop(self) -> None:
        """Close the link: its process says goodbye on NATS and ends (not waited for)."""
        self.stopping = True
        self._stop_timers()
        if self.cut is not None:
            self.cut.stop()
            self.cut = None
        self.conn.close("server_stopping")
        self._forget_old()

    def _stop_timers(self) -> None:
        for timer in (self._restart, self._cut_timer):
            if timer is not None:
                timer.close()
        self._restart = self._cut_timer = None

    def subscribe(self, pattern: bytes) -> None:
        """A local pattern went 0 -> 1."""
        if self.started and not (self.cut is not None and self.cut.withhold(pattern, True)):
            self.conn.notify(pattern, True)  # (before ``start``, it sends the whole set)

    def unsubscribe(self, pattern: bytes) -> None:
        """A local pattern went 1 -> 0."""
        if self.started and not (self.cut is not None and self.cut.withhold(pattern, False)):
            self.conn.notify(pattern, False)

    # --- a live upgrade: the link process handed on, and cut over to a new one -------

    def handing(self) -> tuple[dict[str, Any], int | None] | None:
        """What a newer bus needs to take the running link process up with its
        socket (``bus.handover``), and a pidfd of it for that bus (the caller
        closes it once sent); None if there is none to take (it died, or is
        being started)."""
        pid = self.pid
        if pid is None or self.conn.fd < 0 or self.stopping:
            return None
        old = self.old
        pidfd = os.dup(old.fd) if old is not None and old.fd is not None else pidfd_of(pid)
        return {
            "host": self.name,
            "subject_prefix": self.config.subject_prefix,
            "identities": self.config.identities,
            "holding": self.holding,
            "adopted": self.adopted,
            "restarts": self.restarts,
        }, pidfd

    def hand_over(self, conn: Connection) -> bool:
        """This bus is asked for by a newer process (``conn``): True to hand it
        over now; False while a cut is being made (the request waits for it)."""
        return self.cut is None or self.cut.hand_over(conn)

    def same_link(self, handed: dict[str, Any]) -> bool:
        """Whether a handed-on link process can go on as this bus's link: the
        same host name, subject prefix and identities (its incarnation goes on)."""
        return (
            handed.get("host") == self.name
            and handed.get("subject_prefix") == self.config.subject_prefix
            and bool(handed.get("identities")) == self.config.identities
        )

    def adopt_link(self, handed: dict[str, Any], pidfd: int | None) -> None:
        """A live upgrade took the old bus's link process up, its socket already
        this link's connection's (``bus.handover``), and a pidfd of it: it goes
        on as our link until the cut to one of our own (``start``)."""
        self.old = OldLink(pidfd)
        self.holding = bool(handed["holding"])
        self.adopted = dict(handed.get("adopted") or {})
        self.restarts = int(handed.get("restarts", 0))
        self._since = time.monotonic()

    def _begin_cut(self) -> None:
        self._cut_timer = None
        if self.stopping or self.cut is not None or self.conn.fd < 0 or self.old is None:
            return
        self.cut = LinkCut(self)
        self.cut.begin()

    def cut_later(self) -> None:
        """A cut was given up before it began: the old link serves on; try again."""
        delay = self._cut_delay
        self._cut_delay = min(delay * 2, RETRY_MAX)
        self._cut_timer = gevent.get_hub().loop.timer(delay)
        self._cut_timer.start(self._begin_cut)

    def switch(self, proc: subprocess.Popen[bytes], fd: int, seconds: float) -> None:
        """The cut is made: the link's connection serves the new link process
        from now on (the old one left after its state: its socket is closed)."""
        conn = self.conn
        conn.detach()
        self._forget_old()
        self.proc = proc
        self._cut_delay = RETRY_MIN
        self._attach(fd)
        self.synced = True
        self.log.info("nats.link_cut", pid=proc.pid, seconds=round(seconds, 3))

    def restart_afresh(self, why: str) -> None:
        """A cut failed once the old link was told to stop: both are ended, and a
        fresh link starts at once (a new incarnation, as after a link's death)."""
        if self.old is not None:
            self.old.kill()
        self._forget_old()
        if self.conn.fd >= 0:
            self.conn.detach()
        self.stats = linkwire.Stats(state="starting", engine=self.stats.engine)
        self._forget_interest()
        self._spawn()

    def _forget_old(self) -> None:
        if self.old is not None:
            self.old.close()
            self.old = None

    def reap_later(self, proc: subprocess.Popen[bytes]) -> None:
        """A process of ours that was killed: reaped without waiting."""
        self._reap_later(proc)

    def let_go(self) -> None:
        """This bus lives on in a newer process: if it took the link process up
        (``handed_on``), only our copy of its socket closes; else it stops."""
        if not self.handed_on:
            self.stop()
            return
        self.stopping = True
        self._stop_timers()
        self.conn.let_go()
        self._forget_old()

    @property
    def pid(self) -> int | None:
        """The running link process's pid (ours, or the one taken over)."""
        if self.old is not None:
            return self.old.pid if self.old.alive() else None
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def log_record(self, payload: bytes) -> None:
        """A link process's ``link/log``: written as our own line, ``link: nats``."""
        level, event, fields = linkwire.decode_log(payload)
        say = getattr(self.log, level, None)
        if say is None or level not in ("debug", "info", "warning", "error", "critical"):
            say = self.log.warning
        say(event, **{k: v for k, v in fields.items() if k != "event"})

    # --- the connection's handler -------------------------------------------------

    def handle(self, conn: Connection, packet: bytes) -> None:
        """What the link process says besides MSG: interest, control packets."""
        try:
            event = codec.decode(packet)
        except PeerError as e:
            self.log.error("nats.bad_packet", error=e.detail)
            return
        if isinstance(event, codec.Subscribe):
            self.host.upstream_interest(event.pattern, True)
        elif isinstance(event, codec.Unsubscribe):
            self.host.upstream_interest(event.pattern, False)
        elif isinstance(event, codec.Control):
            self._control(event.key, event.payload or b"", packet)

    def _control(self, key: bytes, payload: bytes, packet: bytes) -> None:
        try:
            if key == linkwire.STATS:
                self.stats = linkwire.decode_stats(payload)
            elif key == linkwire.LOG:
                self.log_record(payload)
            elif key == linkwire.SETTLED:
                self._settled()
            elif key == linkwire.SYNCED:
                self.synced = True
            elif key == linkwire.STATE and self.cut is not None:
                self.cut.state(packet, payload)
            elif key == linkwire.FINAL and self.cut is not None:
                self.cut.final(packet, payload)
            elif key == linkwire.TOOK_OVER:
                self.log.info("nats.link_took_over", **linkwire.decode_took_over(payload))
        except PeerError as e:
            self.log.error("nats.bad_packet", error=e.detail)

    def _settled(self) -> None:
        if not self.holding:
            return
        self.holding = False
        self.host.upstream_interest(EVERYTHING, False)
        for pattern, count in self.adopted.items():
            for _ in range(count):
                self.host.upstream_interest(pattern, False)
        self.adopted = {}

    def lost(self, conn: Connection, reason: str, detail: str) -> None:
        """The link process's end closed: it has ended (or is ending); unless
        the bus stops, a new one starts after a back-off, once it is reaped."""
        conn.detach()
        if self.stopping:
            return
        cut = self.cut
        if cut is not None:
            if cut.old_gone(f"{reason}: {detail}" if detail else reason):
                return  # the old link left after its state: the switch follows
            if conn.fd >= 0:
                return  # the cut failed, and a fresh link runs already
        self.stats = linkwire.Stats(state="starting", engine=self.stats.engine)
        self._forget_interest()
        self._ended(reason, detail, time.monotonic() + LINGER)

    def _ended(self, reason: str, detail: str, deadline: float) -> None:
        """Log how the process ended once it is reaped (polled, never waited
        for), then schedule its successor; one that runs on past ``LINGER``
        with its socket closed is killed."""
        proc = self.proc
        old = self.old
        if old is not None:  # taken over, not our child: seen through its pidfd
            if old.alive() and time.monotonic() < deadline:
                self._reaper = gevent.get_hub().loop.timer(REAP_POLL)
                self._reaper.start(self._ended, reason, detail, deadline)
                return
            ended = "ended" if not old.alive() else "killed: its socket closed but it ran on"
            old.kill()
            self._forget_old()
            proc = None
        elif proc is not None and proc.poll() is None:
            if time.monotonic() < deadline:
                self._reaper = gevent.get_hub().loop.timer(REAP_POLL)
                self._reaper.start(self._ended, reason, detail, deadline)
                return
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            self._reap_later(proc)
            ended = "killed: its socket closed but it ran on"
        elif old is None:
            ended = "not started" if proc is None else children.how_it_ended(proc.returncode)
        if self.stopping:
            return
        self.log.error(
            "nats.link_lost",
            reason=reason,
            detail=detail,
            process=ended,
            restart_in=self._next_delay(),
        )
        self._schedule_restart()

    def _next_delay(self) -> float:
        if time.monotonic() - self._since >= RESTART_RESET:
            self._delay = RESTART_MIN
        return self._delay

    def _schedule_restart(self) -> None:
        delay = self._next_delay()
        self._delay = min(self._delay * 2, RESTART_MAX)
        self._restart = gevent.get_hub().loop.timer(delay)
        self._restart.start(self._restarted)

    def _restarted(self) -> None:
        self._restart = None
        if self.stopping:
            return
        self.restarts += 1
        self._spawn()
        self.log.info(
            "nats.link_restarted",
            pid=self.proc.pid if self.proc is not None else None,
            restarts=self.restarts,
        )

    def _forget_interest(self) -> None:
        """Let go of every hold of the link, then hold every public key again."""
        index = self.host.router.index
        for pattern, count in index.patterns_of(self.conn).items():
            for _ in range(count):
                self.host.upstream_interest(pattern, False)
        self.adopted = {}
        self.host.upstream_interest(EVERYTHING, True)
        self.holding = True

    def forget(self, conn: Connection) -> None:
        """The link's connection closed for good."""
        self._reap_later()

    def _reap_later(self, proc: subprocess.Popen[bytes] | None = None) -> None:
        """The process ends by itself (after its goodbye): reaped without waiting."""
        proc = proc or self.proc
        if proc is None or proc.poll() is not None:
            return
        self._reaper = gevent.get_hub().loop.timer(0.5)
        self._reaper.start(self._reap_later, proc)

    # --- what it shows ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The link as ``/healthz``, ``/clients``, ``top`` and the metrics show it."""
        s = self.stats
        count, nbytes = self.conn.queued
        pid = self.pid
        shape = children.footprint(pid) if pid is not None else None
        return {
            "host": self.name,
            "state": s.state,
            "connected": s.connected,
            "server": s.server,
            "engine": s.engine,
            "sent": s.sent,
            "sent_bytes": s.sent_bytes,
            "received": s.received,
            "received_bytes": s.received_bytes,
            "drops": {"queue_overflow": self.conn.dropped, **s.drops},
            "unconfirmed": s.unconfirmed,
            "unconfirmed_total": int(s.fleet.get("unconfirmed_total", 0)),
            "queued_messages": count,
            "queued_bytes": nbytes,
            "to_bus_queued": s.to_bus_queued,
            "reconnects": s.reconnects,
            "rtt": s.rtt_us / 1e6,
            "subscriptions": s.subscriptions,
            "remote_hosts": s.remote_hosts,
            "silent_hosts": int(s.fleet.get("silent_hosts", 0)),
            "remote_patterns": s.remote_patterns,
            "settled": not self.holding,
            "process": {
                "pid": pid,
                "threads": shape[0] if shape else 0,
                "rss_bytes": shape[1] if shape else 0,
                "restarts": self.restarts,
            },
            **fleet_state(s.fleet),
        }


def fleet_state(fleet: dict[str, Any]) -> dict[str, Any]:
    """What came from each other host (the link's ``fleet`` stats): delivered,
    lost, refused, by origin (docs/nats.md, "Every loss seen")."""
    rows: dict[str, list[int]] = {
        str(k): [int(n) for n in v] for k, v in dict(fleet.get("origin_rows", {})).items()
    }
    lost = sum(sum(r[1 : 1 + len(natsorigins.CAUSES)]) for r in rows.values())
    return {
        "seq": int(fleet.get("seq", 0)),
        "lost": lost,
        "origins": natsorigins.summarize(rows),
        # per label (hosts heard first, then "other"): every count by name
        "origin_counts": {k: dict(zip(natsorigins.ROW, r, strict=True)) for k, r in rows.items()},
        "malformed": int(fleet.get("malformed", 0)),
        "refused_announcements": int(fleet.get("refused_announcements", 0)),
        "own": int(fleet.get("own", 0)),
        "slow_consumer": int(fleet.get("slow_consumer", 0)),
    }
