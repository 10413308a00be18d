"""The ``nats:`` settings of a bus (docs/nats.md, "Settings"), validated once.

In the YAML file ``nats:`` is either a list of server URLs (or one string of
them separated by commas, as ``serve --nats`` takes them) or a mapping:

    nats:
      servers: [nats://10.0.0.1:4222, nats://10.0.0.2:4222]
      user: bus            # with password; or token; or creds; or nkey
      password: secret
      tls_ca: /etc/sbus/nats-ca.pem
      subject_prefix: sbus
      export: [""]         # keys that may leave this host (sbus patterns)
      import: [""]         # keys taken from other hosts
      host: web-1          # default: the bus's instance
      identities: false    # true: identities (!/cred/) cross, prefixed with their host
      queue_messages: 65536
      queue_bytes: 16MiB
      engine: auto         # nats.c where it was built, else nats-py; or either by name

Every error is one ``ConfigError`` naming the file, ``nats.<key>`` and why.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sbus_relay.protocol import limits
from sbus_relay.protocol.errors import ConfigError
from sbus_relay.protocol.keys import is_secret
from sbus_relay.protocol.natsmap import check_prefix

from .suggest import unknown

_URL = re.compile(r"^(nats|tls)://([^\s/@]+@)?(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]@]+)(:\d{1,5})?/?$")
_BARE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]@]+)(:\d{1,5})?$")
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|)\s*$")
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_KEYS = (
    "servers",
    "user",
    "password",
    "token",
    "creds",
    "nkey",
    "tls_ca",
    "subject_prefix",
    "export",
    "import",
    "host",
    "identities",
    "queue_messages",
    "queue_bytes",
    "engine",
)
#: The NATS clients the link may run (``link/engine.py``), and "auto".
ENGINES = ("auto", "nats.c", "nats-py")


@dataclass(frozen=True)
class NatsConfig:
    """How a bus joins NATS; ``host`` None means the bus's ``instance``."""

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey: str | None = None
    tls_ca: str | None = None
    subject_prefix: str = "sbus"
    export: tuple[bytes, ...] = (b"",)
    import_: tuple[bytes, ...] = (b"",)
    host: str | None = None
    #: identities cross hosts, each under its host's ``!/cred/<host>/`` (docs/nats.md)
    identities: bool = False
    queue_messages: int = limits.UPSTREAM_QUEUE_MESSAGES
    queue_bytes: int = limits.UPSTREAM_QUEUE_BYTES
    #: the link's NATS client: "auto" (nats.c where built, else nats-py), or one by name
    engine: str = "auto"

    def with_servers(self, servers: tuple[str, ...]) -> NatsConfig:
        """The same settings with other servers (``serve --nats`` over a file's ``nats:``)."""
        return NatsConfig(**{**self.__dict__, "servers": servers})


def parse_servers(source: str, key: str, value: Any) -> tuple[str, ...]:
    """URLs from a list or a comma-separated string; ``host:port`` means nats://."""
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",")]
    elif isinstance(value, list):
        items = value
    else:
        raise ConfigError(source, key, "expected a list of URLs or URLs separated by commas")
    out = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(source, key, "an empty or non-text server URL")
        if _BARE.match(item):
            item = "nats://" + item
        match = _URL.match(item)
        if not match:
            raise ConfigError(
                source, key, f"{item!r} is not a NATS URL (nats://host:port or tls://host:port)"
            )
        port = (match.group(4) or ":1")[1:]
        if not 0 < int(port) <= limits.MAX_PORT:
            raise ConfigError(
                source, key, f"port {port} is out of range (1 to {limits.MAX_PORT}) in {item!r}"
            )
        out.append(item)
    if not out:
        raise ConfigError(source, key, "no server URL")
    return tuple(out)


def _text(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(source, key, "expected non-empty text")
    return value


def _file(source: str, key: str, value: Any) -> str:
    path = _text(source, key, value)
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigError(source, key, f"{path} is not a readable file")
    return path


def _patterns(source: str, key: str, value: Any) -> tuple[bytes, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(source, key, "expected a list of sbus patterns")
    out = []
    for v in value:
        pattern = v.encode("utf-8")
        if is_secret(pattern):
            raise ConfigError(
                source, key, f"{v!r}: identities (!/cred/) cross only by nats.identities"
            )
        if b"\0" in pattern or len(pattern) > limits.MAX_PATTERN_LENGTH:
            raise ConfigError(source, key, f"{v!r} is not a pattern")
        out.append(pattern)
    return tuple(out)


def _count(source: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(source, key, "expected a whole number, 0 or more")
    return value


def _size(source: str, key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(source, key, "expected a size such as 16MiB")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_nats(source: str, key: str, value: Any) -> NatsConfig | None:
    """The ``nats`` key of a config file (or ``--nats``): None, URLs, or a mapping."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return NatsConfig(servers=parse_servers(source, key, value))
    strange = [k for k in value if k not in _KEYS]
    if strange:
        raise ConfigError(source, f"{key}.{strange[0]}", unknown(strange[0], _KEYS))
    if "servers" not in value:
        raise ConfigError(source, f"{key}.servers", "missing: the NATS servers to join")
    name = f"{key}.%s".__mod__
    values: dict[str, Any] = {"servers": parse_servers(source, name("servers"), value["servers"])}
    for k in ("user", "password", "token", "host"):
        if k in value:
            values[k] = _text(source, name(k), value[k])
    for k in ("creds", "nkey", "tls_ca"):
        if k in value:
            values[k] = _file(source, name(k), value[k])
    if "subject_prefix" in value:
        prefix = _text(source, name("subject_prefix"), value["subject_prefix"])
        reason = check_prefix(prefix)
        if reason:
            raise ConfigError(source, name("subject_prefix"), f"{prefix!r} has {reason}")
        values["subject_prefix"] = prefix
    if "export" in value:
        values["export"] = _patterns(source, name("export"), value["export"])
    if "import" in value:
        values["import_"] = _patterns(source, name("import"), value["import"])
    if "identities" in value:
        if not isinstance(value["identities"], bool):
            raise ConfigError(source, name("identities"), "expected true or false")
        values["identities"] = value["identities"]
    if "queue_messages" in value:
        values["queue_messages"] = _count(source, name("queue_messages"), value["queue_messages"])
    if "queue_bytes" in value:
        values["queue_bytes"] = _size(source, name("queue_bytes"), value["queue_bytes"])
    if "engine" in value:
        if value["engine"] not in ENGINES:
            raise ConfigError(source, name("engine"), f"expected one of {', '.join(ENGINES)}")
        values["engine"] = value["engine"]
    ways = [k for k in ("user", "token", "creds", "nkey") if k in values]
    if len(ways) > 1:
        raise ConfigError(
            source, name(ways[1]), f"give one way to sign in, not {' and '.join(ways)}"
        )
    if ("user" in values) != ("password" in values):
        missing = "password" if "user" in values else "user"
        raise ConfigError(source, name(missing), "user and password go together")
    return NatsConfig(**values)
