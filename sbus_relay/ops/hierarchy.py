"""The hierarchy file of ``sbus-relay up``: a tree of buses, validated into frozen objects.

What it owns: the hierarchy file's format, its tree rules and what a reload of
it changes.  What it may touch: nothing but the file it is given to read: no
process, no socket, no signal.

Theory of operation.  A hierarchy file lists buses (a master and relays, each
naming its parent by name).  ``load_hierarchy`` validates it once into frozen
objects, with the same strictness as ``config.py``: unknown or duplicate keys,
wrong types, unknown parents, a bus that is its own parent and cycles are all
one ``ConfigError`` naming the file, the key and the reason.  The tree rule of
docs/protocol.md, Relays ("relays form a tree") is checked here, before
anything runs.  The file format is in docs/relays.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sbus_relay.protocol.errors import AddressError, ConfigError

from . import natscluster
from .addresses import parse_address
from .config import ServerConfig, config_from_mapping, read_yaml
from .suggest import unknown

#: Keys of the hierarchy file and of each bus entry.
TOP_KEYS = ("buses", "log_dir", "restart_min", "restart_max", "nats_cluster")
BUS_KEYS = ("name", "address", "upstream", "metrics", "args")
#: Default restart back-off, seconds (first delay, cap).
RESTART_MIN = 0.5
RESTART_MAX = 10.0


@dataclass(frozen=True)
class BusSpec:
    """One bus of the hierarchy, as validated from the file."""

    name: str
    address: str
    upstream: str | None  # the parent's name, None for a master
    metrics: str | None
    args: tuple[str, ...]


@dataclass(frozen=True)
class Hierarchy:
    """A validated hierarchy: ``buses`` in start order (every parent before its children)."""

    buses: tuple[BusSpec, ...]
    log_dir: str | None = None
    restart_min: float = RESTART_MIN
    restart_max: float = RESTART_MAX
    #: nats-servers started before the buses and stopped after them (docs/nats.md)
    nats_cluster: tuple[natscluster.NatsNode, ...] = ()

    def bus(self, name: str) -> BusSpec:
        """The bus called ``name``."""
        return next(b for b in self.buses if b.name == name)

    def serve_flags(self, spec: BusSpec) -> list[str]:
        """The ``serve`` flags that run ``spec`` (-r: a crashed bus leaves its socket)."""
        flags = ["-f", "-r", "-a", spec.address, "--instance", spec.name]
        if spec.upstream is not None:
            flags += ["--upstream", self.bus(spec.upstream).address]
        if spec.metrics is not None:
            flags += ["--metrics", spec.metrics]
        return [*flags, *spec.args]

    def log_path(self, spec: BusSpec) -> str | None:
        """Where ``spec``'s stderr goes: ``log_dir``/NAME.log, or None (``up``'s own)."""
        return os.path.join(self.log_dir, f"{spec.name}.log") if self.log_dir else None


# --- loading ---------------------------------------------------------------------


def load_hierarchy(path: str) -> Hierarchy:
    """Read and validate the hierarchy file at ``path``; raises ``ConfigError``."""
    return hierarchy_from_mapping(read_yaml(path), path)


def hierarchy_from_mapping(document: Any, source: str) -> Hierarchy:
    """Validate an already parsed hierarchy document (``source`` names it in errors)."""
    if not isinstance(document, Mapping):
        raise ConfigError(source, "(file)", "expected a mapping with a 'buses' list")
    if "buses" not in document and document.keys() & _BUS_CONFIG_KEYS:
        raise ConfigError(source, "(file)", _not_a_hierarchy(source, document))
    for key in document:
        if key not in TOP_KEYS:
            raise ConfigError(source, str(key), unknown(key, TOP_KEYS))
    raw_buses = document.get("buses")
    if not isinstance(raw_buses, list) or not raw_buses:
        raise ConfigError(source, "buses", "expected a non-empty list of buses")
    # The restart delays and log_dir follow config.py's rules for seconds and text.
    timing = _checked(
        source,
        "",
        {
            "reconnect_min": document.get("restart_min", RESTART_MIN),
            "reconnect_max": document.get("restart_max", RESTART_MAX),
        },
        rename={"reconnect_min": "restart_min", "reconnect_max": "restart_max"},
    )
    log_dir = document.get("log_dir")
    if log_dir is not None and (not isinstance(log_dir, str) or not log_dir):
        raise ConfigError(source, "log_dir", f"expected a directory path, got {log_dir!r}")
    specs = [_bus(source, i, raw) for i, raw in enumerate(raw_buses)]
    _check_tree(source, specs)
    ordered = sorted(specs, key=lambda s: _depth(specs, s))  # stable: file order per level
    cluster = document.get("nats_cluster")
    nodes = natscluster.parse_cluster(source, cluster) if cluster is not None else ()
    return Hierarchy(tuple(ordered), log_dir, timing.reconnect_min, timing.reconnect_max, nodes)


#: The keys of one bus's own config (``serve -C``), which a hierarchy file is not.
_BUS_CONFIG_KEYS = frozenset(f.name for f in fields(ServerConfig)) - set(TOP_KEYS)


def _not_a_hierarchy(source: str, document: Mapping[Any, Any]) -> str:
    """What to say of a bus's own config given where a hierarchy file is wanted."""
    metrics = document.get("metrics")
    where = metrics if isinstance(metrics, str) and metrics else "HOST:PORT"
    return (
        "this is one bus's config, not a hierarchy file (which lists its buses under"
        " 'buses:', as configs/dev-hierarchy.yaml does): run that bus with"
        f" 'sbus-relay serve -C {source}', watch it with 'sbus-relay top --metrics {where}'"
    )


def _bus(source: str, i: int, raw: Any) -> BusSpec:
    where = f"buses[{i}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(source, where, "expected a mapping with name and address")
    for key in raw:
        if key not in BUS_KEYS:
            raise ConfigError(source, f"{where}.{key}", unknown(key, BUS_KEYS))
    name = raw.get("name")
    if not isinstance(name, str) or not name or "/" in name or name.startswith("-"):
        raise ConfigError(source, f"{where}.name", f"expected a short name, got {name!r}")
    where = f"buses[{name}]"
    if "address" not in raw:
        raise ConfigError(source, f"{where}.address", "missing (where the bus listens)")
    checked = _checked(source, where, {"address": raw["address"], "metrics": raw.get("metrics")})
    address = checked.address
    try:
        parsed = parse_address(address)
    except AddressError as exc:
        raise ConfigError(source, f"{where}.address", str(exc)) from None
    if (parsed.kind == "abstract" and parsed.name is None) or parsed.kind == "fd":
        raise ConfigError(source, f"{where}.address", "a supervised bus needs a fixed address")
    upstream = raw.get("upstream")
    if upstream is not None and (not isinstance(upstream, str) or not upstream):
        raise ConfigError(source, f"{where}.upstream", "expected the name of another bus")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(source, f"{where}.args", "expected a list of strings (serve flags)")
    return BusSpec(name, address, upstream, checked.metrics, tuple(args))


def _checked(
    source: str, where: str, values: dict[str, Any], rename: Mapping[str, str] | None = None
) -> Any:
    """Validate ``values`` with config.py's own rules; errors name our key."""
    try:
        return config_from_mapping(values, source)
    except ConfigError as exc:
        names = rename or {}
        key = names.get(exc.key, exc.key)
        reason = exc.reason  # it may name another key of ours too ("below reconnect_min")
        for theirs, ours in names.items():
            reason = re.sub(rf"\b{theirs}\b", ours, reason)
        raise ConfigError(source, f"{where}.{key}" if where else key, reason) from None


def _check_tree(source: str, specs: list[BusSpec]) -> None:
    """Relays form a tree: unique names, addresses and ports, known parents, no cycles."""
    names: dict[str, BusSpec] = {}
    addresses: dict[str, str] = {}
    ports: dict[str, str] = {}
    for spec in specs:
        where = f"buses[{spec.name}]"
        if spec.name in names:
            raise ConfigError(source, f"{where}.name", "two buses have this name")
        names[spec.name] = spec
        # Resolved, so that two spellings of one socket (a symlinked directory,
        # a symlink to the socket) are caught too.
        path = os.path.realpath(spec.address)
        if path in addresses:
            other = addresses[path]
            raise ConfigError(source, f"{where}.address", f"bus {other!r} listens there too")
        addresses[path] = spec.name
        if spec.metrics is not None:
            port = spec.metrics.rsplit(":", 1)[1]
            if port != "0" and port in ports:
                other = ports[port]
                raise ConfigError(source, f"{where}.metrics", f"port also used by bus {other!r}")
            ports[port] = spec.name
    for spec in specs:
        where = f"buses[{spec.name}].upstream"
        if spec.upstream is None:
            continue
        if spec.upstream == spec.name:
            raise ConfigError(source, where, "a bus cannot be its own upstream (a loop)")
        if spec.upstream not in names:
            raise ConfigError(source, where, f"no bus named {spec.upstream!r} in this file")
        seen = {spec.name}
        parent: str | None = spec.upstream
        while parent is not None:
            if parent in seen:
                raise ConfigError(source, where, f"cycle through {parent!r}: relays form a tree")
            seen.add(parent)
            parent = names[parent].upstream
    if all(s.upstream is not None for s in specs):
        raise ConfigError(source, "buses", "no master (a bus without upstream)")


def _depth(specs: list[BusSpec], spec: BusSpec) -> int:
    by_name = {s.name: s for s in specs}
    depth = 0
    while spec.upstream is not None:
        spec = by_name[spec.upstream]
        depth += 1
    return depth


# --- reloading -------------------------------------------------------------------

#: What a running bus cannot take from a changed entry: kept until up restarts.
_BUS_FIELDS = ("address", "upstream", "metrics", "args")


@dataclass(frozen=True)
class TreeReload:
    """What a reload of the hierarchy does: the tree it leaves running, the buses
    it starts and stops, and the buses kept as they run, each with why."""

    hierarchy: Hierarchy
    started: tuple[str, ...]
    stopped: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]


def plan_tree_reload(running: Hierarchy, loaded: Hierarchy, *, source: str) -> TreeReload:
    """Compare the running tree with the file read again.

    A bus of both with the same entry stays; one whose entry changed stays as
    it runs (named in ``kept``); a new one starts; one gone from the file
    stops -- unless a bus that stays still runs under it (then it is kept too).
    ``log_dir`` is kept as it was; the restart delays change.  Raises
    ``ConfigError`` if the tree that would run breaks the tree rules (a new
    bus at a kept bus's address, say).
    """
    old = {spec.name: spec for spec in running.buses}
    kept: list[tuple[str, str]] = []
    specs: dict[str, BusSpec] = {}
    for spec in loaded.buses:
        before = old.get(spec.name)
        if before is None or before == spec:
            specs[spec.name] = spec
            continue
        specs[spec.name] = before
        changed = [f for f in _BUS_FIELDS if getattr(before, f) != getattr(spec, f)]
        kept.append((spec.name, "changed " + ", ".join(changed)))
    needed = True
    while needed:  # a bus gone from the file that a remaining bus runs under stays
        needed = False
        for spec in list(specs.values()):
            parent = spec.upstream
            if parent is not None and parent not in specs:
                specs[parent] = old[parent]
                kept.append((parent, f"gone from the file, but {spec.name} runs under it"))
                needed = True
    if loaded.log_dir != running.log_dir:
        kept.append(("log_dir", f"still {running.log_dir}"))
    # the running buses first, so that a clash is reported on the newcomer
    remaining = sorted(specs.values(), key=lambda s: s.name not in old)
    _check_tree(source, remaining)
    ordered = sorted(remaining, key=lambda s: _depth(remaining, s))
    stopped = tuple(s.name for s in running.buses if s.name not in specs)
    started = tuple(s.name for s in ordered if s.name not in old)
    tree = Hierarchy(tuple(ordered), running.log_dir, loaded.restart_min, loaded.restart_max)
    return TreeReload(tree, started, stopped, tuple(kept))
