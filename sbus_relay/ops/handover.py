"""A live upgrade's wire: one process hands its bus to the next (docs/deploy.md, "Upgrade").

What it owns: the exchange of a live upgrade on the wire: the state's parts,
the descriptors, the answers.  What it may touch: the one connection it is
given, through protocol.control.

Theory of operation, after HAProxy's seamless reload and Envoy's hot restart,
but for every *established* connection too.  The new process starts, fully
initialised, and connects to the running bus as an ordinary client; it sends
``CMSG upgrade/take-over``.  The bus (``bus.server``), if that client runs as
the bus's own user (or root), freezes: it stops accepting and stops reading
and writing everyone.  Then, over that one connection:

1. ``CMSG upgrade/state\\0<header>``: JSON, how many parts and descriptors follow;
2. the parts, ``CMSG upgrade/part\\0<bytes>``, carrying the state (every
   connection's identity, subscriptions, modes, queued packets and counters:
   plain data, pickled) and, ``SCM_RIGHTS``, the descriptors themselves: the
   listening socket, the metrics socket, each client's socket, the upstream
   link's -- at most ``FDS_PER_PACKET`` a part;
3. the new process builds its bus from them, starts serving, and answers
   ``CMSG upgrade/done``; the old one closes its copies (the sockets live on
   in the new process: no peer sees a disconnect) and exits.

A new process that does not answer within ``UPGRADE_TIMEOUT`` (it crashed,
or hangs) leaves the old one in charge: it thaws and serves on, and says why.
The state is unpickled by an unpickler that knows only plain data types,
and only from the bus's own process (checked with SO_PEERCRED).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
from typing import Any

from sbus_relay.protocol import codec, control
from sbus_relay.protocol.errors import PeerError, UpgradeError
from sbus_relay.protocol.limits import (
    FDS_PER_PACKET,
    UPGRADE_CHUNK,
    UPGRADE_TIMEOUT,
)

from .addresses import connect, peer_ucred
from .children import process_status

#: Set in the environment of a process that is to take a running bus over: the
#: address that bus serves (under socket activation not its config's address).
TAKE_OVER_ENV = "SBUS_TAKE_OVER"
#: Set for a new process whose stderr is its predecessor's pipe (a daemon's
#: stderr goes nowhere): it lets go of that pipe once it serves.
UPGRADE_STDERR_ENV = "SBUS_TAKE_OVER_STDERR"
#: Set by ``sbus-relay up`` in its buses' environment: their upgrades are its to start.
SUPERVISED_ENV = "SBUS_SUPERVISED"

#: What a process that is to take a bus over sends it first.
TAKE_OVER = control.TAKE_OVER_PACKET
#: Longest packet of the exchange: a part and its head.
_LONGEST = control.UPGRADE_LONGEST


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, bytes, str, numbers, None: nothing that runs code."""

    def find_class(self, module: str, name: str) -> Any:
        raise UpgradeError(f"the hand-over held a {module}.{name}, not plain data")


def allowed(uid: int) -> bool:
    """Whether a client of this user may take the bus over (its own user, or root)."""
    return uid in (os.geteuid(), 0)


def send_state(sock: socket.socket, state: dict[str, Any], fds: list[int]) -> None:
    """Send ``state`` and ``fds`` to the process taking over (blocking, bounded by
    ``UPGRADE_TIMEOUT`` a packet)."""
    data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    parts = [data[i : i + UPGRADE_CHUNK] for i in range(0, len(data), UPGRADE_CHUNK)] or [b""]
    while len(parts) * FDS_PER_PACKET < len(fds):
        parts.append(b"")  # one more part to carry descriptors
    sock.settimeout(UPGRADE_TIMEOUT)
    header = {"parts": len(parts), "fds": len(fds), "bytes": len(data)}
    sock.sendall(control.upgrade_state(json.dumps(header).encode()))
    for i, part in enumerate(parts):
        carried = fds[i * FDS_PER_PACKET : (i + 1) * FDS_PER_PACKET]
        socket.send_fds(sock, [control.upgrade_part(part)], carried)


def wait_done(sock: socket.socket) -> None:
    """Wait for the new process to say it serves the bus now; ``UpgradeError`` if
    it does not within ``UPGRADE_TIMEOUT`` (it failed: the old process serves on)."""
    sock.settimeout(UPGRADE_TIMEOUT)
    try:
        answer = sock.recv(_LONGEST)
    except TimeoutError:
        raise UpgradeError(f"no answer within {UPGRADE_TIMEOUT:g} s") from None
    if _control(answer)[0] != control.UPGRADE_DONE:
        why = "it closed the connection" if not answer else f"it answered {_shown(answer)}"
        raise UpgradeError(f"the new process did not take over: {why}")


def take_over(address: str) -> tuple[dict[str, Any], list[int], socket.socket]:
    """Ask the bus at ``address`` for itself: its state, its descriptors, and the
    connection to answer ``done`` on (``confirm``)."""
    try:
        sock = connect(address)
    except OSError as exc:
        raise UpgradeError(f"no bus answers on {address}: {exc.strerror or exc}") from None
    fds: list[int] = []
    try:
        pid, uid, _ = peer_ucred(sock)
        if not allowed(uid):
            raise UpgradeError(f"the bus on {address} runs as uid {uid}, not as this user")
        sock.settimeout(UPGRADE_TIMEOUT)
        sock.sendall(TAKE_OVER)
        head = sock.recv(_LONGEST)
        key, payload = _control(head)
        if key != control.UPGRADE_STATE:
            raise UpgradeError(_refusal(head, address))
        header = json.loads(payload or b"")
        data = io.BytesIO()
        for _ in range(header["parts"]):
            packet, got, _flags, _addr = socket.recv_fds(sock, _LONGEST, FDS_PER_PACKET)
            fds += got
            key, payload = _control(packet)
            if key != control.UPGRADE_PART:
                raise UpgradeError("the hand-over was cut short")
            data.write(payload or b"")
        if len(fds) != header["fds"] or data.tell() != header["bytes"]:
            raise UpgradeError("the hand-over was cut short")
        state = _PlainData(io.BytesIO(data.getvalue())).load()
        state["from_pid"] = pid
        return state, fds, sock
    except (OSError, ValueError, UpgradeError) as exc:
        for fd in fds:
            os.close(fd)
        sock.close()
        if isinstance(exc, UpgradeError):
            raise
        raise UpgradeError(f"the hand-over failed: {exc}") from None


#: What ``confirm`` found: the old process read the confirmation and lets go;
#: it had ended (everything was handed over: this one serves on); it gave up
#: waiting (``wait_done``'s timeout) and serves on itself: this one must not.
CONFIRMED, PREDECESSOR_GONE, PREDECESSOR_SERVES = "confirmed", "gone", "serves"


def confirm(sock: socket.socket, from_pid: int) -> str:
    """Tell the old process (``from_pid``) that this one serves the bus now (it
    then exits); what came of it (``CONFIRMED``, ``PREDECESSOR_GONE`` or
    ``PREDECESSOR_SERVES``)."""
    try:
        sock.sendall(control.UPGRADE_DONE_PACKET)
    except OSError:
        status = process_status(from_pid)
        return PREDECESSOR_GONE if status is None or status[0] == "Z" else PREDECESSOR_SERVES
    finally:
        sock.close()
    return CONFIRMED


def _control(packet: bytes) -> tuple[bytes | None, bytes | None]:
    """The key and payload of a control message; (None, None) for anything else."""
    try:
        event = codec.decode(packet)
    except PeerError:
        return None, None
    if isinstance(event, codec.Control):
        return event.key, event.payload
    return None, None


def _shown(packet: bytes) -> str:
    """The first bytes of an unexpected answer, for an error message."""
    return repr(bytes(memoryview(packet)[:_SHOWN]))


#: Bytes of an unexpected answer an error message shows.
_SHOWN = 80


def _refusal(head: bytes, address: str) -> str:
    if not head:
        return f"the bus on {address} closed the connection (too old to hand itself over?)"
    key, payload = _control(head)
    said = (payload or b"").decode("utf-8", "replace")
    if key == control.UPGRADE_REFUSED:
        return f"the bus on {address} refused: {said}"
    if key == control.DISCONNECT:
        return f"the bus on {address} disconnected us: {said}"
    return f"the bus on {address} answered {_shown(head)}: it does not hand itself over"
