"""The package's layers, checked from its own imports (docs/design.md, "Layers").

Every ``sbus_relay`` module may import only from its own layer or those below
it (type-only imports included), the sans-I/O core imports neither ``socket``
nor ``gevent``, and no set of modules imports itself in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parents[2] / "sbus_relay"

#: Layer of each top-level part of the package, lowest first.
LAYERS = {
    "sbus_relay": 0,  # the package's own __init__: a version string
    "accel": 0,  # which of the hot path's modules run compiled
    "protocol": 1,
    "ops": 2,
    "bus": 3,
    "link": 3,  # the NATS link process: beside the bus, neither imports the other
    "client": 4,
    "pipeline": 5,
    "bench": 5,
    "cli": 6,
    "__main__": 7,
}
#: What the sans-I/O core must never import.
IO_MODULES = ("socket", "gevent", "select", "selectors", "asyncio")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, resolved to absolute names (anywhere in the file)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else parts[0]]


def internal_edges() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {dep for dep in imports(name, path) if dep in known and dep != name}
        for name, path in known.items()
    }


def test_every_part_of_the_package_has_a_layer() -> None:
    for name in modules():
        layer(name)  # KeyError names the part without one


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [
        f"{name} (layer {layer(name)}) imports {dep} (layer {layer(dep)})"
        for name, deps in internal_edges().items()
        for dep in deps
        if layer(dep) > layer(name)
    ]
    assert upward == []


def test_the_protocol_core_does_no_io() -> None:
    for name, path in modules().items():
        if name.startswith("sbus_relay.protocol"):
            bad = {dep for dep in imports(name, path) if dep.split(".")[0] in IO_MODULES}
            assert not bad, f"{name} imports {bad}"


#: The client library's sans-I/O core: its protocol state machine and counts.
CLIENT_CORE = ("sbus_relay.client.session", "sbus_relay.client.stats")


def test_the_client_core_does_no_io_and_reads_the_wire_through_protocol() -> None:
    found = modules()
    for name in CLIENT_CORE:
        deps = imports(name, found[name])
        bad = {dep for dep in deps if dep.split(".")[0] in IO_MODULES}
        assert not bad, f"{name} imports {bad}"
        outside = {
            d
            for d in deps
            if d.startswith("sbus_relay.")
            and not d.startswith(("sbus_relay.protocol", *CLIENT_CORE))
        }
        assert not outside, f"{name} imports {outside}: only protocol/ and the core itself"


def test_no_import_circles() -> None:
    edges = internal_edges()
    # a package's __init__ re-exporting its modules is not a circle with them
    for name in edges:
        edges[name] = {d for d in edges[name] if not name.startswith(d + ".")}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                circle = [*path[path.index(dep) :], dep]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name)


def test_the_hardening_harness_is_not_in_the_package() -> None:
    assert not (PACKAGE / "hardening").exists()
    assert not any("hardening" in name for name in modules())


#: What the pipeline package is for: the commands and the Spark data source.
PIPELINE_ENTRIES = (
    "sbus_relay.cli.record",
    "sbus_relay.cli.analyze",
    "sbus_relay.cli.spark_server",
    "sbus_relay.pipeline.datasource",
)


def test_the_pipeline_holds_only_what_its_commands_and_data_source_run() -> None:
    """Benchmarks, synthetic captures, the DuckDB peer and the tests' cluster are
    bench code: every pipeline module is reached from a command or the data source."""
    edges = internal_edges()
    reached: set[str] = set()
    todo = list(PIPELINE_ENTRIES)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(edges[name])
    unused = sorted(
        name
        for name in modules()
        if name.startswith("sbus_relay.pipeline.") and name not in reached
    )
    assert unused == [], f"pipeline modules no command or the data source runs: {unused}"
