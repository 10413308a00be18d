"""Reading a YAML file strictly: duplicate keys refused, every failure one ``ConfigError``.

What it owns: reading a YAML file strictly.  What it may touch: the file it
reads.

Apart from ``config`` so that only a process that reads a file imports the
YAML parser (``config.read_yaml`` imports this module when first called).
"""

from __future__ import annotations

from typing import Any

import yaml

from sbus_relay.protocol.errors import ConfigError

#: Characters of a converter's own complaint quoted in an error.
LONGEST_REASON = 80


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key
        self.line = line


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _value_node in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, list | dict):
            raise yaml.constructor.ConstructorError(
                None, None, "a key that is a list or a mapping", key_node.start_mark
            )
        if key in seen:
            raise _DuplicateKey(key, key_node.start_mark.line + 1)
        seen.add(key)
    return dict(loader.construct_pairs(node))


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def read_strictly(path: str) -> Any:
    """Parse the YAML file at ``path`` strictly; every failure is one ``ConfigError``."""
    try:
        with open(path, encoding="utf-8") as stream:
            return yaml.load(stream, Loader=_StrictLoader)
    except OSError as exc:
        raise ConfigError(path, "(file)", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "(file)", f"not UTF-8 text: {exc.reason}") from None
    except _DuplicateKey as exc:
        reason = f"given twice (again at line {exc.line})"
        raise ConfigError(path, str(exc.key), reason) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, "(file)", f"invalid YAML: {_yaml_reason(exc)}") from None
    except RecursionError:
        # The YAML parser recurses once per level of nesting.
        raise ConfigError(path, "(file)", "nested too deeply to be a config file") from None
    except ValueError as exc:
        # A scalar the resolver took for a date or number that is none: 2026-13-45,
        # or an integer of thousands of digits.
        reason = str(exc).split(":")[0][:LONGEST_REASON]
        raise ConfigError(
            path, "(file)", f"invalid YAML: a value that cannot be read ({reason})"
        ) from None


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{problem} at line {mark.line + 1}" if mark is not None else problem
