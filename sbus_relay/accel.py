"""The hot path compiled where it was built, pure Python everywhere else.

What it owns: the choice between the compiled and the pure-Python hot path,
made once per process.  What it may touch: the environment, the build's
record, the modules it loads.

The modules on a message's way through the bus (``protocol.scan``, ``keys``,
``index``, ``quota``, ``flood``, ``episodes``, ``frames``, ``session``,
``bus.connection`` and the NATS link's ``link.inbound``, ``outbound`` and ``tobus``; across hosts
``protocol.natsenvelope``, ``natssubs``, ``natsledger`` and ``natsorigins``) are
plain Python, the one source of truth.  Installing the package compiles each of
them with Cython when a C compiler is present, into a module of its own
beside it (``bus/connection.py`` -> ``sbus_relay.bus._c_connection``, typed
by ``bus/_c_connection.pxd``), as gevent does with its own modules.  Each
source module ends with ``load_compiled(globals(), <compiled name>)``, which
replaces its contents with the compiled module's -- unless:

* ``SBUS_PURE_PYTHON=1`` is set: the pure-Python path, kept and tested;
* nothing was compiled (no compiler or no Cython at install time);
* the compiled modules were built from other sources than those beside them
  (a checkout edited since it was installed): a warning says so, once.

The choice is all or nothing, made once per process on the first call (from
the environment and the build's record, importing nothing), so compiled and
pure classes never meet.  ``mode()`` says which was taken, and why.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import warnings
import zlib
from pathlib import Path
from typing import Any

#: Set (to anything but "" or "0") to run the pure-Python path.
PURE_PYTHON_ENV = "SBUS_PURE_PYTHON"
#: The compiled modules, each built from the source module named beside it.
COMPILED = {
    "sbus_relay.protocol._c_scan": "sbus_relay.protocol.scan",
    "sbus_relay.protocol._c_keys": "sbus_relay.protocol.keys",
    "sbus_relay.protocol._c_quota": "sbus_relay.protocol.quota",
    "sbus_relay.protocol._c_index": "sbus_relay.protocol.index",
    "sbus_relay.protocol._c_flood": "sbus_relay.protocol.flood",
    "sbus_relay.protocol._c_episodes": "sbus_relay.protocol.episodes",
    "sbus_relay.protocol._c_frames": "sbus_relay.protocol.frames",
    "sbus_relay.protocol._c_session": "sbus_relay.protocol.session",
    "sbus_relay.protocol._c_natsenvelope": "sbus_relay.protocol.natsenvelope",
    "sbus_relay.protocol._c_natssubs": "sbus_relay.protocol.natssubs",
    "sbus_relay.protocol._c_natsledger": "sbus_relay.protocol.natsledger",
    "sbus_relay.protocol._c_natsorigins": "sbus_relay.protocol.natsorigins",
    "sbus_relay.bus._c_connection": "sbus_relay.bus.connection",
    "sbus_relay.link._c_inbound": "sbus_relay.link.inbound",
    "sbus_relay.link._c_outbound": "sbus_relay.link.outbound",
    "sbus_relay.link._c_tobus": "sbus_relay.link.tobus",
}
#: What the build records: the modules it compiled, and the digest of the
#: sources they came from (all of them: a module's C layout depends on the
#: .pxd files it cimports).
DIGESTS_FILE = "_compiled.json"

_ROOT = Path(__file__).resolve().parent
_decision: tuple[bool, str] | None = None


def pure_python_requested() -> bool:
    """Whether the environment asks for the pure-Python path."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def source_files(compiled: str) -> list[Path]:
    """The files a compiled module is built from: its .py and its .pxd."""
    package, _, name = compiled.rpartition(".")
    folder = _ROOT.parent.joinpath(*package.split("."))
    source = COMPILED[compiled].rpartition(".")[2] + ".py"
    return [folder / source, folder / (name + ".pxd")]


def digest() -> str:
    """A checksum of every compiled module's sources as they are now.

    CRC-32 and length: it tells a checkout edited since the build from the
    one built, and guards against nothing else; zlib rather than hashlib, so
    that no server loads OpenSSL (megabytes) just to start."""
    crc = size = 0
    for name in COMPILED:
        for path in source_files(name):
            data = path.read_bytes()
            crc = zlib.crc32(data, crc)
            size += len(data)
    return f"crc32:{crc:08x}:{size}"


def _decide() -> tuple[bool, str]:
    if pure_python_requested():
        return False, f"pure Python ({PURE_PYTHON_ENV} is set)"
    try:
        built = json.loads((_ROOT / DIGESTS_FILE).read_text())
    except (OSError, ValueError):
        return False, "pure Python (the hot path was not compiled at install time)"
    missing = sorted(COMPILED[name] for name in COMPILED if name not in built.get("modules", ()))
    if missing:
        return False, "pure Python (not compiled at install time: %s)" % ", ".join(missing)
    if built.get("sources") != digest():
        why = "pure Python (compiled from older sources: reinstall to rebuild the hot path)"
        warnings.warn("sbus_relay: " + why, RuntimeWarning, stacklevel=3)
        return False, why
    unbuilt = [name for name in COMPILED if importlib.util.find_spec(name) is None]
    if unbuilt:
        return False, "pure Python (compiled modules missing: %s)" % ", ".join(unbuilt)
    return True, "compiled (Cython)"


def mode() -> str:
    """Which path this process runs, and why: "compiled (Cython)" or "pure Python (...)"."""
    global _decision
    if _decision is None:
        _decision = _decide()
    return _decision[1]


def compiled() -> bool:
    """Whether this process runs the compiled hot path."""
    mode()
    assert _decision is not None
    return _decision[0]


class NotCompiled:
    """What ``cython.compiled`` reads where Cython itself is not installed.

    A compiled module's few C-only shortcuts sit under ``if cython.compiled:``,
    which Cython settles when it compiles; the pure path imports this instead.
    """

    compiled = False


def load_compiled(namespace: dict[str, Any], name: str) -> None:
    """At the end of a source module: take the compiled module's contents, if chosen."""
    if namespace.get("__name__") == name or not compiled():
        return  # running as the compiled module itself, or the pure path
    module = importlib.import_module(name)
    namespace.clear()
    namespace.update(module.__dict__)
