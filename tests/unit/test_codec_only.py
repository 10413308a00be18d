"""The wire is read and written in ``protocol/`` alone (docs/design.md, "Rules").

The package's source is parsed (not imported) and every module outside
``sbus_relay/protocol/`` is walked for what only the codec may do:

* a literal packet prefix: a bytes constant (or a string with a NUL in it)
  that begins with a verb (``MSG ``, ``CMSG ``, ``SUB ``, ``UNSUB ``);
* the codec's own spelling of the wire, ``MSG``, ``CMSG``, ``SUB``,
  ``UNSUB``, ``NUL`` or ``BATCH_HEAD`` of ``protocol.codec``, imported or
  read as an attribute;
* splitting on a NUL: ``find``, ``index``, ``split``, ``partition`` (and
  their right-hand forms) of a NUL, or a NUL joined with ``+``;
* slicing a packet: a slice of something named like a packet (``packet``,
  ``frame``, ``msg``, ``buffer``, ``view``, ``head``, ``answer``, ``payload``)
  other than ``[:length]``, a received packet's length.

Each exception is listed below with why it is one; a listed exception that
no longer occurs fails the test, so the list cannot go stale.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parents[2] / "sbus_relay"
#: Where the wire may be spelled.
CODEC = PACKAGE / "protocol"
#: Verbs a packet begins with (docs/protocol.md, "Packets").
VERBS = ("MSG ", "CMSG ", "SUB ", "UNSUB ")
#: The codec's names for the wire's bytes.
WIRE_NAMES = {"MSG", "CMSG", "SUB", "UNSUB", "NUL", "BATCH_HEAD"}
#: Methods that split or search bytes.
SPLITTERS = {"find", "rfind", "index", "rindex", "split", "rsplit", "partition", "rpartition"}
#: A name that holds a packet (or a buffer a packet is received into).
PACKETISH = re.compile(r"(?:^|_)(packet|frame|msg|buffer|buf|view|head|answer|payload)$")
#: (file, what) -> why it is not the wire.
ALLOWED: dict[tuple[str, str], str] = {
    ("bus/connection.py", "BATCH_HEAD"): (
        "handed to the compiled sendmmsg helper (bus/batchio.py), which gathers"
        " codec.pack's frames from the packets without copying"
    ),
    ("ops/supervisor.py", "split NUL"): "/proc/<pid>/cmdline is NUL-separated, not a packet",
    ("ops/daemon.py", "join NUL"): "an abstract socket's name (sd_notify's) begins with a NUL",
    ("link/bridge.py", "slice"): "the first bytes of a packet the codec refused, in hex, logged",
}


def sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if CODEC in path.parents:
            continue
        yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text(), str(path))


def is_nul(node: ast.AST) -> bool:
    """A NUL: ``b"\\0"``, ``"\\0"``, ``0`` (a byte), ``chr(0)`` or a name ``NUL``."""
    if isinstance(node, ast.Constant):
        return node.value in (b"\0", "\0") or (node.value == 0 and type(node.value) is int)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "chr":
        return len(node.args) == 1 and is_nul(node.args[0])
    return isinstance(node, ast.Name | ast.Attribute) and name_of(node) in ("NUL", "_NUL")


def name_of(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return name_of(node.func)
    if isinstance(node, ast.Subscript):
        return name_of(node.value)
    return ""


def slices_a_packet(node: ast.Subscript) -> bool:
    """A slice of a packet, other than ``[:length]`` (a received packet's bytes)."""
    if not isinstance(node.slice, ast.Slice) or not PACKETISH.search(name_of(node.value)):
        return False
    s = node.slice
    taken_whole = s.lower is None and s.step is None and isinstance(s.upper, ast.Name)
    return not (taken_whole and "nul" not in s.upper.id.lower())  # type: ignore[union-attr]


def findings(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, what, the offending source) for everything only the codec may do."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            value = node.value
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            # bytes, or a str with a NUL in it: a packet, not a sentence about one
            if text.startswith(VERBS) and (isinstance(value, bytes) or "\0" in text):
                yield node.lineno, "prefix", text
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("codec"):
            for alias in node.names:
                if alias.name in WIRE_NAMES:
                    yield node.lineno, alias.name, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Attribute) and node.attr in WIRE_NAMES:
            if name_of(node.value) == "codec":
                yield node.lineno, node.attr, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SPLITTERS and node.args and is_nul(node.args[0]):
                yield node.lineno, "split NUL", ast.unparse(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if is_nul(node.left) or is_nul(node.right):
                yield node.lineno, "join NUL", ast.unparse(node)
        elif isinstance(node, ast.Subscript) and slices_a_packet(node):
            yield node.lineno, "slice", ast.unparse(node)


def test_nothing_outside_protocol_reads_or_writes_the_wire() -> None:
    found = []
    seen: set[tuple[str, str]] = set()
    for path, tree in sources():
        for line, what, code in findings(tree):
            if (path, what) in ALLOWED:
                seen.add((path, what))
                continue
            found.append(f"{path}:{line}: {what}: {code}")
    assert not found, "the wire outside protocol/ (use protocol.codec):\n" + "\n".join(found)
    stale = set(ALLOWED) - seen
    assert not stale, f"listed as exceptions but no longer there: {sorted(stale)}"


@pytest.mark.parametrize(
    ("code", "what"),
    [
        ('packet.startswith(b"MSG ")', "prefix"),
        ('text.startswith("CMSG upgrade/refused\\0")', "prefix"),
        ("x = codec.BATCH_HEAD", "BATCH_HEAD"),
        ("from sbus_relay.protocol.codec import MSG", "MSG"),
        ('key, _, rest = data.partition(b"\\0")', "split NUL"),
        ("nul = packet.find(0, 4)", "split NUL"),
        ("text.split(chr(0), 1)", "split NUL"),
        ('out = key + b"\\0" + payload', "join NUL"),
        ("key = packet[4:nul]", "slice"),
        ('packet[:1] == b"M"', "slice"),
        ("rest = frame[len(HEAD):]", "slice"),
    ],
)
def test_the_walk_finds_each_kind(code: str, what: str) -> None:
    """Each rule fires on what it is for (a walk that finds nothing proves nothing)."""
    assert what in {w for _, w, _ in findings(ast.parse(code))}


@pytest.mark.parametrize(
    "code",
    [
        "packet = bytes(view[:size])",  # a received packet's bytes
        "parts = data[i : i + CHUNK]",  # not a packet
        "frames, counts = codec.pack(packets)",
        "sent = packets[done:]",  # a list of packets
        'help = "MSG packets received from them"',  # a sentence
    ],
)
def test_the_walk_passes_what_is_not_the_wire(code: str) -> None:
    assert list(findings(ast.parse(code))) == []
