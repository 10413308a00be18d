"""Routing-key and pattern rules: secret keys, credentials, reserved '!'.  No I/O.

What it owns: the rules of keys and patterns: secrets, credentials, the
reserved '!'.  What it may touch: nothing (pure functions).

docs/protocol.md, "Routing keys and wildcards" and "Credentials and secret keys":

* A key or pattern is split on '/' into segments.  A segment that is exactly
  ``!`` is reserved, except at the start of a *credential chain*: one or more
  groups ``!/cred/<gid>/<uid>/<pid>/`` at the very beginning.  On a relay the
  chain grows by one group per level (``!/cred/R/R/R/!/cred/g/u/p/x``).
* A key that starts with ``!/cred/`` is secret.  The index delivers it only
  through patterns that start with ``!/cred/`` -- and those are stored only
  after ``check_pattern`` has proved they belong to the subscriber.
* Anything else that uses a ``!`` segment is reserved: a subscription with it
  is refused (``reserved_pattern``), a publish with it is dropped
  (``reserved_key``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sbus_relay.accel import load_compiled

from .errors import PeerError

CRED = b"!/cred/"
WHOAMI = b"!/cred/whoami"
_BANG = b"!"
#: '!' as a number: ``int in bytes`` is a plain scan, while ``bytes in bytes``
#: first fails as a number, at the cost of a formatted exception each time
BANG = 0x21
_CRED_SEG = b"cred"
#: segments in one credential group: '!', 'cred', gid, uid, pid
_GROUP = 5


@dataclass(frozen=True, slots=True)
class Credentials:
    """A peer's identity from SO_PEERCRED at accept time (docs/protocol.md)."""

    gid: int
    uid: int
    pid: int

    def identity(self) -> bytes:
        """``!/cred/<gid>/<uid>/<pid>`` (no trailing '/')."""
        return b"!/cred/%d/%d/%d" % (self.gid, self.uid, self.pid)


def is_secret(key: bytes) -> bool:
    """True for keys and patterns that start with ``!/cred/``."""
    return key.startswith(CRED)


def _chain_end(segs: list[bytes], *, digits: bool) -> int | None:
    """Index of the first segment after the leading credential chain.

    Returns None if a ``!`` segment appears anywhere it is not allowed: at the
    start of a group that is not a full ``!/cred/a/b/c/`` followed by at least
    one more segment, or after the chain.  With ``digits``, group fields must
    match ``[0-9]*`` (keys, per the README's regex); patterns may use any
    non-'!' bytes there (the rest of a secret pattern may name another
    process's identity with wildcards).
    """
    i = 0
    n = len(segs)
    while i < n and segs[i] == _BANG:
        if i + _GROUP >= n or segs[i + 1] != _CRED_SEG:
            return None
        for field in segs[i + 2 : i + _GROUP]:
            if field == _BANG or (digits and field and not field.isdigit()):
                return None
        i += _GROUP
    for seg in segs[i:]:
        if seg == _BANG:
            return None
    return i


def valid_key(key: bytes) -> bool:
    """False if a publish key uses '!' in a reserved way (docs/protocol.md)."""
    if BANG not in key:  # the common case costs one scan in C
        return True
    return _chain_end(key.split(b"/"), digits=True) is not None


def check_pattern(pattern: bytes, creds: Credentials, prefix: bytes = b"") -> bytes:
    """Validate a subscription pattern; return the pattern to store.

    ``prefix`` is this server's identity chain plus '/' on a relay (docs/protocol.md, "Relays"),
    empty on a master.  Secret patterns must read
    ``<prefix>!/cred/<gid>/<uid>/<pid>/<rest>`` with each field the client's
    own or empty; empty fields are filled in; a peer with pid 0 (outside our
    PID namespace) holds no secret pattern.  Raises ``PeerError`` with reason
    ``secret_refused`` or ``reserved_pattern``.
    """
    if BANG not in pattern:
        return pattern
    segs = pattern.split(b"/")
    if not is_secret(pattern):
        if _chain_end(segs, digits=False) != 0:
            raise PeerError("reserved_pattern", "'!' is reserved")
        return pattern
    if not creds.pid:
        # The kernel reports pid 0 for a peer outside our PID namespace: every
        # such peer of one user would share an identity and read the others' secrets.
        raise PeerError("secret_refused", "pid 0: the peer is outside this server's PID namespace")
    if not pattern.startswith(prefix):
        raise PeerError("secret_refused", "secret pattern without this server's prefix")
    own = pattern[len(prefix) :]
    if not own.startswith(CRED):
        raise PeerError("secret_refused", "secret pattern must follow the server's prefix")
    parts = own.split(b"/", _GROUP)
    if len(parts) <= _GROUP:
        raise PeerError("secret_refused", "truncated secret pattern")
    filled = []
    for field, mine in zip(parts[2:_GROUP], (creds.gid, creds.uid, creds.pid), strict=True):
        if field and field != b"%d" % mine:
            raise PeerError("secret_refused", "credentials are not the subscriber's")
        filled.append(b"%d" % mine)
    rest = parts[_GROUP]
    if BANG in rest and _chain_end(rest.split(b"/"), digits=False) is None:
        raise PeerError("reserved_pattern", "'!' is reserved")
    return prefix + CRED + b"/".join(filled) + b"/" + rest


load_compiled(globals(), "sbus_relay.protocol._c_keys")
