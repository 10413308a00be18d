"""Bus addresses: parse them, listen on them, connect to them (docs/protocol.md).

What it owns: what an address means, binding, connecting, stale socket files
and SO_PEERCRED.  What it may touch: sockets and socket files.

An address is one of

    /some/path                    a socket file
    /dev/unix/abstract            bind a random abstract name (listen only)
    /dev/unix/abstract/<hex>      an abstract name, as the hex of the whole sun_path
    /dev/fd/N                     an inherited socket (listening or not)

Abstract names follow the reference ``sbusd``: the name is the whole 108-byte
``sun_path``, leading NUL included and NUL-padded.  Linux compares abstract
names by length as well as bytes, so ``\\0foo`` and ``\\0foo`` padded to 108
bytes are *different* sockets; we always bind and connect with the padded
108 bytes so that we meet the reference tools (and each other).  Python takes
an abstract name as ``bytes`` starting with NUL and passes its exact length.

The server never parses addresses (design.md); the CLI turns text into a
listening socket here and hands it over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from sbus_relay.protocol.errors import AddressError
from sbus_relay.protocol.limits import (
    ABSTRACT_BIND_ATTEMPTS,
    LISTEN_BACKLOG,
    SEND_BUFFER,
    STALE_PROBE_TIMEOUT,
    SUN_PATH_SIZE,
)

#: The reference sbusd's default address (docs/protocol.md, Addresses).
DEFAULT_ADDRESS = "/run/sbus.socket"
#: Environment variable naming the bus for clients: the client commands and the
#: Spark data source (like NATS_URL).
ADDRESS_ENV = "SBUS_ADDRESS"
#: Prefix of abstract addresses; alone it means "pick a random name".
ABSTRACT_PREFIX = "/dev/unix/abstract"
#: Prefix of inherited-descriptor addresses.
FD_PREFIX = "/dev/fd/"
#: Socket file mode without -g/-o: only the owner may connect (docs/protocol.md, Credentials).
MODE_OWNER = 0o700
#: Added by -g: the socket's group may connect.
MODE_GROUP = 0o070
#: Added by -o: everyone may connect.
MODE_OTHER = 0o007


#: First descriptor systemd passes (SD_LISTEN_FDS_START).
SD_LISTEN_FDS_START = 3
#: Random bytes in a generated abstract name, written as hex after "sbus-".
_RANDOM_NAME_BYTES = 8
#: Suffix of the lock file beside a socket path: with -r, checking the old
#: file, removing it and binding happen under an flock on it, so that two
#: servers started at once on one stale path can never both bind.  The holder
#: removes it once bound (``_locked``), so none is left behind.
LOCK_SUFFIX = ".lock"

#: struct ucred, as SO_PEERCRED returns it: pid, uid, gid.
_UCRED = struct.Struct("3i")

Kind = Literal["path", "abstract", "fd"]


@dataclass(frozen=True)
class Address:
    """A parsed address.  ``name`` is the 108-byte sun_path of an abstract
    address, or ``None`` for "bind a random one"; ``fd`` is set for ``/dev/fd/N``."""

    kind: Kind
    path: str = ""
    name: bytes | None = None
    fd: int = -1

    def __str__(self) -> str:
        if self.kind == "path":
            return self.path
        if self.kind == "fd":
            return f"{FD_PREFIX}{self.fd}"
        return ABSTRACT_PREFIX if self.name is None else format_abstract(self.name)


def named_address(given: str | None) -> str:
    """The bus a client means: ``given``, else $SBUS_ADDRESS, else DEFAULT_ADDRESS.

    An empty ``given`` is an address too (parse_address refuses it), and so is
    an empty $SBUS_ADDRESS: a variable that is set names the bus, so set but
    empty is an AddressError, never "use the default".
    """
    if given is not None:
        return given
    named = os.environ.get(ADDRESS_ENV)
    if named is None:
        return DEFAULT_ADDRESS
    if not named:
        raise AddressError(
            f"${ADDRESS_ENV} is set but empty: unset it, or set it to the bus's address"
        )
    return named


def parse_address(text: str) -> Address:
    """Parse an address (see the module docstring); raise ``AddressError``."""
    if not text:
        raise AddressError("empty address")
    if "\0" in text:
        raise AddressError(f"address {text!r} contains a NUL byte")
    if text == ABSTRACT_PREFIX or text == ABSTRACT_PREFIX + "/":
        return Address("abstract")
    if text.startswith(ABSTRACT_PREFIX + "/"):
        return Address("abstract", name=_parse_abstract_hex(text[len(ABSTRACT_PREFIX) + 1 :]))
    if text.startswith(FD_PREFIX):
        digits = text[len(FD_PREFIX) :]
        if not digits.isascii() or not digits.isdigit():
            raise AddressError(f"{text!r}: expected {FD_PREFIX}N with N a descriptor number")
        return Address("fd", fd=int(digits))
    if len(os.fsencode(text)) > SUN_PATH_SIZE:
        raise AddressError(f"socket path {text!r} is longer than {SUN_PATH_SIZE} bytes")
    return Address("path", path=text)


def _parse_abstract_hex(hex_text: str) -> bytes:
    try:
        raw = bytes.fromhex(hex_text)
    except ValueError:
        raise AddressError(f"abstract name {hex_text!r} is not hexadecimal") from None
    if not raw or raw[0] != 0:
        # The hex is the whole sun_path, so it starts with the NUL that makes
        # the name abstract; anything else is a path written the wrong way.
        raise AddressError("an abstract name's hex must start with 00 (the leading NUL)")
    if len(raw) > SUN_PATH_SIZE:
        raise AddressError(f"abstract name is {len(raw)} bytes; sun_path holds {SUN_PATH_SIZE}")
    return raw.ljust(SUN_PATH_SIZE, b"\0")


def format_abstract(name: bytes) -> str:
    """``/dev/unix/abstract/<hex of the whole 108-byte sun_path>`` for ``name``."""
    if not name or name[0] != 0:
        raise AddressError("an abstract name starts with a NUL byte")
    if len(name) > SUN_PATH_SIZE:
        raise AddressError(f"abstract name is longer than {SUN_PATH_SIZE} bytes")
    return ABSTRACT_PREFIX + "/" + name.ljust(SUN_PATH_SIZE, b"\0").hex()


def _new_socket() -> socket.socket:
    # Looked up on the module at call time so that gevent's monkey-patching
    # (which replaces socket.socket) gives cooperative sockets.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # A SEQPACKET send larger than the send buffer fails with EMSGSIZE; the
    # default (~208 KiB) is below MAX_PACKET.  Accepted sockets inherit it.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    return sock


def socket_mode(group_access: bool, other_access: bool) -> int:
    """The socket file's mode for -g (``group_access``) and -o (``other_access``)."""
    return MODE_OWNER | (MODE_GROUP if group_access else 0) | (MODE_OTHER if other_access else 0)


def listen(
    address: Address,
    *,
    mode: int = MODE_OWNER,
    remove_stale: bool = False,
    warn: Callable[[str], None] | None = None,
) -> tuple[socket.socket, str]:
    """Bind and listen on ``address``; return the socket and its printable address.

    A path is created with ``mode`` (no window with a wider mode).  An existing
    file is an error, unless ``remove_stale``: then a socket nobody answers on,
    or a file of any other kind (``warn`` is told), is removed first, as the
    reference ``sbusd -r`` does; a live server's socket is never taken over.
    With ``remove_stale`` the check, the removal and the bind hold an flock on
    ``<path>.lock``, which is removed again once the socket is bound.
    The printable address of a path is absolute, so it can still be removed
    after the daemon has changed directory to ``/``.
    """
    if address.kind == "fd":
        sock = adopt_listener(address.fd)
        return sock, printable_name(sock) or str(address)
    if address.kind == "abstract":
        return _listen_abstract(address.name)
    path = os.path.abspath(address.path)
    if os.path.isdir(path):
        raise AddressError(_is_directory(path))
    if not remove_stale:
        if os.path.lexists(path):
            raise AddressError(_taken(path))
        return _bind_path(address.path, path, mode), path
    with _locked(path + LOCK_SUFFIX):
        if os.path.lexists(path):
            _remove_stale(path, warn or (lambda _line: None))
        return _bind_path(address.path, path, mode), path


def _is_directory(path: str) -> str:
    """Why a directory cannot be listened on: -r never removes one."""
    example = os.path.join(path, "sbus.socket")
    return f"{path} is a directory, not a socket path: give a file name in it (-a {example})"


def _taken(path: str) -> str:
    """Why ``path`` cannot be listened on without -r: a running bus is not stale."""
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode) and answers(path):
            return f"a bus is already running on {path}"
    return f"{path} already exists (use -r to remove a stale socket)"


def _bind_path(given: str, path: str, mode: int) -> socket.socket:
    sock = _new_socket()
    try:
        # bind(2) creates the file as 0777 & ~umask: set the umask so the file is
        # never wider than ``mode``, then chmod to add what the umask cannot.
        old_umask = os.umask(0o777 & ~mode)
        try:
            sock.bind(os.fsencode(given))
        finally:
            os.umask(old_umask)
        os.chmod(path, mode)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise AddressError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return sock


@contextlib.contextmanager
def _locked(lock_path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path``; remove the file when done.

    Removing a lock file is safe only because every taker checks, once it
    holds the lock, that the file it locked is still the one at the path (a
    taker that waited on a file its holder has since removed tries again).
    """
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AddressError(f"cannot open lock file {lock_path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, lock_path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed or replaced while we waited: lock the current one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)  # still under the lock: nobody holds this file
        os.close(fd)  # releases the lock


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open at ``fd``."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


def _listen_abstract(name: bytes | None) -> tuple[socket.socket, str]:
    attempts = 1 if name is not None else ABSTRACT_BIND_ATTEMPTS
    for _ in range(attempts):
        candidate = name
        if candidate is None:
            random_part = os.urandom(_RANDOM_NAME_BYTES).hex().encode()
            candidate = (b"\0sbus-" + random_part).ljust(SUN_PATH_SIZE, b"\0")
        sock = _new_socket()
        try:
            sock.bind(candidate)
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE and name is None:
                continue
            raise AddressError(
                f"cannot listen on {format_abstract(candidate)}: {exc.strerror or exc}"
            ) from exc
        return sock, format_abstract(candidate)
    raise AddressError(f"no free random abstract name after {ABSTRACT_BIND_ATTEMPTS} tries")


def _remove_stale(path: str, warn: Callable[[str], None]) -> None:
    """Unlink ``path`` unless it is a socket a server answers on (-r, docs/protocol.md)."""
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AddressError(f"cannot remove {path}: {exc.strerror or exc}") from exc
        warn(f"removed {path}, which was not a socket")
        return
    try:
        live = answers(path)
    except OSError as exc:
        if exc.errno == errno.EPROTOTYPE:
            # A socket of another type (e.g. a stream server) lives there.
            raise AddressError(f"{path} is a socket of another kind in use") from exc
        raise AddressError(f"cannot tell whether {path} is stale: {exc}") from exc
    if live:
        raise AddressError(f"{path} is in use by a running server; not removing it")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def answers(path: str) -> bool:
    """Whether a server accepts connections on the socket file ``path`` (one
    connect, at most STALE_PROBE_TIMEOUT); False when nobody listens there.
    Any other failure (a socket of another kind, a timeout) is raised."""
    probe = _new_socket()
    probe.settimeout(STALE_PROBE_TIMEOUT)
    try:
        probe.connect(os.fsencode(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    finally:
        probe.close()
    return True


def adopt_listener(fd: int) -> socket.socket:
    """Wrap inherited descriptor ``fd`` as a listening SEQPACKET socket.

    An inherited socket that is bound but not yet listening is made to listen,
    as the reference ``sbusd`` does for ``/dev/fd/N``.
    """
    sock = _adopt(fd)
    try:
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise AddressError(f"{FD_PREFIX}{fd}: cannot listen: {exc.strerror or exc}") from exc
    return sock


def _adopt(fd: int) -> socket.socket:
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise AddressError(f"{FD_PREFIX}{fd}: not an open socket: {exc.strerror or exc}") from exc
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
        sock.detach()  # not ours to close
        raise AddressError(f"{FD_PREFIX}{fd}: not a unix SOCK_SEQPACKET socket")
    # Inherited descriptors must not leak further into our own children.
    sock.set_inheritable(False)
    return sock


def connect(address: Address | str, *, timeout: float | None = None) -> socket.socket:
    """A blocking SEQPACKET socket connected to ``address``.

    ``/dev/fd/N`` here means an inherited, already connected socket.
    ``timeout`` bounds the connect itself (a listener that does not accept and
    whose backlog is full holds a connect for ever); the socket is blocking after.
    """
    if isinstance(address, str):
        address = parse_address(address)
    if address.kind == "fd":
        return _adopt(address.fd)
    if address.kind == "abstract" and address.name is None:
        raise AddressError(f"{ABSTRACT_PREFIX} picks a name when listening; connect needs one")
    target: bytes = address.name if address.name is not None else os.fsencode(address.path)
    sock = _new_socket()
    try:
        sock.settimeout(timeout)
        sock.connect(target)
        sock.settimeout(None)
    except OSError as exc:
        sock.close()
        why = f"{exc.strerror or exc}"
        if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
            why = _not_a_bus(address) or (
                f"{why} (is a bus running there? start one with 'sbus-relay serve -a ADDRESS -f')"
            )
        raise AddressError(f"cannot connect to {address}: {why}") from exc
    return sock


def _not_a_bus(address: Address) -> str | None:
    """What a path that refused a connection is, when it is no socket at all
    (a directory, a regular file: the kernel says only "Connection refused")."""
    if address.kind != "path":
        return None
    try:
        kind = os.stat(address.path).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(kind):
        return None
    if stat.S_ISDIR(kind):
        what = "a directory, not a socket"
    elif stat.S_ISREG(kind):
        what = "a regular file, not a socket"
    else:
        what = "not a socket"
    return f"{address.path} is {what} (a bus's address is the socket file it listens on)"


def systemd_listeners() -> list[socket.socket]:
    """Sockets passed by systemd socket activation (LISTEN_FDS/LISTEN_PID).

    Like ``sd_listen_fds(1)``, the variables are removed so that children do
    not mistake the sockets for theirs.  Empty when none were passed to us.
    """
    pid_text = os.environ.get("LISTEN_PID", "")
    count_text = os.environ.get("LISTEN_FDS", "")
    if not count_text:
        return []
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    if not pid_text.isdigit() or int(pid_text) != os.getpid():
        return []  # meant for another process (e.g. our parent)
    if not count_text.isdigit():
        raise AddressError(f"LISTEN_FDS={count_text!r} is not a number")
    fds = range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count_text))
    return [adopt_listener(fd) for fd in fds]


def printable_name(sock: socket.socket) -> str:
    """The address a socket is bound to, in our address syntax ("" if unbound)."""
    name = sock.getsockname()
    if not name:
        return ""
    if isinstance(name, bytes):
        if name[:1] == b"\0":
            return format_abstract(name)
        return os.fsdecode(name)
    return str(name)


def peer_ucred(sock: socket.socket) -> tuple[int, int, int]:
    """The peer's (pid, uid, gid) as the kernel saw them at connect (SO_PEERCRED).

    The one reader of SO_PEERCRED: the server's admission, the relay's
    self-connection check and the supervisor's "is it my child listening"."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return int(pid), int(uid), int(gid)
