"""The nats: settings: what is taken, and one clear error naming file, key and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbus_relay.ops.config import ServerConfig, config_from_mapping, plan_reload
from sbus_relay.protocol.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def test_urls_as_text_or_list_and_defaults() -> None:
    c = config_from_mapping({"nats": "127.0.0.1:4222, tls://n2:4443"}, "f.yaml").nats
    assert c is not None and c.servers == ("nats://127.0.0.1:4222", "tls://n2:4443")
    assert c.subject_prefix == "sbus" and c.export == (b"",) and c.host is None
    full = config_from_mapping(
        {"nats": {"servers": ["nats://a:1"], "user": "u", "password": "p",
                  "subject_prefix": "corp.sbus", "export": ["a/", "b"], "host": "web-1",
                  "queue_bytes": "1MiB"}},
        "f.yaml",
    ).nats  # fmt: skip
    assert full is not None and full.export == (b"a/", b"b") and full.queue_bytes == 1 << 20
    assert not full.identities
    crossing = config_from_mapping({"nats": {"servers": "a:1", "identities": True}}, "f.yaml").nats
    assert crossing is not None and crossing.identities
    assert c.publish == ()  # nothing is published for native clients unless asked
    native = config_from_mapping({"nats": {"servers": "a:1", "publish": "sensors/"}}, "f.yaml").nats
    assert native is not None and native.publish == (b"sensors/",)


@pytest.mark.parametrize(
    ("value", "key", "words"),
    [
        ({"servers": "http://x:1"}, "nats.servers", "not a NATS URL"),
        ({"servers": "nats://x:99999"}, "nats.servers", "port 99999 is out of range (1 to 65535)"),
        ({"servers": "a:1, x:0"}, "nats.servers", "port 0 is out of range"),
        ({"server": "a:1"}, "nats.server", "unknown key; did you mean 'servers'?"),
        ({"user": "u"}, "nats.servers", "missing"),
        ({"servers": "a:1", "user": "u"}, "nats.password", "go together"),
        ({"servers": "a:1", "user": "u", "password": "p", "token": "t"}, "nats.token", "one way"),
        ({"servers": "a:1", "creds": "/nonexistent.creds"}, "nats.creds", "not a readable file"),
        ({"servers": "a:1", "subject_prefix": "a..b"}, "nats.subject_prefix", "empty token"),
        ({"servers": "a:1", "export": ["!/cred/1/2/3/x"]}, "nats.export", "identities"),
        ({"servers": "a:1", "identities": "yes"}, "nats.identities", "true or false"),
        ({"servers": "a:1", "publish": ["!/cred/1/2/3/x"]}, "nats.publish", "identities"),
        ({"servers": "a:1", "publish": [3]}, "nats.publish", "a list of sbus patterns"),
        ({"servers": "a:1", "publish": ["a\0b"]}, "nats.publish", "is not a pattern"),
        (42, "nats", "expected a list of URLs"),
    ],
)
def test_errors_name_the_file_the_key_and_why(value: object, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_mapping({"nats": value}, "fleet.yaml")
    assert e.value.source == "fleet.yaml" and e.value.key == key and words in e.value.reason


def test_a_relay_does_not_join_nats() -> None:
    with pytest.raises(ConfigError, match="nats: a relay reaches NATS through its master"):
        config_from_mapping({"nats": "a:1", "upstream": "/run/sbus.sock"}, "f.yaml")


def test_a_reload_keeps_the_link(tmp_path: Path) -> None:
    running = config_from_mapping({"nats": "a:1"}, "f.yaml")
    loaded = config_from_mapping({"nats": "b:1"}, "f.yaml")
    plan = plan_reload(running, loaded)
    assert plan.kept == ("nats",) and plan.config.nats == running.nats
    assert ServerConfig().nats is None
