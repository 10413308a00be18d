"""A live upgrade's NATS link, the bus's side: the cut from the link process
it took over to a new one of its own (docs/nats.md, "A live upgrade's link").

What it owns: the cut's phases and timers, the new link process until it
takes over (its socket, read and written here), the local pattern changes
held back meanwhile and the hand-overs of the bus that wait for the cut.
What it may touch: its ``NatsLink`` (the link's connection, how a link
process is started, the switch to the new one); the packets are
``protocol.linkwire``'s, the link processes' own parts ``link/handover``'s.

A new bus took the running link process over with its socket (the process
noticed nothing).  It replaces it at once by a link process of its own code
under the same incarnation, needing nothing of the old bus process:

* ``EXPORTING``: ``link/export`` asks the old link what to subscribe to;
* ``STARTING``: the new link starts with that record, subscribes and holds
  what comes; the local pattern changes are held back here meanwhile (the new
  link is told every local pattern once it serves);
* ``CUTTING``: once it says ``link/holding``, nothing more is written to the
  old link but ``link/cut``: what the bus publishes waits in the link's queue;
  the old link answers with its final state after its last message;
* ``SWITCHING``: that state goes to the new link as it came; once written,
  the link's connection is the new link's, and what waited goes to it.

A cut that cannot begin (the new link does not come up) is given up: the old
link serves on and the cut is tried again later.  A cut that fails once the
old link was told to stop (it died, or did not answer) ends both link
processes: a fresh link starts as after any link's death, a new incarnation,
and says so (``nats.link_handover_failed``): what the old link held then is
lost as in a link's death.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import gevent

from sbus_relay.protocol import linkwire
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.limits import MAX_PACKET

from .batchio import send_one

if TYPE_CHECKING:
    import subprocess

    from .connection import Connection

EXPORTING = "exporting"
STARTING = "starting"
CUTTING = "cutting"
SWITCHING = "switching"
#: Seconds between two ``link/export`` asked of an old link that has not
#: answered (it reads its bus only while NATS is there).
EXPORT_AGAIN = 5.0
#: Seconds the new link may take to hold what comes (start, join, subscribe):
#: past it the cut is given up and tried again later.
HOLDING_WAIT = 20.0
#: Seconds the old link may take from ``link/cut`` to its final state (its own
#: waits are bounded at 5 s: ``link/handover``); past it both are ended.
FINAL_WAIT = 8.0
#: Seconds before a cut given up is tried again, doubling up to the most.
RETRY_MIN = 2.0
RETRY_MAX = 60.0
#: Seconds between two tries to send ``link/cut`` (the old link's socket full,
#: or notices still owed to it).
CUT_POLL = 0.005
_READ = 1
_WRITE = 2


class Channel:
    """A socket of the bus read and written packet by packet, in order, never
    waiting: the new link's until it takes over."""

    def __init__(
        self, sock: socket.socket, on_packet: Callable[[bytes], None], on_closed: Callable[[], None]
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._on_packet = on_packet
        self._on_closed = on_closed
        self._out: deque[bytes] = deque()
        loop = gevent.get_hub().loop
        self._reader = loop.io(sock.fileno(), _READ)
        self._reader.start(self._readable)
        self._writer = loop.io(sock.fileno(), _WRITE)
        self._drained: Callable[[], None] | None = None
        self.closed = False

    def send(self, packet: bytes) -> None:
        self._out.append(packet)
        self._flush()

    def when_drained(self, then: Callable[[], None]) -> None:
        """Call ``then`` once everything sent so far is written."""
        self._drained = then
        self._flush()

    def _flush(self) -> None:
        out = self._out
        try:
            while out:
                self.sock.send(out[0])
                out.popleft()
        except BlockingIOError:
            if not self._writer.active:
                self._writer.start(self._flush)
            return
        except OSError:
            self._gone()
            return
        if self._writer.active:
            self._writer.stop()
        then, self._drained = self._drained, None
        if then is not None:
            then()

    def _readable(self) -> None:
        for _ in range(64):
            try:
                packet = self.sock.recv(MAX_PACKET)
            except BlockingIOError:
                return
            except OSError:
                packet = b""
            if not packet:
                self._gone()
                return
            self._on_packet(packet)
            if self.closed:
                return

    def _gone(self) -> None:
        if not self.closed:
            self.stop()
            self._on_closed()

    def stop(self) -> None:
        self.closed = True
        self._reader.stop()
        self._writer.stop()

    def release(self) -> int:
        """Stop, and give the socket's descriptor away (it is the caller's now)."""
        self.stop()
        return self.sock.detach()

    def close(self) -> None:
        self.stop()
        self.sock.close()


class OldLink:
    """The link process a new bus took over: not its child, known by a pidfd
    the old bus handed over with the sockets (it names that process and no
    other, in whatever PID namespace; its pid here, where it can be seen, is
    for showing only)."""

    def __init__(self, pidfd: int | None) -> None:
        self.fd = pidfd
        self.pid: int | None = None
        if pidfd is not None:
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as info,
            ):
                for line in info:
                    if line.startswith("Pid:"):
                        pid = int(line.split()[1])
                        self.pid = pid if pid > 0 else None  # (not in our namespace)

    def alive(self) -> bool:
        if self.fd is None:
            return False
        import select

        readable, _, _ = select.select([self.fd], [], [], 0)
        return not readable  # a pidfd is readable once its process has ended

    def kill(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def pidfd_of(pid: int) -> int | None:
    """A pidfd of process ``pid`` (a child of ours, or one we hold a pidfd of:
    its pid is its own), for the next bus; None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


class CutsLink(Protocol):
    """What a cut needs of its link (``natslink.NatsLink``; named here, not
    imported, for ``natslink`` imports this module)."""

    log: Any
    conn: Connection
    cut: LinkCut | None

    def start_process(
        self, adopt: bool = False, prefer: str = ""
    ) -> tuple[subprocess.Popen[bytes], socket.socket] | None: ...

    def log_record(self, payload: bytes) -> None: ...

    def switch(self, proc: subprocess.Popen[bytes], fd: int, seconds: float) -> None: ...

    def cut_later(self) -> None: ...

    def restart_afresh(self, why: str) -> None: ...

    def reap_later(self, proc: subprocess.Popen[bytes]) -> None: ...


class LinkCut:
    """One cut from the link process running now to a new one (the module's doc)."""

    def __init__(self, link: CutsLink) -> None:
        self.link = link
        self.log = link.log
        self.token = os.urandom(8).hex()
        self.phase = EXPORTING
        self.started = time.monotonic()
        #: local pattern changes held back from the old link (the new one is told all)
        self.withheld: dict[bytes, bool] = {}
        #: hand-overs of this bus asked meanwhile, held until the cut is done
        self.waiting: list[Connection] = []
        self._state = linkwire.Record()
        self._state_packets: list[bytes] = []
        self._final_last = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: Channel | None = None
        self.server = ""  # the old link's NATS server
        self._timer: Any = None

    # --- the phases ------------------------------------------------------------------

    def begin(self) -> None:
        """Ask the old link for what to subscribe to (again, while it does not answer)."""
        if self.phase != EXPORTING:
            return
        self.link.conn.reply(linkwire.encode_export(self.token))
        self._after(EXPORT_AGAIN, self.begin)

    def state(self, packet: bytes, payload: bytes) -> None:
        """A part of the old link's ``link/state``; the new link starts on the whole."""
        if self.phase != EXPORTING:
            return
        try:
            doc = self._state.add(payload)
        except PeerError as e:
            self.give_up(f"the old link's state: {e.detail}")
            return
        self._state_packets.append(packet)
        if doc is None:
            return
        packets, self._state_packets = self._state_packets, []
        if doc.get("token") != self.token:
            return  # the answer to an earlier bus's request: ours comes after it
        self.server = str(doc.get("server", ""))
        started = self.link.start_process(adopt=True, prefer=self.server)
        if started is None:
            self.give_up("the new link process could not be started")
            return
        self.proc, sock = started
        self.channel = Channel(sock, self._from_new, self._new_gone)
        for p in packets:
            self.channel.send(p)
        self.phase = STARTING
        self._after(HOLDING_WAIT, self._too_slow)

    def _from_new(self, packet: bytes) -> None:
        """What the new link says before it takes over: ``link/holding``, its log."""
        try:
            got = linkwire.control(packet)
        except PeerError:
            got = None
        if got is None:
            return
        key, payload = got
        if key == linkwire.HOLDING and self.phase == STARTING:
            server = payload.decode("utf-8", "replace")
            if server != self.server:
                self.log.info(
                    "nats.link_handover_servers",
                    old=self.server,
                    new=server,
                    hint="the new link is on another NATS server: what crosses the cut "
                    "between them may be lost, and is counted",
                )
            self._cut()
        elif key == linkwire.LOG:
            self.link.log_record(payload)

    def _cut(self) -> None:
        """Stop writing to the old link; its last packet is ``link/cut``."""
        if self.phase not in (STARTING, CUTTING):
            return
        self.phase = CUTTING
        conn = self.link.conn
        if conn.fd < 0:
            return  # (gone meanwhile: ``old_gone`` says what follows)
        if conn.owes_notices:  # notices owed to it go first
            self._after(CUT_POLL, self._cut)
            return
        conn.open = False  # what the bus publishes waits in the queue from now on
        conn.holding = True
        try:
            send_one(conn.fd, linkwire.CUT_PACKET)
        except BlockingIOError:
            self._after(CUT_POLL, self._cut)  # its socket is full: in a moment
            return
        except OSError:
            return  # gone: ``old_gone``
        self._after(FINAL_WAIT, self._no_final)

    def final(self, packet: bytes, payload: bytes) -> None:
        """A part of the old link's ``link/final``: to the new link as it came;
        once the last is written, the switch."""
        if self.phase != CUTTING or self.channel is None:
            return
        self.channel.send(packet)
        if linkwire.last_part(payload):
            self.phase = SWITCHING
            self._cancel_timer()
            self.channel.when_drained(self._switch)

    def _switch(self) -> None:
        if self.phase != SWITCHING or self.channel is None or self.proc is None:
            return
        fd = self.channel.release()
        self.channel = None
        self.link.switch(self.proc, fd, time.monotonic() - self.started)
        self._done()

    # --- what goes wrong ------------------------------------------------------------------

    def _after(self, seconds: float, then: Callable[[], None]) -> None:
        self._cancel_timer()
        self._timer = gevent.get_hub().loop.timer(seconds)
        self._timer.start(then)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None

    def _too_slow(self) -> None:
        if self.phase == STARTING:
            self.give_up(f"the new link did not join NATS within {HOLDING_WAIT:g} s")

    def _no_final(self) -> None:
        if self.phase == CUTTING:
            self.fail(f"the old link did not hand its state over within {FINAL_WAIT:g} s")

    def _new_gone(self) -> None:
        """The new link's socket closed before it took over (it died)."""
        if self.phase in (EXPORTING, STARTING):
            self.give_up("the new link process ended before it held anything")
        elif self.phase in (CUTTING, SWITCHING):
            self.fail("the new link process ended during the cut")

    def old_gone(self, why: str) -> bool:
        """The old link's socket closed (``why``): True if that is the end of the
        cut's business (the old link left after its state), else the cut failed."""
        if self.phase == SWITCHING:
            return True
        if self.phase in (EXPORTING, STARTING):
            self.give_up(f"the old link process ended ({why})", retry=False)
        else:
            self.fail(f"the old link process ended during the cut ({why})")
        return False

    def give_up(self, why: str, retry: bool = True) -> None:
        """Before the cut: the old link serves on (told what was held back);
        the cut is tried again later (``retry``)."""
        if self.phase not in (EXPORTING, STARTING):
            return
        self._end_new()
        link = self.link
        for pattern, present in self.withheld.items():
            link.conn.notify(pattern, present)
        self.withheld.clear()
        self.log.warning("nats.link_handover_postponed", reason=why, retry=retry)
        self._done()
        if retry:
            link.cut_later()

    def fail(self, why: str) -> None:
        """During the cut: both link processes end, and a fresh link starts (a new
        incarnation, as after a link's death): said, with what it may have lost."""
        if self.phase not in (CUTTING, SWITCHING):
            return
        self._end_new()
        self.log.error(
            "nats.link_handover_failed",
            reason=why,
            hint="a new link starts afresh; what the old link held then may be lost "
            "(as when a link process dies)",
        )
        self._done()
        self.link.restart_afresh(why)

    def _end_new(self) -> None:
        self._cancel_timer()
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.link.reap_later(self.proc)
            self.proc = None

    def _done(self) -> None:
        self._cancel_timer()
        self.phase = ""
        if self.link.cut is self:
            self.link.cut = None
        waiting, self.waiting = self.waiting, []
        for conn in waiting:
            conn.resume()  # its ``upgrade/take-over`` is handled again now

    def stop(self) -> None:
        """The bus stops: the new link goes (it never said a word on NATS)."""
        self._end_new()
        self.phase = ""

    # --- this bus handed over meanwhile --------------------------------------------------

    def hand_over(self, conn: Connection) -> bool:
        """This bus is asked to hand itself over: True to go on now (a cut not
        begun yet is given up: the next bus makes its own); False while the old
        link is being cut (``conn``'s request waits for the end of it)."""
        if self.phase in (EXPORTING, STARTING):
            self.give_up("this bus hands itself over", retry=False)
            return True
        if not self.phase:
            return True
        conn.hold()
        self.waiting.append(conn)
        return False

    def withhold(self, pattern: bytes, present: bool) -> bool:
        """A local pattern came or went: True if it is held back here (the new
        link is told every pattern when it serves; the old one, if it serves on)."""
        if self.phase in ("", EXPORTING):
            return False
        if pattern in self.withheld and self.withheld[pattern] != present:
            del self.withheld[pattern]
        else:
            self.withheld[pattern] = present
        return True

    def figures(self) -> dict[str, Any]:
        return {"phase": self.phase, "seconds": round(time.monotonic() - self.started, 3)}
