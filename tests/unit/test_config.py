"""ServerConfig and load_config: strict validation, one error naming file, key, reason."""

from __future__ import annotations

import dataclasses
import os
import pwd
from pathlib import Path

import pytest

from sbus_relay.ops.config import (
    COMMAND_LINE,
    FIXED_FIELDS,
    LIVE_FIELDS,
    Reload,
    ServerConfig,
    load_config,
    plan_reload,
)
from sbus_relay.protocol import limits
from sbus_relay.protocol.errors import ConfigError, UsageError
from sbus_relay.protocol.quota import Quota

pytestmark = pytest.mark.timeout(30)

#: docs/design.md's field list, in order.
DESIGN_FIELDS = [
    "address", "foreground", "pidfile", "users", "group_access", "other_access",
    "exit_when_empty", "remove_stale", "hard_limit_bytes", "hard_limit_messages",
    "max_clients", "upstream", "nats", "upstream_queue_messages", "upstream_queue_bytes",
    "reconnect_min", "reconnect_max", "metrics", "instance", "accounting_top",
    "log_level", "log_format",
    "log_file",
    "max_patterns_per_client", "max_patterns_per_relay", "max_pattern_bytes_per_client",
    "user_connections", "user_patterns", "user_pattern_bytes", "user_queued_bytes",
    "user_quotas",
]  # fmt: skip


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bus.yaml"
    path.write_text(text)
    return str(path)


def test_fields_are_exactly_the_designed_ones() -> None:
    assert [f.name for f in dataclasses.fields(ServerConfig)] == DESIGN_FIELDS


def test_defaults_come_from_limits_and_spec() -> None:
    config = ServerConfig()
    assert config.address == "/run/sbus.socket"
    assert config.pidfile == "/run/sbus.pid"
    assert (config.foreground, config.users, config.upstream, config.metrics) == (
        False, (), None, None,
    )  # fmt: skip
    assert config.hard_limit_bytes == limits.HARD_LIMIT_BYTES == 16 * 1024 * 1024
    assert config.hard_limit_messages == limits.HARD_LIMIT_MESSAGES == 65_536
    assert config.max_clients == limits.MAX_CLIENTS
    assert config.upstream_queue_messages == limits.UPSTREAM_QUEUE_MESSAGES
    assert config.upstream_queue_bytes == limits.UPSTREAM_QUEUE_BYTES
    assert (config.reconnect_min, config.reconnect_max) == (
        limits.RECONNECT_MIN, limits.RECONNECT_MAX,
    )  # fmt: skip
    assert config.instance == os.uname().nodename
    assert (config.log_level, config.log_format) == ("info", "auto")


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ServerConfig().address = "/tmp/x"  # type: ignore[misc]


def test_a_full_file_loads(tmp_path: Path) -> None:
    root = pwd.getpwuid(0).pw_name
    path = write(
        tmp_path,
        f"""
address: /tmp/sbus.socket
foreground: true
pidfile: /dev/null
users: [{root}, 4242, "4243"]
group_access: true
other_access: false
exit_when_empty: true
remove_stale: true
hard_limit_bytes: 64KiB
hard_limit_messages: 100
max_clients: 10
upstream: /run/sbus.socket
upstream_queue_messages: 0
upstream_queue_bytes: 1MiB
reconnect_min: 0.1
reconnect_max: 3
metrics: "127.0.0.1:9810"
instance: dev
log_level: DEBUG
log_format: json
""",
    )
    config = load_config(path)
    assert config == ServerConfig(
        address="/tmp/sbus.socket", foreground=True, pidfile="/dev/null",
        users=(0, 4242, 4243), group_access=True, exit_when_empty=True,
        remove_stale=True, hard_limit_bytes=65536, hard_limit_messages=100,
        max_clients=10, upstream="/run/sbus.socket", upstream_queue_messages=0,
        upstream_queue_bytes=1 << 20, reconnect_min=0.1, reconnect_max=3.0,
        metrics="127.0.0.1:9810", instance="dev", log_level="debug", log_format="json",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16MiB", 16 << 20), ("64KiB", 64 << 10), ("1GiB", 1 << 30), ("512B", 512),
     ("4096", 4096), (4096, 4096), ("2 MiB", 2 << 20)],
)  # fmt: skip
def test_sizes_accept_ints_and_binary_units(tmp_path: Path, text: object, expected: int) -> None:
    value = f'"{text}"' if isinstance(text, str) else str(text)
    assert load_config(write(tmp_path, f"hard_limit_bytes: {value}\n")).hard_limit_bytes == expected


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_file_means_defaults(tmp_path: Path, text: str) -> None:
    assert load_config(write(tmp_path, text)) == ServerConfig()


BAD_CONFIGS = [
    # (yaml, key named in the error, words of the reason)
    ("bogus: 1\n", "bogus", "unknown key (known keys: address, "),
    ("hard_limit_byte: 1\n", "hard_limit_byte", "unknown key; did you mean 'hard_limit_bytes'?"),
    ("Max_Clients: 1\n", "Max_Clients", "did you mean 'max_clients'?"),
    ("user_quotas: {0: {conections: 5}}\n", "user_quotas.0.conections", "did you mean 'conn"),
    ("max_clients: 5\nmax_clients: 6\n", "max_clients", "given twice"),
    ("foreground: 'true'\n", "foreground", "expected true or false"),
    ("foreground: 1\n", "foreground", "expected true or false"),
    ("hard_limit_bytes: -1\n", "hard_limit_bytes", "at least 1"),
    ("hard_limit_bytes: 0\n", "hard_limit_bytes", "at least 1"),
    ("upstream_queue_bytes: -5\n", "upstream_queue_bytes", "at least 0"),
    ("hard_limit_bytes: 16MB\n", "hard_limit_bytes", "not a size"),
    ("hard_limit_bytes: 16 potatoes\n", "hard_limit_bytes", "not a size"),
    ("hard_limit_bytes: -16MiB\n", "hard_limit_bytes", "not a size"),
    ("hard_limit_bytes: 1.5\n", "hard_limit_bytes", "expected a size"),
    ("hard_limit_bytes: true\n", "hard_limit_bytes", "expected a size"),
    ("hard_limit_bytes: [1]\n", "hard_limit_bytes", "expected a size"),
    ("hard_limit_messages: 1.5\n", "hard_limit_messages", "expected an integer"),
    ("hard_limit_messages: -3\n", "hard_limit_messages", "at least 1"),
    ("max_clients: true\n", "max_clients", "expected an integer"),
    ("max_clients: many\n", "max_clients", "expected an integer"),
    ("max_clients: 0\n", "max_clients", "at least 1"),
    ("reconnect_min: 0\n", "reconnect_min", "positive"),
    ("reconnect_min: -1\n", "reconnect_min", "positive"),
    ("reconnect_min: soon\n", "reconnect_min", "not a number of seconds"),
    ("reconnect_min: 5\nreconnect_max: 1\n", "reconnect_max", "below reconnect_min"),
    ("users: [no-such-user-sbus-test]\n", "users", "no such user"),
    ("users: [-1]\n", "users", "negative"),
    ("users: {a: 1}\n", "users", "expected a list"),
    ("users: [[1]]\n", "users", "expected a user name or uid"),
    ("address: ''\n", "address", "non-empty"),
    ("address: 5\n", "address", "expected a string"),
    ("upstream: [a]\n", "upstream", "expected a string"),
    ("metrics: localhost\n", "metrics", "not HOST:PORT"),
    ("metrics: 'localhost:99999'\n", "metrics", "port 99999 is out of range (1 to 65535)"),
    ("metrics: 'localhost:0123456'\n", "metrics", "port 0123456 is out of range"),
    ("metrics: 'localhost:port'\n", "metrics", "not HOST:PORT"),
    ("metrics: 9810\n", "metrics", "expected HOST:PORT"),
    ("log_level: loud\n", "log_level", "expected one of"),
    ("log_format: xml\n", "log_format", "expected one of"),
    ("instance: 7\n", "instance", "expected a string"),
    ("- address: /tmp/x\n", "(file)", "expected a mapping"),
    # numbers past what the hot path holds, and YAML that parses but cannot be read
    ("hard_limit_bytes: 99999999999999999999999GiB\n", "hard_limit_bytes", "at most 4611686018"),
    ("max_clients: 9223372036854775807\n", "max_clients", "must be at most 4611686018427387904"),
    (
        "user_quotas: {0: {queued_bytes: 9223372036854775807}}\n",
        "user_quotas.0.queued_bytes",
        "must be at most",
    ),
    ("hard_limit_messages: " + "9" * 5000 + "\n", "(file)", "a value that cannot be read"),
    ("instance: 2026-13-45\n", "(file)", "cannot be read (month must be in 1..12)"),
    ("? [a, b]\n: 1\n", "(file)", "a key that is a list or a mapping at line 1"),
    ("? {a: 1}\n: 1\n", "(file)", "a key that is a list or a mapping at line 1"),
    ("address: [unclosed\n", "(file)", "invalid YAML"),
    ("a: b: c\n", "(file)", "invalid YAML"),
]


@pytest.mark.parametrize(("text", "key", "reason"), BAD_CONFIGS)
def test_every_bad_config_is_one_error_naming_file_key_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    error = caught.value
    assert (error.source, error.key) == (path, key)
    assert reason in error.reason
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}: ")


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert (caught.value.source, caught.value.key) == (path, "(file)")
    assert "cannot read" in caught.value.reason


def test_a_hierarchy_file_is_named_as_one(tmp_path: Path) -> None:
    path = tmp_path / "tree.yaml"
    path.write_text("log_dir: /tmp/x\nbuses:\n  - {name: master, address: /tmp/x/m}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert (caught.value.source, caught.value.key) == (str(path), "(file)")
    assert "this is a hierarchy file of several buses" in caught.value.reason
    assert f"'sbus-relay up {path}'" in caught.value.reason


def test_a_binary_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"address: \xff\xfe\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert caught.value.key == "(file)"


def test_merged_ignores_none_and_applies_the_rest() -> None:
    base = ServerConfig(address="/tmp/a", max_clients=3)
    merged = base.merged(address=None, max_clients="7", hard_limit_bytes="64KiB", users=["0"])
    assert merged.address == "/tmp/a"
    assert merged.max_clients == 7
    assert merged.hard_limit_bytes == 64 << 10
    assert merged.users == (0,)
    assert base.max_clients == 3  # a copy, not a change


def test_merged_names_the_flag_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        ServerConfig().merged(hard_limit_bytes="lots")
    assert (caught.value.source, caught.value.key) == (COMMAND_LINE, "--hard-limit-bytes")


def test_merged_checks_keys_together() -> None:
    with pytest.raises(ConfigError) as caught:
        ServerConfig().merged(reconnect_min="10")
    assert caught.value.key == "reconnect_max"


def test_merged_refuses_unknown_fields() -> None:
    with pytest.raises(UsageError):
        ServerConfig().merged(adress="/tmp/typo")


@pytest.mark.parametrize("name", ["default.yaml", "master.yaml"])
def test_shipped_configs_load(name: str) -> None:
    path = Path(__file__).resolve().parents[2] / "configs" / name
    config = load_config(str(path))
    if name == "default.yaml":
        # `make run` must work without root (README).
        assert config.address.startswith("/tmp/") and config.foreground
        assert config.pidfile == "/dev/null"
    else:
        assert (config.address, config.metrics) == ("/run/sbus.socket", "127.0.0.1:9800")


def test_upstream_cannot_be_the_servers_own_address(tmp_path: Path) -> None:
    path = write(tmp_path, "address: /tmp/self\nupstream: /tmp/self\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert (caught.value.key, caught.value.source) == ("upstream", path)
    assert "/tmp/self" in caught.value.reason
    with pytest.raises(ConfigError) as caught:
        ServerConfig(address="/tmp/a").merged(upstream="/tmp/a")
    assert caught.value.key == "upstream"


@pytest.mark.parametrize("depth", [100, 5000])
def test_a_deeply_nested_file_is_one_config_error(tmp_path: Path, depth: int) -> None:
    path = write(tmp_path, "address: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_quotas_load_with_per_user_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "user_connections: 10\nuser_queued_bytes: 1MiB\n"
        "user_quotas:\n  1234:\n    connections: 500\n    pattern_bytes: 64MiB\n",
    )
    config = load_config(path)
    assert config.user_quota().connections == 10
    assert config.user_quota().queued_bytes == 1 << 20
    ((uid, quota),) = config.user_quotas
    assert uid == 1234 and quota.connections == 500 and quota.pattern_bytes == 64 << 20
    assert quota.patterns == limits.USER_PATTERNS  # left out: the built-in default


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("user_quotas: 3\n", "user_quotas"),
        ("user_quotas:\n  1234: 5\n", "user_quotas.1234"),
        ("user_quotas:\n  1234:\n    sockets: 5\n", "user_quotas.1234.sockets"),
        ("user_quotas:\n  1234:\n    connections: -1\n", "user_quotas.1234.connections"),
        ("max_patterns_per_client: 0\n", "max_patterns_per_client"),
    ],
)
def test_bad_quotas_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key and info.value.source == path


# --- reloading -------------------------------------------------------------------


def test_every_field_is_either_live_or_fixed() -> None:
    names = {f.name for f in dataclasses.fields(ServerConfig)}
    assert LIVE_FIELDS | FIXED_FIELDS.keys() == names
    assert not LIVE_FIELDS & FIXED_FIELDS.keys()
    assert set(FIXED_FIELDS) == {
        "address", "foreground", "pidfile", "remove_stale", "upstream", "nats", "metrics",
    }  # fmt: skip


def test_a_reload_takes_the_live_fields_and_keeps_the_fixed_ones() -> None:
    running = ServerConfig(address="/tmp/a", metrics="127.0.0.1:1", hard_limit_messages=10)
    loaded = ServerConfig(
        address="/tmp/b", metrics="127.0.0.1:2", hard_limit_messages=20, log_level="debug"
    )
    plan = plan_reload(running, loaded)
    assert plan.changed == ("hard_limit_messages", "log_level")
    assert plan.kept == ("address", "metrics")
    assert plan.config == dataclasses.replace(loaded, address="/tmp/a", metrics="127.0.0.1:1")


def test_a_reload_of_the_same_config_changes_nothing() -> None:
    config = ServerConfig(user_quotas=((0, Quota(connections=3)),), users=(0, 1))
    plan = plan_reload(config, dataclasses.replace(config))
    assert plan == Reload(config, (), ())
