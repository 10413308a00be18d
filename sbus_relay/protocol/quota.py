"""Quotas: what one connection and one user may hold.  No I/O.

What it owns: every per-user and per-client limit decision, and a user's
Account.  What it may touch: nothing but its accounts.

Modelled on dbus-broker's per-UID accounting: every user (uid from
SO_PEERCRED) has an ``Account`` that sums what all its connections hold --
connections, stored patterns, the bytes of those patterns and the bytes
queued for it -- so one user can exhaust only their own share, never lock the
others out.  Limits come from ``Quota`` (per user) and ``ClientLimits`` (per
connection); the server asks ``refuse_connection`` and ``refuse_pattern`` and
carries out the answer (a refusal is logged, counted and, for a pattern,
disconnects the client -- except a relay, which is never cut off for what
one of its clients did: the pattern is refused and the relay kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from sbus_relay.accel import load_compiled

from . import limits


@dataclass(frozen=True, slots=True)
class Quota:
    """One user's share of the server (all its connections together)."""

    connections: int = limits.USER_CONNECTIONS
    patterns: int = limits.USER_PATTERNS
    pattern_bytes: int = limits.USER_PATTERN_BYTES
    queued_bytes: int = limits.USER_QUEUED_BYTES


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one connection may hold."""

    patterns: int = limits.MAX_PATTERNS_PER_CLIENT
    #: a relay's connection carries all its clients' patterns: its own, larger limit
    relay_patterns: int = limits.MAX_PATTERNS_PER_RELAY
    pattern_bytes: int = limits.MAX_PATTERN_BYTES_PER_CLIENT
    pattern_length: int = limits.MAX_PATTERN_LENGTH
    pattern_segments: int = limits.MAX_PATTERN_SEGMENTS


class Account:
    """What all the connections of one user hold right now."""

    __slots__ = ("connections", "max_bytes", "nbytes", "pattern_bytes", "patterns", "quota")

    def __init__(self, quota: Quota | None = None) -> None:
        self.quota = quota if quota is not None else Quota()
        #: the user's queued-bytes limit, read on the flood-control path
        self.max_bytes = self.quota.queued_bytes
        self.nbytes = 0
        self.connections = 0
        self.patterns = 0
        self.pattern_bytes = 0


def unlimited() -> Account:
    """An account that no quota binds (queues that belong to nobody in particular)."""
    big = 1 << 62
    return Account(Quota(big, big, big, big))


def refuse_connection(account: Account) -> str | None:
    """Why a new connection of this user is refused, or None to admit it."""
    if account.connections >= account.quota.connections:
        return "user_connection_quota"
    return None


def refuse_pattern(
    pattern: bytes,
    held: int,
    held_bytes: int,
    account: Account,
    client: ClientLimits,
    *,
    relay: bool,
) -> str | None:
    """Why a new distinct pattern is refused, or None to store it.

    ``held`` and ``held_bytes`` are what the connection already holds.
    """
    size = len(pattern)
    if size > client.pattern_length:
        return "pattern_too_long"
    if pattern.count(b"/") >= client.pattern_segments:
        return "pattern_too_deep"
    if held >= (client.relay_patterns if relay else client.patterns):
        return "too_many_patterns"
    if held_bytes + size > client.pattern_bytes and not relay:
        return "too_many_pattern_bytes"
    quota = account.quota
    if account.patterns >= quota.patterns or account.pattern_bytes + size > quota.pattern_bytes:
        return "user_pattern_quota"
    return None


load_compiled(globals(), "sbus_relay.protocol._c_quota")
