"""docs/design.md's rules, checked from the source (parsed, not imported).

* **Headers.**  Every module opens with what it owns and what it may touch:
  a paragraph ``What it owns: ... What it may touch: ...`` within the first
  two of its docstring (after its one-line summary).
* **Nothing waits on the hub.**  The code gevent's hub runs -- the bus
  (``bus/``), the parts of ``ops/``
  the bus calls while it serves, and a bus's process life -- never calls what
  blocks the thread: ``time.sleep``, anything of ``threading``, ``select``
  or ``subprocess`` that waits, a socket given a timeout or made blocking.
  What waits there is gevent's (``gevent.sleep``, its events), which yields.
* **The codec alone reads the wire**: ``tests/unit/test_codec_only.py``.

Each exception is listed with why it is one; a listed exception that no
longer occurs fails the test, so the lists cannot go stale.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parents[2] / "sbus_relay"
HEADER = re.compile(r"What it owns: .+ What it may touch: .+", re.S)
#: Modules whose header is another stream's to write (they are being rewritten).
HEADER_PENDING: dict[str, str] = {}


def module_paths() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), path


def opening(path: Path) -> str:
    """The docstring's first two paragraphs, whitespace made single spaces."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]
    return "\n".join(paragraphs[:2])


def test_every_module_opens_with_what_it_owns_and_may_touch() -> None:
    missing = []
    for name, path in module_paths():
        if name in HEADER_PENDING:
            continue
        if not HEADER.search(opening(path)):
            missing.append(name)
    assert missing == [], "modules without 'What it owns: ... What it may touch: ...':\n" + (
        "\n".join(missing)
    )


def test_the_pending_headers_are_still_pending() -> None:
    written = [n for n in HEADER_PENDING if HEADER.search(opening(PACKAGE / n))]
    assert written == [], f"these have their header now: drop them from HEADER_PENDING {written}"


# --- nothing waits on the hub ------------------------------------------------------

#: The modules gevent's hub runs: the bus, what of ops/ it calls while it
#: serves, and the process life of a bus (signals, upgrade, linger).
HUB = [f"bus/{p.name}" for p in sorted((PACKAGE / "bus").glob("*.py"))] + [
    "ops/logsetup.py",
    "ops/collector.py",
    "ops/metrics_server.py",
    "ops/natsmetrics.py",
    "ops/clients.py",
    "ops/handover.py",
    "ops/lifecycle.py",
]
#: Not on the hub (none now: the NATS link is a process of its own, link/).
OFF_HUB: set[str] = set()
#: (module, what) -> why it does not wait, or why it may.
WAIT_ALLOWED: dict[tuple[str, str], str] = {
    ("ops/logsetup.py", "import select"): "polls with a timeout of 0: never waits",
    ("ops/logsetup.py", "import threading"): "only names the calling thread (get_ident)",
    ("ops/handover.py", "settimeout"): (
        "a live upgrade's exchange freezes the bus on purpose: nothing is read, written or"
        " accepted while its state goes to the new process; each step is bounded by"
        " UPGRADE_TIMEOUT"
    ),
    ("bus/natslink.py", "import subprocess"): (
        "Popen starts the link process and poll() reaps it: it is never waited for"
    ),
    ("ops/lifecycle.py", "import subprocess"): "Popen starts the successor: it never waits",
    ("bus/linkcut.py", "import subprocess"): (
        "for the type of a Popen only (TYPE_CHECKING): natslink starts the link process"
    ),
    ("bus/linkcut.py", "import select"): (
        "polls the old link process's pidfd with a timeout of 0: never waits"
    ),
}
#: Modules whose import is a wait in the making on the hub.
WAITING_MODULES = {"threading", "select", "subprocess", "queue"}
#: subprocess and os calls that wait for a child.
WAITING_CALLS = {"run", "call", "check_call", "check_output", "communicate"}


def waits(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) for each thing in ``tree`` that blocks the thread it runs on."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in WAITING_MODULES:
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module in WAITING_MODULES:
            yield node.lineno, f"import {node.module}"
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            if any(a.name == "sleep" for a in node.names):
                yield node.lineno, "time.sleep"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func, owner = node.func, node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else ""
            if owner_name == "time" and func.attr == "sleep":
                yield node.lineno, "time.sleep"
            elif owner_name == "subprocess" and func.attr in WAITING_CALLS:
                yield node.lineno, f"subprocess.{func.attr}"
            elif func.attr == "communicate":
                yield node.lineno, "communicate"
            elif func.attr == "settimeout" and not _zero(node.args):
                yield node.lineno, "settimeout"
            elif func.attr == "setblocking" and not _false(node.args):
                yield node.lineno, "setblocking"
            elif func.attr == "waitpid" and owner_name == "os" and not _nohang(node.args):
                yield node.lineno, "os.waitpid"
            elif func.attr == "wait" and "proc" in owner_name:
                yield node.lineno, "wait for a process"


def _zero(args: list[ast.expr]) -> bool:
    return bool(args) and isinstance(args[0], ast.Constant) and args[0].value in (0, 0.0)


def _false(args: list[ast.expr]) -> bool:
    return bool(args) and isinstance(args[0], ast.Constant) and args[0].value is False


def _nohang(args: list[ast.expr]) -> bool:
    return len(args) > 1 and "WNOHANG" in ast.unparse(args[1])


def test_nothing_waits_on_the_hub() -> None:
    found, seen = [], set()
    for name in HUB:
        if name in OFF_HUB or not (PACKAGE / name).exists():
            continue
        for line, what in waits(ast.parse((PACKAGE / name).read_text())):
            if (name, what) in WAIT_ALLOWED:
                seen.add((name, what))
            else:
                found.append(f"{name}:{line}: {what}")
    assert found == [], "what waits on gevent's hub:\n" + "\n".join(found)
    stale = set(WAIT_ALLOWED) - seen
    assert not stale, f"listed as waits but no longer there: {sorted(stale)}"


@pytest.mark.parametrize(
    ("code", "what"),
    [
        ("import time\ntime.sleep(1)", "time.sleep"),
        ("from time import sleep", "time.sleep"),
        ("import threading", "import threading"),
        ("subprocess.run(['x'])", "subprocess.run"),
        ("sock.settimeout(5)", "settimeout"),
        ("sock.setblocking(True)", "setblocking"),
        ("os.waitpid(pid, 0)", "os.waitpid"),
        ("proc.wait()", "wait for a process"),
    ],
)
def test_the_walk_finds_each_wait(code: str, what: str) -> None:
    assert what in {w for _, w in waits(ast.parse(code))}


@pytest.mark.parametrize(
    "code",
    [
        "gevent.sleep(0.1)",
        "sock.settimeout(0.0)",
        "sock.setblocking(False)",
        "os.waitpid(-1, os.WNOHANG)",
        "event.wait(1.0)",  # a gevent event's: it yields
    ],
)
def test_the_walk_passes_what_yields(code: str) -> None:
    assert list(waits(ast.parse(code))) == []


# --- errors seen -------------------------------------------------------------------

#: Modules whose broad handlers are another stream's to narrow (none now).
BROAD_PENDING: dict[str, str] = {}
BROAD = {"Exception", "BaseException"}


def broad_handlers(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, code) of each broad ``except`` or ``suppress`` that neither raises,
    nor counts the bug (``Stats.bug``), nor keeps the exception for later."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("suppress"):
            if any(ast.unparse(a) in BROAD for a in node.args):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.ExceptHandler):
            caught = "" if node.type is None else ast.unparse(node.type)
            if node.type is not None and caught not in BROAD:
                continue
            body = ast.Module(body=node.body, type_ignores=[])
            raises = any(isinstance(n, ast.Raise) for n in ast.walk(body))
            counted = any(
                isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".bug")
                for n in ast.walk(body)
            )
            kept = node.name is not None and any(
                isinstance(n, ast.Name) and n.id == node.name for n in ast.walk(body)
            )
            if not (raises or counted or kept):
                yield node.lineno, f"except {caught or ''}:".replace(" :", ":")


def test_no_broad_handler_hides_a_bug() -> None:
    found, seen = [], set()
    for name, path in module_paths():
        for line, code in broad_handlers(ast.parse(path.read_text())):
            if name in BROAD_PENDING:
                seen.add(name)
            else:
                found.append(f"{name}:{line}: {code}")
    assert found == [], "broad handlers that hide what they catch:\n" + "\n".join(found)
    assert not set(BROAD_PENDING) - seen, "no broad handler left there: drop it from the list"


@pytest.mark.parametrize(
    ("code", "hides"),
    [
        ("try:\n    f()\nexcept Exception:\n    pass", True),
        ("with contextlib.suppress(Exception):\n    f()", True),
        ("try:\n    f()\nexcept:\n    pass", True),
        ("try:\n    f()\nexcept Exception:\n    cleanup()\n    raise", False),
        ("try:\n    f()\nexcept Exception:\n    if stats.bug('x'):\n        log()", False),
        ("try:\n    f()\nexcept BaseException as exc:\n    self.error = exc", False),
        ("try:\n    f()\nexcept OSError:\n    pass", False),
    ],
)
def test_the_walk_tells_a_hidden_error(code: str, hides: bool) -> None:
    assert bool(list(broad_handlers(ast.parse(code)))) == hides


# --- every limit defined once ---------------------------------------------------------


def assigned(path: Path) -> Iterator[tuple[int, str]]:
    """(line, name) of each UPPER_CASE name a module assigns at its top level."""
    for node in ast.parse(path.read_text()).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and target.id.isupper():
                yield node.lineno, target.id


def test_every_limit_is_defined_once() -> None:
    """A bound of ``protocol/limits.py`` (a named constant with its reason) is
    defined nowhere else: another module that needs another value names it for
    what it is (``RECORDER_READ_BATCH``, not a second ``READ_BATCH``), and one
    that needs the same value imports it."""
    limits = {name for _, name in assigned(PACKAGE / "protocol" / "limits.py")}
    found = [
        f"{name}:{line}: {what}"
        for name, path in module_paths()
        if name != "protocol/limits.py"
        for line, what in assigned(path)
        if what in limits
    ]
    assert found == [], "limits defined again outside protocol/limits.py:\n" + "\n".join(found)
