"""Hostile packets for fuzzing: valid templates, mutations of them, and junk.

Everything is drawn from a ``random.Random`` so a run is reproduced by its seed.
``KINDS`` names the families so that a run can say how many of each it tried.
"""

from __future__ import annotations

import random

from .common import MAX_PACKET

#: Segments routing keys and patterns are built from: wildcards, the reserved
#: '!', credential words, empty segments, digits and a few odd bytes.
SEGMENTS = (
    b"a", b"b", b"fz", b"*", b"a*", b"**", b"!", b"cred", b"whoami", b"", b"0", b"1000",
    b"4294967295", b"-1", b"\xff", b"\x01", b" ", b"x" * 40,
)  # fmt: skip
#: Control keys a fuzzer may send: every flood mode, echo, interest, whoami, junk.
CONTROL_KEYS = (
    b"blocking/soft/queue", b"blocking/soft/discard", b"blocking/soft/block",
    b"blocking/soft/error", b"blocking/hard/discard", b"blocking/hard/block",
    b"blocking/hard/error", b"order/queue", b"order/stack", b"order/random",
    b"echo/off", b"echo/on", b"interest/on", b"interest/off", b"!/cred/whoami",
    b"interest/add", b"interest/ready", b"blocking/", b"blocking/soft/", b"order/",
)  # fmt: skip
VERBS = (b"SUB ", b"UNSUB ", b"MSG ", b"CMSG ")
#: Families of generated packets, in the order ``generate`` picks from.
KINDS = (
    "valid", "mutated", "random", "overlong", "empty", "nul", "bang", "secret_wrong_creds",
    "flood_control",
)  # fmt: skip


def route(rng: random.Random, *, max_segments: int = 6) -> bytes:
    """A routing key or pattern made of SEGMENTS, maybe ending in '/'."""
    segs = [rng.choice(SEGMENTS) for _ in range(rng.randint(0, max_segments))]
    text = b"/".join(segs)
    return text + b"/" if rng.random() < 0.3 else text


def secret(rng: random.Random, own: tuple[int, int, int] | None = None) -> bytes:
    """A ``!/cred/g/u/p/rest`` pattern or key, with fields that are mostly wrong."""
    fields = []
    for i in range(3):
        choice = rng.random()
        if own is not None and choice < 0.3:
            fields.append(b"%d" % own[i])
        elif choice < 0.5:
            fields.append(b"")
        elif choice < 0.6:
            fields.append(b"*")
        else:
            fields.append(b"%d" % rng.randint(0, 70000))
    head = b"!/cred/" + b"/".join(fields[: rng.choice((1, 2, 3, 3, 3))])
    return head + (b"/" + route(rng) if rng.random() < 0.8 else b"")


def valid(rng: random.Random) -> bytes:
    """A well-formed packet of a random verb (which may still be refused)."""
    verb = rng.choice(VERBS)
    if verb == b"CMSG ":
        key = rng.choice(CONTROL_KEYS)
        tail = b"\0" + rng.randbytes(rng.randint(0, 8)) if rng.random() < 0.5 else b""
        return verb + key + tail
    key = route(rng)
    if verb == b"MSG ":
        return verb + key + b"\0" + rng.randbytes(rng.randint(0, 64))
    return verb + key + (b"\0" + rng.randbytes(4) if rng.random() < 0.2 else b"")


def mutate(rng: random.Random, packet: bytes) -> bytes:
    """One to four random edits: flips, inserts, deletes, truncation, NULs, splices."""
    data = bytearray(packet)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randint(0, len(data))
        if op == 0 and data:
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 2:
            del data[pos : pos + rng.randint(1, 8)]
        elif op == 3:
            del data[pos:]
        elif op == 4:
            data[pos:pos] = b"\0"
        elif op == 5:
            data[pos:pos] = rng.choice((b"!", b"*", b"/", b"!/cred/", b"/!/"))
        else:
            data[pos:pos] = valid(rng)
    return bytes(data[:MAX_PACKET])


def generate(rng: random.Random, own: tuple[int, int, int] | None = None) -> tuple[str, bytes]:
    """One hostile packet and its family name."""
    kind = rng.choices(KINDS, weights=(20, 30, 10, 1, 2, 5, 8, 8, 10))[0]
    if kind == "valid":
        return kind, valid(rng)
    if kind == "mutated":
        return kind, mutate(rng, valid(rng))
    if kind == "random":
        return kind, rng.randbytes(rng.randint(1, 200))
    if kind == "overlong":
        return kind, rng.choice(VERBS) + b"o" * (MAX_PACKET + rng.randint(1, 50_000))
    if kind == "empty":
        return kind, b""
    if kind == "nul":
        return kind, rng.choice((b"", *VERBS)) + b"\0" * rng.randint(1, 16) + route(rng)
    if kind == "bang":
        verb = rng.choice((b"SUB ", b"UNSUB ", b"MSG "))
        key = rng.choice((b"!", b"!/", b"!/x", b"a/!/b", b"!/cred/", b"!!", b"!a/b", b"a/!"))
        return kind, verb + key + (b"\0p" if verb == b"MSG " else b"")
    if kind == "secret_wrong_creds":
        verb = rng.choice((b"SUB ", b"UNSUB ", b"MSG "))
        return kind, verb + secret(rng, own) + (b"\0s" if verb == b"MSG " else b"")
    key = rng.choice(CONTROL_KEYS[:14])
    return kind, b"CMSG " + key + rng.choice((b"", b"\0", b"\0x", b"\0\0"))
