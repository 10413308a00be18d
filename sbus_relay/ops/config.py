"""Server configuration: one frozen object, loaded and validated once.

What it owns: the server's config fields, their checks and what a reload may
change.  What it may touch: the file it reads (through ops.yamlfile).

``load_config(path)`` reads YAML whose keys are exactly the fields of
``ServerConfig``; flags are applied with ``ServerConfig.merged``.  Validation is
strict, because a typo that silently falls back to a default is the worst kind
of config bug: unknown or duplicate keys, wrong types,
negative or malformed sizes are all errors.  Every error is one ``ConfigError``
naming the file (or "command line"), the key and the reason.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sbus_relay.protocol import limits
from sbus_relay.protocol.accounting import TOP_MAX, TOP_MIN
from sbus_relay.protocol.errors import ConfigError, UsageError
from sbus_relay.protocol.quota import ClientLimits, Quota

from .addresses import DEFAULT_ADDRESS
from .natsconfig import NatsConfig, parse_nats
from .suggest import unknown

#: Where flags come from, as named in a ConfigError.
COMMAND_LINE = "command line"
#: Log levels accepted (structlog's names).
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: Log formats: auto = JSON unless stderr is a terminal.
LOG_FORMATS = ("auto", "json", "console")
#: Size suffixes accepted in strings like "16MiB" (binary units only, so that
#: "16MB" cannot be read two ways).
SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")
_HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(\d+)$")
#: Largest count or size a setting takes (4 EiB): the hot path holds them in
#: C's signed 64-bit integers, with room left for sums; no real limit is near.
LARGEST_SETTING = 1 << 62
#: Digits beyond which a number is not read at all (Python refuses to convert
#: more than 4300, and LARGEST_SETTING has 19).
_DIGITS_READ = 40
#: Digits of an out-of-range port an error repeats (a pasted run of them is cut).
_PORT_SHOWN = 12


def _hostname() -> str:
    return os.uname().nodename


@dataclass(frozen=True)
class ServerConfig:
    """Everything a server needs; the field list is docs/design.md's."""

    address: str = DEFAULT_ADDRESS
    foreground: bool = False
    pidfile: str = "/run/sbus.pid"
    users: tuple[int, ...] = ()
    group_access: bool = False
    other_access: bool = False
    exit_when_empty: bool = False
    remove_stale: bool = False
    hard_limit_bytes: int = limits.HARD_LIMIT_BYTES
    hard_limit_messages: int = limits.HARD_LIMIT_MESSAGES
    max_clients: int = limits.MAX_CLIENTS
    upstream: str | None = None
    #: the NATS system this bus carries its traffic to and from (docs/nats.md)
    nats: NatsConfig | None = None
    upstream_queue_messages: int = limits.UPSTREAM_QUEUE_MESSAGES
    upstream_queue_bytes: int = limits.UPSTREAM_QUEUE_BYTES
    reconnect_min: float = limits.RECONNECT_MIN
    reconnect_max: float = limits.RECONNECT_MAX
    metrics: str | None = None
    instance: str = field(default_factory=_hostname)
    #: relays and users shown by name in the per-who series; the rest are "other"
    accounting_top: int = limits.ACCOUNTING_TOP
    log_level: str = "info"
    log_format: str = "auto"
    #: where the log goes: None = stderr (a daemon whose stderr was a terminal
    #: switches to syslog once detached), a file path (appended to), or "syslog"
    log_file: str | None = None
    # --- per-client limits and per-user quotas (docs/reliability.md) ---
    max_patterns_per_client: int = limits.MAX_PATTERNS_PER_CLIENT
    max_patterns_per_relay: int = limits.MAX_PATTERNS_PER_RELAY
    max_pattern_bytes_per_client: int = limits.MAX_PATTERN_BYTES_PER_CLIENT
    user_connections: int = limits.USER_CONNECTIONS
    user_patterns: int = limits.USER_PATTERNS
    user_pattern_bytes: int = limits.USER_PATTERN_BYTES
    user_queued_bytes: int = limits.USER_QUEUED_BYTES
    #: (uid, quota) for users with a quota of their own, e.g. the uid a relay runs as
    user_quotas: tuple[tuple[int, Quota], ...] = ()

    def client_limits(self) -> ClientLimits:
        """What one connection may hold."""
        return ClientLimits(
            patterns=self.max_patterns_per_client,
            relay_patterns=self.max_patterns_per_relay,
            pattern_bytes=self.max_pattern_bytes_per_client,
        )

    def user_quota(self) -> Quota:
        """The quota of a user without one of its own in ``user_quotas``."""
        return Quota(
            connections=self.user_connections,
            patterns=self.user_patterns,
            pattern_bytes=self.user_pattern_bytes,
            queued_bytes=self.user_queued_bytes,
        )

    def merged(self, **overrides: Any) -> ServerConfig:
        """A copy with ``overrides`` applied; ``None`` values are ignored.

        Values are validated like the file's (sizes may be "64KiB", users may
        be names), and errors name the key as the flag a user would type.
        """
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise UsageError(f"not ServerConfig fields: {', '.join(unknown)}")
        values = {
            key: _VALIDATORS[key](
                COMMAND_LINE, _FLAGS.get(key, "--" + key.replace("_", "-")), value
            )
            for key, value in overrides.items()
            if value is not None
        }
        result = replace(self, **values)
        _check_together(result, COMMAND_LINE)
        return result


#: Fields whose flag is not ``--<field>``: ``users`` is ``-u`` (sbusd and serve).
_FLAGS = {"users": "-u"}


# --- reloading: which fields a running server takes (docs/reliability.md, "Reload") ---

#: Fields a running server cannot take, each with the reason: a reload keeps
#: their running values and names them in one log line.
FIXED_FIELDS = {
    "address": "the bus socket is bound once",
    "foreground": "the process has already daemonised or not",
    "pidfile": "the pid file was written at start",
    "remove_stale": "it applies only when the socket is bound",
    "upstream": "a relay keeps its upstream link",
    "nats": "the NATS link is kept as it is (an upgrade takes new settings)",
    "metrics": "the metrics listener is bound once",
}
#: Fields a reload changes on the running server (``bus.server.Server.reconfigure``;
#: the log's by the CLI), for the connections already there too.
LIVE_FIELDS = frozenset(f.name for f in fields(ServerConfig)) - FIXED_FIELDS.keys()


@dataclass(frozen=True)
class Reload:
    """What a reload does: ``config`` is the loaded one with the fixed fields'
    running values; ``changed`` the live fields that change, ``kept`` the fixed
    fields whose new value waits for a restart."""

    config: ServerConfig
    changed: tuple[str, ...]
    kept: tuple[str, ...]


def plan_reload(running: ServerConfig, loaded: ServerConfig) -> Reload:
    """Compare the running config with one loaded afresh (file and flags)."""
    changed: list[str] = []
    kept: list[str] = []
    for f in fields(ServerConfig):
        if getattr(running, f.name) == getattr(loaded, f.name):
            continue
        (kept if f.name in FIXED_FIELDS else changed).append(f.name)
    config = replace(loaded, **{name: getattr(running, name) for name in kept})
    return Reload(config, tuple(changed), tuple(kept))


# --- validators: (source, key, raw value) -> value, or raise ConfigError ------


def _bool(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, key, f"expected true or false, got {_show(value)}")
    return value


def _text(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected a string, got {_show(value)}")
    if not value or "\0" in value:
        raise ConfigError(source, key, "must be a non-empty string without NUL")
    return value


def _optional_text(source: str, key: str, value: Any) -> str | None:
    return None if value is None else _text(source, key, value)


def _size(minimum: int) -> Callable[[str, str, Any], int]:
    def check(source: str, key: str, value: Any) -> int:
        if isinstance(value, bool):
            raise ConfigError(source, key, f"expected a size, got {_show(value)}")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str):
            match = _SIZE_RE.match(value)
            if not match or match.group(2) not in SIZE_UNITS:
                units = "/".join(u for u in SIZE_UNITS if u)
                shown = repr(value[:80])
                raise ConfigError(
                    source, key, f"{shown} is not a size (an integer, or e.g. 64KiB; {units})"
                )
            _check_digits(source, key, match.group(1))
            number = int(match.group(1)) * SIZE_UNITS[match.group(2)]
        else:
            raise ConfigError(source, key, f"expected a size, got {_show(value)}")
        if number < minimum:
            raise ConfigError(source, key, f"must be at least {minimum}, got {number}")
        if number > LARGEST_SETTING:
            raise ConfigError(source, key, f"must be at most {LARGEST_SETTING}")
        return number

    return check


def _check_digits(source: str, key: str, digits: str) -> None:
    """Refuse a number written with more digits than any setting has."""
    if len(digits) > _DIGITS_READ:
        raise ConfigError(source, key, f"must be at most {LARGEST_SETTING}")


def _count(minimum: int, maximum: int | None = None) -> Callable[[str, str, Any], int]:
    def check(source: str, key: str, value: Any) -> int:
        if isinstance(value, str) and value.strip().isdigit():
            _check_digits(source, key, value.strip())
            value = int(value)  # flags arrive as strings
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected an integer, got {_show(value)}")
        if value < minimum:
            raise ConfigError(source, key, f"must be at least {minimum}, got {value}")
        largest = LARGEST_SETTING if maximum is None else maximum
        if value > largest:
            raise ConfigError(source, key, f"must be at most {largest}")
        return value

    return check


def _seconds(source: str, key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(source, key, f"{value!r} is not a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(source, key, f"expected seconds, got {_show(value)}")
    if not 0 < value < float("inf"):
        raise ConfigError(source, key, f"must be a positive number of seconds, got {value}")
    return float(value)


def _users(source: str, key: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, str | int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple):
        raise ConfigError(source, key, f"expected a list of user names or uids, got {_show(value)}")
    uids: list[int] = []
    for entry in value:
        uid = _uid(source, key, entry)
        if uid not in uids:
            uids.append(uid)
    return tuple(uids)


def _uid(source: str, key: str, entry: Any) -> int:
    if isinstance(entry, str) and entry.isascii() and entry.isdigit():
        entry = int(entry)
    if isinstance(entry, bool):
        raise ConfigError(source, key, f"expected a user name or uid, got {_show(entry)}")
    if isinstance(entry, int):
        if entry < 0:
            raise ConfigError(source, key, f"uid {entry} is negative")
        return entry  # a bare uid needs no passwd entry, as with chown(1)
    if isinstance(entry, str) and entry:
        try:
            return pwd.getpwnam(entry).pw_uid
        except KeyError:
            raise ConfigError(source, key, f"no such user {entry!r}") from None
    raise ConfigError(source, key, f"expected a user name or uid, got {_show(entry)}")


#: Keys of one entry of ``user_quotas`` -> the Quota field each sets.
_QUOTA_KEYS = {
    "connections": "connections",
    "patterns": "patterns",
    "pattern_bytes": "pattern_bytes",
    "queued_bytes": "queued_bytes",
}


def _user_quotas(source: str, key: str, value: Any) -> tuple[tuple[int, Quota], ...]:
    """``{user: {connections: N, patterns: N, pattern_bytes: SIZE, queued_bytes: SIZE}}``.

    Keys left out of an entry take the built-in default (docs/reliability.md).
    """
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(source, key, f"expected a mapping of user -> quota, got {_show(value)}")
    out: list[tuple[int, Quota]] = []
    for user, entry in value.items():
        where = f"{key}.{user}"
        uid = _uid(source, where, user)
        if not isinstance(entry, Mapping):
            raise ConfigError(source, where, f"expected a mapping of limits, got {_show(entry)}")
        values: dict[str, int] = {}
        for name, raw in entry.items():
            if name not in _QUOTA_KEYS:
                reason = unknown(name, _QUOTA_KEYS, "limit")
                raise ConfigError(source, f"{where}.{name}", reason)
            check = _count(1) if name in ("connections", "patterns") else _size(1)
            values[_QUOTA_KEYS[name]] = check(source, f"{where}.{name}", raw)
        out.append((uid, Quota(**values)))
    return tuple(out)


def _choice(choices: tuple[str, ...]) -> Callable[[str, str, Any], str]:
    def check(source: str, key: str, value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            expected = ", ".join(choices)
            raise ConfigError(source, key, f"expected one of {expected}, got {_show(value)}")
        return value.lower()

    return check


def _host_port(source: str, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected HOST:PORT, got {_show(value)}")
    parse_host_port(value, source, key)
    return value


def parse_host_port(text: str, source: str = "metrics", key: str = "metrics") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too) into a host without brackets and a port;
    raises ``ConfigError`` naming ``source`` and ``key``."""
    match = _HOST_PORT_RE.match(text)
    if not match:
        raise ConfigError(source, key, f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9810)")
    digits = match.group(2)
    # compared as text first: thousands of digits are no number worth converting
    if len(digits) > len(str(limits.MAX_PORT)) or int(digits) > limits.MAX_PORT:
        shown = digits if len(digits) <= _PORT_SHOWN else f"{digits[:_PORT_SHOWN]}..."
        raise ConfigError(source, key, f"port {shown} is out of range (1 to {limits.MAX_PORT})")
    host = match.group(1)
    return host.removeprefix("[").removesuffix("]"), int(digits)


_VALIDATORS: dict[str, Callable[[str, str, Any], Any]] = {
    "address": _text,
    "foreground": _bool,
    "pidfile": _text,
    "users": _users,
    "group_access": _bool,
    "other_access": _bool,
    "exit_when_empty": _bool,
    "remove_stale": _bool,
    "hard_limit_bytes": _size(1),
    "hard_limit_messages": _count(1),
    "max_clients": _count(1),
    "upstream": _optional_text,
    "nats": parse_nats,
    "upstream_queue_messages": _count(0),
    "upstream_queue_bytes": _size(0),
    "reconnect_min": _seconds,
    "reconnect_max": _seconds,
    "metrics": _host_port,
    "instance": _text,
    "accounting_top": _count(TOP_MIN, TOP_MAX),
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(LOG_FORMATS),
    "log_file": _optional_text,
    "max_patterns_per_client": _count(1),
    "max_patterns_per_relay": _count(1),
    "max_pattern_bytes_per_client": _size(1),
    "user_connections": _count(1),
    "user_patterns": _count(1),
    "user_pattern_bytes": _size(1),
    "user_queued_bytes": _size(1),
    "user_quotas": _user_quotas,
}


def _check_together(config: ServerConfig, source: str) -> None:
    """Rules that involve more than one key."""
    if config.upstream is not None and _same_socket(config.upstream, config.address):
        # A relay of itself would only ever reconnect to itself (relays form a
        # tree: docs/protocol.md, "Relays").  The socket file is compared with
        # symlinks resolved; spellings that appear later are caught at run time
        # by the upstream link's SO_PEERCRED check (docs/relays.md).
        raise ConfigError(source, "upstream", f"{config.upstream} is this server's own address")
    if config.nats is not None and config.upstream is not None:
        raise ConfigError(source, "nats", "a relay reaches NATS through its master: set it there")
    if config.reconnect_min > config.reconnect_max:
        raise ConfigError(
            source,
            "reconnect_max",
            f"{config.reconnect_max} is below reconnect_min {config.reconnect_min}",
        )


def _same_socket(one: str, other: str) -> bool:
    """Do two addresses name the same socket file (symlinks resolved)?"""
    if one == other:
        return True
    if not (one.startswith("/") and other.startswith("/")) or one.startswith("/dev/"):
        return False
    return os.path.realpath(one) == os.path.realpath(other)


def _show(value: Any) -> str:
    """A value and its YAML type, for messages ("'16' (str)")."""
    try:
        text = repr(value)
    except RecursionError:
        text = "(nested too deeply to show)"
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({type(value).__name__})"


def read_yaml(path: str) -> Any:
    """Parse the YAML file at ``path`` strictly; every failure is one ``ConfigError``.

    Shared by every YAML file the project reads (server configs, the dev
    hierarchy), so they all refuse duplicate keys and word errors alike.
    The parser is imported here, on the first file: a bus run without one
    never loads it.
    """
    from .yamlfile import read_strictly

    return read_strictly(path)


def load_config(path: str, base: ServerConfig | None = None) -> ServerConfig:
    """Read and validate the YAML file at ``path`` over ``base`` (defaults)."""
    return config_from_mapping(read_yaml(path), path, base)


def config_from_mapping(
    document: Any, source: str, base: ServerConfig | None = None
) -> ServerConfig:
    """Validate an already parsed document (``source`` names it in errors)."""
    base = base if base is not None else ServerConfig()
    if document is None:
        return base  # an empty file means "all defaults"
    if not isinstance(document, Mapping):
        raise ConfigError(source, "(file)", f"expected a mapping of keys, got {_show(document)}")
    if "buses" in document:  # the hierarchy file's list (ops/hierarchy.py)
        raise ConfigError(
            source,
            "(file)",
            "this is a hierarchy file of several buses, not one bus's config:"
            f" run it with 'sbus-relay up {source}', watch it with 'sbus-relay top {source}'",
        )
    values: dict[str, Any] = {}
    for key, value in document.items():
        if not isinstance(key, str) or key not in _VALIDATORS:
            raise ConfigError(source, str(key), unknown(key, _VALIDATORS))
        values[key] = _VALIDATORS[key](source, key, value)
    result = replace(base, **values)
    _check_together(result, source)
    return result
