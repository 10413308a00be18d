"""Hypothesis over the server's whole sans-I/O path, fed by the live fuzzer's generator.

tests/unit already fuzzes ``codec.decode`` alone and checks the index against a
reference matcher.  This module does what neither does: it drives the exact
sequence the server runs per packet (decode, then check_pattern + index for
SUB/UNSUB, valid_key + match for MSG, parse_flood_control for CMSG) with the
hostile packets of ``hardening.packets`` from several clients with random
credentials, on a master and behind a relay prefix, and checks that

* the only error bad input can raise is ``PeerError``, and
* a secret key is only ever matched to clients whose identity it names (docs/protocol.md).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sbus_relay.protocol import codec
from sbus_relay.protocol.errors import PeerError
from sbus_relay.protocol.flood import parse_flood_control
from sbus_relay.protocol.index import SubscriptionIndex
from sbus_relay.protocol.keys import Credentials, check_pattern, is_secret, valid_key
from tests.hardening.harness.packets import generate, mutate, secret, valid

pytestmark = pytest.mark.timeout(120)

ids = st.integers(0, 3)
creds = st.builds(Credentials, ids, ids, ids)
prefixes = st.sampled_from([b"", b"!/cred/1/1/1/", b"!/cred/0/0/9/!/cred/2/2/2/"])


class ServerCore(RuleBasedStateMachine):
    """Four clients sending hostile packets into one server's sans-I/O core."""

    def __init__(self) -> None:
        super().__init__()
        self.index: SubscriptionIndex = SubscriptionIndex(cache_size=8)
        self.creds: list[Credentials] = []
        self.prefix = b""
        self.published: list[bytes] = []
        self.closed: set[int] = set()

    # client 4 publishes the secret keys of secret_pub; 0-3 send everything else
    @initialize(who=st.lists(creds, min_size=5, max_size=5), prefix=prefixes)
    def setup(self, who: list[Credentials], prefix: bytes) -> None:
        self.creds = who
        self.prefix = prefix

    def _feed(self, client: int, packet: bytes) -> None:
        """What Connection._on_readable, Router.publish and Server.handle do with one packet."""
        if client in self.closed:
            return
        me = self.creds[client]
        try:
            event = codec.decode(packet)
            if isinstance(event, codec.Publish):
                if b"!" in event.key and not valid_key(event.key):
                    return  # dropped, counted (reserved_key)
                self.index.match(event.key)
                self.published.append(event.key)
            elif isinstance(event, codec.Subscribe):
                self.index.add(client, check_pattern(event.pattern, me, self.prefix))
            elif isinstance(event, codec.Unsubscribe):
                try:
                    stored = check_pattern(event.pattern, me, self.prefix)
                except PeerError:
                    stored = event.pattern
                self.index.remove(client, stored)
            else:
                setting = parse_flood_control(event.key)
                assert setting is None or setting[0] in ("soft", "hard", "order")
        except PeerError:
            self.closed.add(client)  # the server closes that one client
            for pattern, count in self.index.patterns_of(client).items():
                for _ in range(count):
                    self.index.remove(client, pattern)

    @rule(client=st.integers(0, 3), rnd=st.randoms(use_true_random=False))
    def hostile(self, client: int, rnd: random.Random) -> None:
        own = self.creds[client]
        self._feed(client, generate(rnd, (own.gid, own.uid, own.pid))[1])

    @rule(client=st.integers(0, 3), rnd=st.randoms(use_true_random=False))
    def secret_sub(self, client: int, rnd: random.Random) -> None:
        own = self.creds[client]
        body = secret(rnd, (own.gid, own.uid, own.pid))
        self._feed(client, b"SUB " + (self.prefix if rnd.random() < 0.8 else b"") + body)

    @rule(rnd=st.randoms(use_true_random=False), owner=st.integers(0, 3))
    def secret_pub(self, rnd: random.Random, owner: int) -> None:
        who = self.creds[owner]
        rest = valid(rnd)[4:].split(b"\0")[0].replace(b"!", b"x")
        self._feed(4, b"MSG " + self.prefix + who.identity() + b"/" + rest + b"\0p")

    @rule(client=st.integers(0, 3), rnd=st.randoms(use_true_random=False))
    def mutated(self, client: int, rnd: random.Random) -> None:
        self._feed(client, mutate(rnd, b"SUB " + self.prefix + self.creds[client].identity()))

    @invariant()
    def secrets_reach_only_their_owner(self) -> None:
        for key in self.published[-20:]:
            if not is_secret(key):
                continue
            for client in self.index.match(key):
                owner = self.prefix + self.creds[client].identity() + b"/"
                assert key.startswith(owner), (key, client, self.creds[client])


ServerCore.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestServerCore = ServerCore.TestCase


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=40))
def test_flood_control_parser_total(key: bytes) -> None:
    """Any CMSG key: a known (setting, value), or None (ignored), never an exception."""
    setting = parse_flood_control(key)
    assert setting is None or key in (
        b"blocking/soft/" + setting[1].encode(),
        b"blocking/hard/" + setting[1].encode(),
        b"order/" + setting[1].encode(),
    )
