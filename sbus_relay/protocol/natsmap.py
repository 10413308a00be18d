"""sbus keys and patterns as NATS subjects and subscriptions.  No I/O.

Theory of operation (docs/nats.md, "The mapping"):

* A key is split on '/' into segments, and each segment becomes one NATS
  token, so that NATS's ``*`` (exactly one token) is sbus's ``*`` (one whole
  segment, possibly empty) and NATS's trailing ``>`` (one or more tokens) is
  sbus's trailing '/' (that '/' and anything after it).
* A token must be non-empty, hold no '.', no whitespace, and not be ``*`` or
  ``>`` alone; sbus segments may hold any byte but NUL and '/', and may be
  empty.  So a segment is written in a safe alphabet: letters, digits and
  ``-_+=:@,~`` stand for themselves, every other byte is ``%HH`` (upper-case
  hex), and the empty segment is ``%`` alone (which no other segment can be).
  Bytes that are not UTF-8, '.', spaces, '*' and '>' all come out as ``%HH``.
* A subject is ``<prefix>.<domain>.<token>...``: the domain is ``k`` for a
  public key and ``c`` for a secret one (``!/cred/...``), so that ``''``
  (``<prefix>.k.>``) and every other public wildcard never see a secret
  key, as in the bus itself (docs/protocol.md, "Credentials and secret
  keys").  ``<prefix>._i.<host>`` and ``<prefix>._q`` carry the hosts' interest
  (``protocol.natsinterest``); no key's subject can be one of them.
* A pattern maps to one NATS subscription.  Literal segments, ``*``, a
  trailing '/' and ``''`` map exactly.  A segment ``ab*`` (a prefix of a
  segment) has no NATS form: it maps to ``*``, a superset that the bus
  receiving the message narrows with its own index (``relaxed``).  A
  segment ``a*b`` never matches anything (``*`` is greedy): such a pattern
  maps to no subscription at all.
"""

from __future__ import annotations

from .index import canonical
from .keys import is_secret

PUBLIC = b"k"
SECRET = b"c"
INTEREST = b"_i"
SNAPSHOT = b"_q"
LONG = b"_l"

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+=:@,~")
_HEX = b"0123456789ABCDEF"
_EMPTY = b"%"
#: each byte's token form, built once: a table lookup per byte
_FORM = tuple(bytes((b,)) if b in _SAFE else b"%%%02X" % b for b in range(256))


class MappingError(ValueError):
    """A subject that no key maps to (not ours, or malformed)."""


def encode_segment(segment: bytes) -> bytes:
    """One sbus segment as one NATS token."""
    if not segment:
        return _EMPTY
    form = _FORM
    return b"".join([form[b] for b in segment])


def decode_token(token: bytes) -> bytes:
    """The segment a token stands for; ``MappingError`` if no segment maps to it."""
    if token == _EMPTY:
        return b""
    out = bytearray()
    i = 0
    n = len(token)
    while i < n:
        b = token[i]
        if b == 0x25:  # '%'
            if i + 3 > n:
                raise MappingError("malformed escape")
            hi = _HEX.find(token[i + 1])
            lo = _HEX.find(token[i + 2])
            if hi < 0 or lo < 0:
                raise MappingError("malformed escape")
            value = hi * 16 + lo
            if value in _SAFE:
                raise MappingError("needless escape")  # one spelling per segment
            out.append(value)
            i += 3
        elif b in _SAFE:
            out.append(b)
            i += 1
        else:
            raise MappingError("byte outside the token alphabet")
    return bytes(out)


def check_prefix(prefix: str) -> str:
    """The reason ``prefix`` cannot head subjects, or '' if it can."""
    if not prefix:
        return "empty"
    for token in prefix.split("."):
        if not token:
            return "an empty token (two dots, or a dot at an end)"
        if token in ("*", ">"):
            return "a wildcard token"
        if any(c.isspace() or not c.isprintable() or ord(c) > 126 for c in token):
            return "a space, a control or a non-ASCII character"
    return ""


class SubjectMap:
    """Keys to subjects and back, patterns to subscriptions, under one prefix."""

    def __init__(self, prefix: str) -> None:
        reason = check_prefix(prefix)
        if reason:
            raise ValueError("subject prefix %r: %s" % (prefix, reason))
        self.prefix = prefix.encode("ascii")
        self._public = self.prefix + b"." + PUBLIC + b"."
        self._secret = self.prefix + b"." + SECRET + b"."
        #: every key's subject begins with one of these
        self.everything = self.prefix + b"." + PUBLIC + b".>"
        self.interest_all = self.prefix + b"." + INTEREST + b".*"
        self.snapshot = self.prefix + b"." + SNAPSHOT
        #: where a key whose subject is too long for NATS goes, the key in the payload
        self.long = self.prefix + b"." + LONG

    def interest_of(self, host: str) -> bytes:
        """The subject ``host`` announces its interest on."""
        return self.prefix + b"." + INTEREST + b"." + encode_segment(host.encode("utf-8"))

    def subject(self, key: bytes) -> bytes:
        """The one subject of ``key``."""
        head = self._secret if is_secret(key) else self._public
        form = _FORM
        # one pass over the key: '/' becomes '.', an empty segment '%'
        out = [head]
        start = True
        for b in key:
            if b == 0x2F:
                if start:
                    out.append(_EMPTY)
                out.append(b".")
                start = True
            else:
                out.append(form[b])
                start = False
        if start:
            out.append(_EMPTY)
        return b"".join(out)

    def key(self, subject: bytes) -> bytes:
        """The key whose subject this is; ``MappingError`` if none is."""
        if subject.startswith(self._public):
            body = subject[len(self._public) :]
        elif subject.startswith(self._secret):
            body = subject[len(self._secret) :]
        else:
            raise MappingError("not a key's subject")
        key = b"/".join([decode_token(t) for t in body.split(b".")])
        if is_secret(key) != subject.startswith(self._secret):
            raise MappingError("key in the wrong domain")
        if b"\0" in key:
            raise MappingError("a NUL, which no key holds")
        return key

    def subscription(self, pattern: bytes) -> bytes | None:
        """The NATS subscription for ``pattern``: exactly its keys, or (for a
        ``ab*`` segment) a superset of them; None if it matches no key."""
        r = relaxed(pattern)
        if r is None:
            return None
        if r == b"":
            return self.everything
        head = self._secret if is_secret(r) else self._public
        tail = r.endswith(b"/")
        segs = (r[:-1] if tail else r).split(b"/")
        tokens = [b"*" if s == b"*" else encode_segment(s) for s in segs]
        if tail:
            tokens.append(b">")
        return head + b".".join(tokens)


def relaxed(pattern: bytes) -> bytes | None:
    """The pattern whose keys are exactly what ``pattern``'s NATS subscription
    carries: ``pattern`` with each ``ab*`` segment widened to ``*``; None if
    ``pattern`` can match nothing (a segment with bytes after its '*')."""
    pattern = canonical(pattern)
    if b"*" not in pattern:
        return pattern
    tail = pattern.endswith(b"/")
    segs = (pattern[:-1] if tail else pattern).split(b"/")
    for i, seg in enumerate(segs):
        star = seg.find(b"*")
        if star < 0:
            continue
        if star != len(seg) - 1:
            return None
        segs[i] = b"*"
    return b"/".join(segs) + (b"/" if tail else b"")


def exact(pattern: bytes) -> bool:
    """Whether ``pattern``'s NATS subscription carries exactly its keys."""
    return relaxed(pattern) == canonical(pattern)


def long_payload(key: bytes, payload: bytes) -> bytes:
    """What goes on ``<prefix>._l`` for a key whose subject is too long: the
    key, a NUL, the payload."""
    return key + b"\0" + payload


def split_long(data: bytes) -> tuple[bytes, bytes] | None:
    """(key, payload) of a message on ``<prefix>._l``; None if it is not one."""
    key, nul, payload = data.partition(b"\0")
    if not nul or not key:
        return None
    return key, payload
