"""NATS subject matching, written from the NATS documentation's rules
("Subject-Based Messaging"), apart from anything in sbus_relay:

* a subject is tokens separated by '.'; a token is non-empty;
* ``*`` as a whole token of a subscription matches exactly one token;
* ``>`` as the last token of a subscription matches one or more tokens;
* every other token matches only itself, byte for byte;
* subjects may not contain whitespace.
"""

from __future__ import annotations


def valid_subject(subject: bytes, *, wildcards: bool) -> bool:
    """A subject a NATS server accepts (to publish: no wildcards; to subscribe: with)."""
    if not subject or any(c in subject for c in b" \t\r\n"):
        return False
    tokens = subject.split(b".")
    for i, token in enumerate(tokens):
        if not token:
            return False
        if token in (b"*", b">") and not wildcards:
            return False
        if token == b">" and i != len(tokens) - 1:
            return False
    return True


def nats_match(subscription: bytes, subject: bytes) -> bool:
    """Whether NATS delivers a message on ``subject`` to ``subscription``."""
    subs = subscription.split(b".")
    toks = subject.split(b".")
    for i, s in enumerate(subs):
        if s == b">":
            return len(toks) > i
        if i >= len(toks):
            return False
        if s != b"*" and s != toks[i]:
            return False
    return len(toks) == len(subs)
