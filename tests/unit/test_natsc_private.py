"""The one place the link reaches into libnats's private parts
(link/natsc_private.h) knows the installed libnats: a release whose sources
were read, whose messages read back through the layout written there."""

from __future__ import annotations

import pytest

from sbus_relay.link import choice

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not choice.nats_c_built(), reason="nats.c engine not built"),
]


def test_the_installed_libnats_is_one_the_link_knows() -> None:
    from sbus_relay.link import _natsc  # type: ignore[attr-defined]

    assert _natsc.private_parts() == "", (
        "the nats.c engine runs on the public API only (slower): update"
        " sbus_relay/link/natsc_private.h after reading this release's sources"
    )


def test_keeping_to_the_public_api_is_said() -> None:
    from sbus_relay.link import _natsc

    try:
        _natsc.keep_to_public_api(True)
        assert _natsc.private_parts() == "kept to the public API (keep_to_public_api)"
    finally:
        _natsc.keep_to_public_api(False)
    assert _natsc.private_parts() == ""
