"""Secret keys, credentials and the reserved '!' (docs/protocol.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.keys import Credentials, check_pattern, valid_key

pytestmark = pytest.mark.timeout(60)
ME = Credentials(gid=10, uid=20, pid=30)


@pytest.mark.parametrize(
    ("pattern", "stored"),
    [
        (b"", b""),
        (b"a/*/c/", b"a/*/c/"),
        (b"!x/y", b"!x/y"),  # '!' next to another byte is not reserved
        (b"!/cred/10/20/30/x", b"!/cred/10/20/30/x"),
        (b"!/cred////", b"!/cred/10/20/30/"),
        (b"!/cred///30/a/*", b"!/cred/10/20/30/a/*"),
        (b"!/cred/10//30/!/cred/*/*/*/x", b"!/cred/10/20/30/!/cred/*/*/*/x"),
    ],
)
def test_accepted_patterns(pattern: bytes, stored: bytes) -> None:
    assert check_pattern(pattern, ME) == stored


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (b"!/", "reserved_pattern"),
        (b"!/x", "reserved_pattern"),
        (b"a/!/b", "reserved_pattern"),
        (b"!/cred/", "secret_refused"),
        (b"!/cred/10/20", "secret_refused"),
        (b"!/cred/10/20/30", "secret_refused"),  # no '/<rest>'
        (b"!/cred/*/20/30/x", "secret_refused"),
        (b"!/cred/11/20/30/x", "secret_refused"),
        (b"!/cred/10/21/30/x", "secret_refused"),
        (b"!/cred/10/20/31/x", "secret_refused"),
        (b"!/cred/10/20/30/a/!/b", "reserved_pattern"),
    ],
)
def test_refused_patterns(pattern: bytes, reason: str) -> None:
    with pytest.raises(PeerError) as info:
        check_pattern(pattern, ME)
    assert info.value.reason == reason


def test_relay_prefix() -> None:
    prefix = b"!/cred/1/1/1/"
    assert check_pattern(b"!/cred/1/1/1/!/cred////", ME, prefix) == prefix + b"!/cred/10/20/30/"
    with pytest.raises(PeerError):
        check_pattern(b"!/cred/10/20/30/x", ME, prefix)  # missing the relay's prefix
    with pytest.raises(PeerError):
        check_pattern(b"!/cred/2/2/2/!/cred////", ME, prefix)  # another relay's prefix


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        (b"a/b", True),
        (b"x!", True),
        (b"!/x", False),
        (b"a/!/b", False),
        (b"!/cred/1/2/3/x", True),
        (b"!/cred/1/2/3", False),
        (b"!/cred/a/2/3/x", False),
        (b"!/cred/1/2/3/!/cred/4/5/6/y", True),
    ],
)
def test_valid_key(key: bytes, ok: bool) -> None:
    assert valid_key(key) is ok


ids = st.integers(0, 3)


@settings(max_examples=500, deadline=None)
@given(st.tuples(ids, ids, ids), st.tuples(ids, ids, ids), st.binary(max_size=12))
def test_no_pattern_of_another_identity_is_accepted(
    mine: tuple[int, int, int], other: tuple[int, int, int], rest: bytes
) -> None:
    """A stored secret pattern always names the subscriber's own identity."""
    me = Credentials(*mine)
    pattern = b"!/cred/%d/%d/%d/" % other + rest.replace(b"\0", b"")
    try:
        stored = check_pattern(pattern, me)
    except PeerError:
        assert other != mine or b"!" in rest or me.pid == 0
        return
    assert stored.startswith(me.identity() + b"/")


@pytest.mark.parametrize("pattern", [b"!/cred////", b"!/cred/10/20/0/x", b"!/cred/10/20//x"])
def test_pid_zero_holds_no_secret_pattern(pattern: bytes) -> None:
    # pid 0 is every peer outside our PID namespace: it proves no identity.
    outsider = Credentials(gid=10, uid=20, pid=0)
    with pytest.raises(PeerError) as info:
        check_pattern(pattern, outsider)
    assert info.value.reason == "secret_refused"
    assert "pid 0" in info.value.detail
    assert check_pattern(b"a/*", outsider) == b"a/*"  # ordinary patterns are fine
