"""Secret '!/cred/' keys and the reserved '!' (docs/protocol.md) against a real server.

All clients here live in the test process, so the server sees the same
(gid, uid, pid) for each of them through SO_PEERCRED: ``own_creds()``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.server.rawclient import (
    FENCE,
    FENCE_PACKET,
    RawClient,
    fenced,
    own_creds,
    secret_key,
)

pytestmark = pytest.mark.timeout(30)


def test_own_secret_subscription_receives_the_secret(connect: Callable[[], RawClient]) -> None:
    sub, pub = connect(), connect()
    key = secret_key(b"x")
    fenced(sub, key)
    sent = pub.pub(key, b"hush\0hush")
    pub.pub(FENCE, b"end")
    assert sent == b"MSG " + key + b"\0hush\0hush"
    assert sub.recv_packet() == sent
    assert sub.recv_packet() == FENCE_PACKET


@pytest.mark.parametrize(
    ("template", "key_rest"),
    [
        (b"!/cred///%(p)d/", b"anything/below"),  # gid and uid filled in
        (b"!/cred////x", b"x"),  # all three filled in
        (b"!/cred/%(g)d//%(p)d/x/", b"x/y"),  # uid filled in
        (b"!/cred/%(g)d/%(u)d//*", b"x"),  # pid filled in; '*' in the rest is fine
        (b"!/cred/%(g)d/%(u)d/%(p)d/", b"a/b/c"),  # empty rest, trailing '/'
    ],
    ids=["no-gid-uid", "no-fields", "no-uid", "no-pid", "empty-rest"],
)
def test_empty_credential_fields_are_filled_in(
    connect: Callable[[], RawClient], template: bytes, key_rest: bytes
) -> None:
    gid, uid, pid = own_creds()
    pattern = template % {b"g": gid, b"u": uid, b"p": pid}
    sub, pub = connect(), connect()
    fenced(sub, pattern)
    sent = pub.pub(secret_key(key_rest), b"mine")
    pub.pub(FENCE, b"end")
    assert sub.recv_packet() == sent, f"{pattern!r} should receive its own secret"
    assert sub.recv_packet() == FENCE_PACKET


def test_unsub_of_a_secret_pattern_with_empty_fields(connect: Callable[[], RawClient]) -> None:
    # protocol.md fills empty fields in before storing the pattern.  A user would expect
    # UNSUB with the very text they subscribed with to undo the SUB (and the filled-in
    # form to name the same subscription); either way the client stays connected.
    gid, uid, pid = own_creds()
    sub, pub = connect(), connect()
    fenced(sub, b"!/cred///%d/a" % pid, b"!/cred///%d/b" % pid)
    key_a, key_b = secret_key(b"a"), secret_key(b"b")
    sub.unsub(b"!/cred///%d/a" % pid)  # the text as subscribed
    sub.unsub(b"!/cred/%d/%d/%d/b" % (gid, uid, pid))  # the filled-in form
    pub.pub(key_a, b"1")
    pub.pub(key_b, b"2")
    pub.pub(FENCE, b"end")
    assert sub.recv_packet() == FENCE_PACKET


def test_secret_for_someone_else_is_not_delivered_to_own_secret_pattern(
    connect: Callable[[], RawClient],
) -> None:
    gid, uid, pid = own_creds()
    sub, pub = connect(), connect()
    fenced(sub, b"!/cred///%d/" % pid)
    pub.pub(b"!/cred/%d/%d/%d/x" % (gid, uid, pid + 1), b"not yours")
    pub.pub(FENCE, b"end")
    assert sub.recv_packet() == FENCE_PACKET


@pytest.mark.parametrize(
    "pattern",
    [b"", b"*", b"*/", b"*/cred/", b"*/*/*/*/*/", b"*/*/*/*/*/*", b"*/cred/*/*/*/x"],
)
def test_wildcards_never_see_secret_messages(
    connect: Callable[[], RawClient], pattern: bytes
) -> None:
    # protocol.md: '""', '*/', '*' and every other wildcard never see a secret message.
    legit, nosy, pub = connect(), connect(), connect()
    key = secret_key(b"x")
    fenced(legit, key)  # the positive control: the secret really was published
    fenced(nosy, pattern)
    sent = pub.pub(key, b"secret")
    pub.pub(FENCE, b"end")
    assert legit.recv_packet() == sent
    assert nosy.recv_packet() == FENCE_PACKET, f"{pattern!r} saw a secret message"


def foreign(field: str) -> bytes:
    gid, uid, pid = own_creds()
    values = {"gid": gid, "uid": uid, "pid": pid}
    values[field] += 1
    return b"!/cred/%d/%d/%d/x" % (values["gid"], values["uid"], values["pid"])


def creds_with(field_index: int, value: bytes) -> bytes:
    fields = [b"%d" % v for v in own_creds()]
    fields[field_index] = value
    return b"!/cred/" + b"/".join(fields) + b"/x"


REFUSED = {
    "bang-slash": b"!/",
    "cred-prefix-only": b"!/cred/",
    "bang-cred-no-slash": b"!/cred",
    "bang-x": b"!/x",
    "a-bang-b": b"a/!/b",
    "foreign-gid": foreign("gid"),
    "foreign-uid": foreign("uid"),
    "foreign-pid": foreign("pid"),
    "star-gid": creds_with(0, b"*"),
    "star-uid": creds_with(1, b"*"),
    "star-pid": creds_with(2, b"*"),
    "non-numeric-uid": creds_with(1, b"abc"),
    "truncated-1-2": b"!/cred/1/2",
    "truncated-g-u": b"!/cred/%d/%d" % own_creds()[:2],
    "truncated-no-rest": b"!/cred/%d/%d/%d" % own_creds(),
    "truncated-empty-fields": b"!/cred///",
}


@pytest.mark.parametrize("pattern", list(REFUSED.values()), ids=list(REFUSED))
def test_refused_subscription_disconnects_and_sees_nothing(
    connect: Callable[[], RawClient], pattern: bytes
) -> None:
    legit, bad, pub = connect(), connect(), connect()
    key = secret_key(b"x")
    fenced(legit, key)
    bad.sync()  # connected and fine before the bad SUB
    bad.send(b"SUB " + pattern)
    # If the SUB were wrongly accepted, the client's own secret publish (processed
    # after the SUB, same connection) and the other publisher's would reach it.
    bad.try_send(b"MSG " + key + b"\0from-bad")  # fails if already closed: fine
    pub.pub(key, b"from-pub")
    pub.pub(FENCE, b"end")
    assert legit.recv_packet().startswith(b"MSG " + key + b"\0")
    got = bad.expect_closed()
    assert not [p for p in got if p.startswith(b"MSG ")], f"{pattern!r} leaked {got!r}"


@pytest.mark.parametrize("key", [b"!/x", b"a/!/b", b"!/", b"a/!"])
def test_publish_with_reserved_key_is_dropped(connect: Callable[[], RawClient], key: bytes) -> None:
    # protocol.md: '!' as a whole segment is reserved: the publish is dropped (counted),
    # and -- as a user would expect from "drop" -- the publisher stays connected.
    watchers = [fenced(connect(), p) for p in (b"", b"*/", b"a/", b"*")]
    pub = connect()
    pub.pub(key, b"reserved")
    pub.pub(FENCE, b"end")
    for watcher in watchers:
        assert watcher.recv_packet() == FENCE_PACKET, f"{key!r} was forwarded"
    pub.sync()


@pytest.mark.parametrize("word", [b"!a/b", b"a!/b", b"a/b!", b"a/!!/b"])
def test_bang_next_to_another_byte_is_ordinary(
    connect: Callable[[], RawClient], word: bytes
) -> None:
    # protocol.md: '!' is reserved "unless it has an other byte than a '/' next to it".
    sub, pub = connect(), connect()
    fenced(sub, word)
    sent = pub.pub(word, b"plain")
    pub.pub(FENCE, b"end")
    assert sub.recv_packet() == sent
    assert sub.recv_packet() == FENCE_PACKET


def test_whoami_is_not_a_secret_subscription(connect: Callable[[], RawClient]) -> None:
    # Asking whoami twice gives the same answer, and the client stays connected.
    client = connect()
    assert client.whoami() == b"!/cred/%d/%d/%d" % own_creds()
    assert client.whoami() == b"!/cred/%d/%d/%d" % own_creds()
