"""The one module that reaches into nats-py's private parts says, by name,
what a nats-py release changed (link/natspy_private.py)."""

from __future__ import annotations

import pytest

from sbus_relay.link import natspy_private

pytestmark = pytest.mark.timeout(30)


def test_the_installed_nats_py_has_what_the_link_uses() -> None:
    assert natspy_private.check() == ""


def test_a_nats_py_without_it_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from nats.aio.client import Client

    monkeypatch.delattr(Client, "_flush_pending")
    assert (
        natspy_private.check() == "nats-py's Client._flush_pending is gone or no longer a coroutine"
    )

    async def changed(self: object) -> None: ...

    monkeypatch.setattr(Client, "_flush_pending", changed, raising=False)
    assert natspy_private.check() == "nats-py's Client._flush_pending takes no force_flush"
