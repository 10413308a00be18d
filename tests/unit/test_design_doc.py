"""docs/design.md names only what exists: every module, class, function and file.

The doc is read for names: each span in backticks, and in its diagrams each
``Name.member`` and ``file.py``.  A name is looked up in the package's source
(parsed, not imported):

* a path (``bus/server.py``, ``tests/hardening/harness/``) must exist, from
  the repository or from the package;
* ``module.name`` and ``Class.member`` must be defined there (a class's
  members: its methods, class attributes and ``self.x`` assignments, its
  bases' within the package included);
* a ``Class`` or ``CONSTANT`` must be defined somewhere in the package;
* a call, ``name(a, b=None)``, must name the callable's own parameters;
* a lowercase word must be a module, a name the code defines (a function, an
  attribute, a parameter, a keyword argument), or a string the code uses
  (``syslog``, a log event).

What is not code -- a protocol key (``echo/off``), a shell command, an
environment setting -- is passed over.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sbus_relay"
DOC = REPO / "docs" / "design.md"
#: Directories a path in the doc may start from (the repository's and the package's).
PATH_ROOTS = (REPO, PACKAGE)
#: Extensions that make a span a file name.
FILE_EXTENSIONS = (".py", ".md", ".c", ".json", ".pxd", ".so", ".yaml", ".txt", ".toml")
#: A placeholder in a pattern of names (``_c_X.pxd``): not a name itself.
PLACEHOLDER = re.compile(r"(?<![A-Za-z])X(?![A-Za-z])")
#: What the doc names from outside the package: the systems and kernel APIs it uses.
EXTERNAL = {"sd_notify", "SCM_RIGHTS", "SO_PEERCRED", "recvmmsg", "sendmmsg", "unshare", "os._exit"}
#: Names today's doc gives that the code does not have, each with what is true.
#: Emptied as the doc is corrected: a name listed here that the doc no longer
#: gives wrongly fails the test, so the list cannot go stale.
KNOWN_STALE: dict[str, str] = {}


@dataclass
class Module:
    """What one module of the package defines."""

    top: set[str] = field(default_factory=set)
    params: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class ClassInfo:
    """What one class defines: members, bases, and its constructor's parameters."""

    members: set[str] = field(default_factory=set)
    bases: list[str] = field(default_factory=list)
    params: dict[str, list[str]] = field(default_factory=dict)
    fields: list[str] = field(default_factory=list)


@dataclass
class Code:
    """The package, parsed: modules, classes, every defined name, every string."""

    modules: dict[str, Module] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)

    def members(self, cls: str) -> set[str]:
        """A class's members, those of its bases (in the package) included."""
        found: set[str] = set()
        todo, seen = [cls], set()
        while todo:
            name = todo.pop()
            if name in seen or name not in self.classes:
                continue
            seen.add(name)
            found |= self.classes[name].members
            todo += self.classes[name].bases
        return found


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = node.args
    every = (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
    return [p.arg for p in every if p and p.arg not in ("self", "cls")]


@cache
def code() -> Code:
    """Parse every module of the package once."""
    found = Code()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        tree = ast.parse(path.read_text(), str(path))
        module = Module()
        if parts:
            found.modules[".".join(parts)] = module
            found.names.add(parts[-1])
        else:
            found.modules[""] = module
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module.top.add(node.name)
                if not isinstance(node, ast.ClassDef):
                    module.params[node.name] = _params(node)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                module.top |= {t.id for t in targets if isinstance(t, ast.Name)}
        for sub in ast.walk(tree):
            if isinstance(sub, ast.ClassDef):
                found.classes[sub.name] = _class(sub)
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.names.add(sub.name)
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                found.names |= set(_params(sub))
            elif isinstance(sub, ast.Name | ast.arg):
                found.names.add(sub.id if isinstance(sub, ast.Name) else sub.arg)
            elif isinstance(sub, ast.Attribute):
                found.names.add(sub.attr)
            elif isinstance(sub, ast.keyword) and sub.arg:
                found.names.add(sub.arg)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                found.strings.add(sub.value)
    return found


def _class(node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo(bases=[ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases])
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            info.members.add(item.name)
            info.params[item.name] = _params(item)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            info.members.add(item.target.id)
            info.fields.append(item.target.id)
        elif isinstance(item, ast.Assign):
            info.members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    for sub in ast.walk(node):  # self.x = ... in any method
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                info.members.add(target.attr)
    return info


# --- the names the doc gives -----------------------------------------------------


def doc_names(text: str) -> Iterator[str]:
    """Each backticked span, and in the fenced diagrams each ``A.b`` and ``x.py``."""
    fenced = re.split(r"^```.*$", text, flags=re.MULTILINE)
    for i, part in enumerate(fenced):
        if i % 2:  # inside a fence: a module's or a class's member, a file (not ``sock.send``)
            for name in re.findall(r"(?<![\w./])[A-Za-z_]\w*\.[A-Za-z_]\w*(?![\w/])", part):
                head, tail = name.split(".")
                if tail == "py" or head in code().classes or _module(head) is not None:
                    yield name
        else:
            yield from re.findall(r"`([^`\n]+)`", part)


def _module(dotted: str) -> str | None:
    """The package module that ``dotted`` names (with or without ``sbus_relay.``)."""
    modules = code().modules
    name = dotted.removeprefix("sbus_relay.").removeprefix("sbus_relay")
    if name in modules:
        return name
    shorts = [m for m in modules if m.rsplit(".", 1)[-1] == name]
    return shorts[0] if len(shorts) == 1 else None


def _is_path(span: str) -> bool:
    head = span.split("/", 1)[0]
    roots = {p.name for root in PATH_ROOTS for p in root.iterdir() if p.is_dir()}
    return span.endswith(FILE_EXTENSIONS) or ("/" in span and head in roots)


def check(span: str) -> str | None:
    """Why ``span`` names nothing that exists (None when it does, or is not code)."""
    span = span.strip()
    if span in EXTERNAL:
        return None
    if PLACEHOLDER.search(span) or re.search(r"[\s\"'\\<>!=]|^-", span.split("(")[0]):
        return None  # a pattern, a phrase, a command, a protocol string
    if _is_path(span):
        if any((root / span).exists() for root in PATH_ROOTS):
            return None
        if "/" not in span and list(PACKAGE.rglob(span)):
            return None  # a file named by its name alone (``server.py``)
        if (PACKAGE / f"{span}.py").exists():
            return None  # a module by its path (``bus/connection``)
        return "no such file"
    if "/" in span:
        return None  # a protocol key or pattern (``echo/off``, ``!/cred/``)
    call = re.fullmatch(r"([\w.]+)\((.*)\)(?:\s*->\s*\w+)?", span)
    name = call.group(1) if call else span
    if not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        return None
    params = _resolve(name)
    if isinstance(params, str):
        return None if span in code().strings else params
    if call and call.group(2).strip() and params is not None:
        given = [p.split("=")[0].strip(" *") for p in call.group(2).split(",")]
        missing = [p for p in given if p and p not in params]
        if missing:
            return f"takes no parameter {', '.join(missing)} (it takes {', '.join(params)})"
    return None


def _resolve(name: str) -> list[str] | str | None:
    """Parameters of what ``name`` names (None: not a callable), or why it names nothing."""
    found = code()
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a module
        module = _module(".".join(parts[:cut]))
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        top = found.modules[module]
        if rest[0] not in top.top and not (PACKAGE / module.replace(".", "/") / rest[0]).exists():
            # ``index.add``: the module's one public class's (what the module is for)
            public = [n for n in top.top if n in found.classes and not n.startswith("_")]
            if len(rest) == 1 and len(public) == 1 and rest[0] in found.members(public[0]):
                return _member(public[0], rest)
            return f"{module} defines no {rest[0]}"
        if len(rest) == 1:
            return _callable_params(rest[0], top.params.get(rest[0]))
        return _member(rest[0], rest[1:])
    if parts[0] in found.classes:
        return _member(parts[0], parts[1:]) if parts[1:] else _callable_params(parts[0], None)
    if len(parts) > 1:
        return f"neither a module nor a class: {parts[0]}"
    if name[0].isupper() and not name.isupper():
        return "no such class"
    if name.isupper():
        if any(name in m.top for m in found.modules.values()) or name in found.names:
            return None
        return "no such constant"
    if name in found.names:
        return None
    return "the code defines no such name"


def _member(cls: str, rest: list[str]) -> list[str] | str | None:
    if len(rest) != 1:
        return f"{cls}.{'.'.join(rest)}: too deep to check"
    if rest[0] not in code().members(cls):
        return f"class {cls} has no member {rest[0]}"
    info = code().classes[cls]
    return info.params.get(rest[0])


def _callable_params(name: str, params: list[str] | None) -> list[str] | None:
    info = code().classes.get(name)
    if info is None:
        return params
    init = next(
        (code().classes[c].params["__init__"] for c in [name, *info.bases]
         if c in code().classes and "__init__" in code().classes[c].params),
        None,
    )  # fmt: skip
    return init if init is not None else info.fields or None


# --- the tests ---------------------------------------------------------------------


def flagged() -> dict[str, str]:
    """Every name of docs/design.md that names nothing in the code, with why."""
    wrong = {}
    for span in doc_names(DOC.read_text()):
        why = check(span)
        if why is not None:
            wrong[span] = why
    return wrong


def test_every_name_in_the_design_doc_exists() -> None:
    wrong = {span: why for span, why in flagged().items() if span not in KNOWN_STALE}
    assert not wrong, "docs/design.md names what the code lacks:\n" + "\n".join(
        f"  `{span}`: {why}" for span, why in sorted(wrong.items())
    )


def test_the_known_stale_names_are_still_wrong() -> None:
    corrected = set(KNOWN_STALE) - set(flagged())
    assert not corrected, (
        f"docs/design.md is right about these now: drop them from KNOWN_STALE: {corrected}"
    )


def test_the_checker_finds_what_is_missing() -> None:
    # the checker itself: names that exist pass, names that do not are caught
    for good in (
        "bus/connection.py",
        "Connection.deliver",
        "ops.config.plan_reload",
        "SubscriptionIndex",
        "ServerConfig",
        "Client(address, *, timeout=None, cooperative=False)",
        "tests/hardening/harness/",
        "echo/off",
        "_c_X.pxd",
    ):
        assert check(good) is None, good
    for bad in (
        "bus/nothing.py",
        "Connection.no_such_method",
        "ops.config.no_such_function",
        "NoSuchClass",
        "NO_SUCH_LIMIT",
        "Client(address, *, no_such_parameter=None)",
        "protocol.nothing.decide",
        "/".join(("tests", "nothing", "")),  # (spelt so: no path the docs test would check)
    ):
        assert check(bad) is not None, bad
