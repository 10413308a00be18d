"""The README and docs say what the code does: paths, modules, ports and figures.

* every path of this tree that the README, the docs, the configs' comments,
  the tests or the package cite exists, and every ``sbus_relay.x.y`` names a
  module (or a name in one);
* every metrics port the docs use is a shipped config's, or set on the same
  line; a line that names one config file and ports gives that file's; the
  README's ``/clients`` example asks ``make run``'s bus;
* docs/performance.md's tables are printed from the JSON of the one run it
  states, and its client library's figures from the JSON of the client run
  (``bench --only client``) it states; between them those runs judged every
  target of the code, and every figure its prose quotes is in those tables;
  the scenario table's targets are the code's;
* the README says how to get the reference; CONTRIBUTING.md says which tests
  ``make test`` and ``make test-slow`` run (in the Makefile's words), and for
  how long; every ``make`` target the docs name exists.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sbus_relay.bench import report
from sbus_relay.bench.profile import format_summary
from sbus_relay.bench.reference import UPSTREAM
from sbus_relay.bench.runner import DEFAULT_MESSAGES, DEFAULT_REPEAT, SCENARIO_NAMES

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "grafana" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
#: Files whose text may cite paths and modules of the tree.
CITING = [
    *DOCS,
    *sorted(ROOT.glob("configs/**/*.y*ml")),
    *sorted((ROOT / "sbus_relay").rglob("*.py")),
    *sorted((ROOT / "tests").rglob("*.py")),
]
#: A path into this tree: from a top-level directory of it, not part of a longer path or URL.
TREE_PATH = re.compile(r"(?<![\w./:-])((?:sbus_relay|tests|docs|configs|grafana|\.ci)/[\w./@-]*)")
#: ``sbus_relay.x.y`` as a module, or a name in one.
DOTTED = re.compile(r"(?<![\w./])(sbus_relay(?:\.\w+)+)")
#: Dotted names that are not modules, and why.
NOT_MODULES = {
    "sbus_relay.metrics": "the name of the metrics server's logger",
    "sbus_relay.sub": "the name of sub's logger",
    "sbus_relay.capture": "the Parquet metadata key that marks a capture file",
    "sbus_relay.rollup": "the Parquet metadata key that marks a rollup",
    "sbus_relay.rollup.depth": "a rollup's metadata: its prefixes' depth",
    "sbus_relay.rollup.window_ns": "a rollup's metadata: its windows' length",
    "sbus_relay.rollup.rows": "a rollup's metadata: its capture's rows",
    "sbus_relay.merged": "the Parquet metadata key that marks a merged rollup",
    "sbus_relay.merged.files": "a merged rollup's metadata: the capture files it covers",
    "sbus_relay.egg": "setuptools' metadata directory",
    "sbus_relay.libs": "the directory of a wheel's bundled shared libraries (auditwheel)",
}
#: Path-like words that are not paths of this tree.
NOT_PATHS = {"grafana/grafana"}  # the Grafana container image
HOST_PORT = re.compile(r"\b(?:127\.0\.0\.1|0\.0\.0\.0|localhost):(\d{2,5})\b")
#: Ports of other programs the docs name, and whose.
OTHER_PROGRAMS = {9090: "Prometheus", 3000: "Grafana", 4222: "NATS"}
PERFORMANCE = ROOT / "docs" / "performance.md"
RUN_JSON = ROOT / "docs" / "performance-run.json"
#: The client library's own run (``bench --only client``): its scenario
#: measures against NATS, not against the reference, in a run of its own.
CLIENT_RUN_JSON = ROOT / "docs" / "client-run.json"


def _cited(pattern: re.Pattern[str]) -> list[tuple[str, int, str]]:
    found = []
    for path in CITING:
        if path.resolve() == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in pattern.finditer(line):
                found.append((str(path.relative_to(ROOT)), number, match.group(1)))
    return found


def test_every_cited_path_exists() -> None:
    missing = []
    for where, number, text in _cited(TREE_PATH):
        path = text.split("#")[0].rstrip(".,:;)")
        if "*" in path or "<" in path or path in NOT_PATHS:
            continue
        if not (ROOT / path).exists():
            missing.append(f"{where}:{number}: {path}")
    assert missing == []


def _top_level_names(source: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _resolves(dotted: str) -> bool:
    """A module, or one name defined (or imported) at the top of a module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        if base.with_suffix(".c").is_file() and cut == len(parts):
            return True  # a compiled module, built from its C source
        if base.with_suffix(".pyx").is_file() and cut == len(parts):
            return True  # a compiled module, built from its Cython source (link/_natsc.pyx)
        if base.with_suffix(".pxd").is_file() and cut == len(parts):
            return True  # the compiled build of a Python module (sbus_relay.accel)
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else None
        if module is None and (base / "__init__.py").is_file():
            module = base / "__init__.py"
        if module is None:
            continue
        rest = parts[cut:]
        return not rest or (len(rest) == 1 and rest[0] in _top_level_names(module))
    return False


def test_every_cited_module_exists() -> None:
    unknown = [
        f"{where}:{number}: {name}"
        for where, number, name in _cited(DOTTED)
        if name not in NOT_MODULES and not _resolves(name)
    ]
    assert unknown == []


def _shipped_ports() -> dict[str, set[int]]:
    """Metrics (and scrape) ports per shipped config file."""
    ports: dict[str, set[int]] = {}
    for path in sorted(ROOT.glob("configs/**/*.y*ml")):
        text = path.read_text()
        found = {int(p) for p in HOST_PORT.findall(text)}
        for document in yaml.safe_load_all(text):  # a Kubernetes file may hold several
            if isinstance(document, dict) and isinstance(document.get("metrics"), str):
                found.add(int(document["metrics"].rsplit(":", 1)[1]))
            for bus in document.get("buses", []) if isinstance(document, dict) else []:
                if bus.get("metrics"):
                    found.add(int(bus["metrics"].rsplit(":", 1)[1]))
        ports[str(path.relative_to(ROOT))] = found
    return ports


def _metrics_port(config: str) -> int:
    document = yaml.safe_load((ROOT / config).read_text())
    return int(document["metrics"].rsplit(":", 1)[1])


def test_every_port_in_the_docs_is_one_the_configs_serve_or_the_line_sets() -> None:
    shipped = _shipped_ports()
    every = set().union(*shipped.values())
    wrong = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.relative_to(ROOT)}:{number}"
            sets_its_own = "--metrics" in line or "metrics:" in line
            for port in map(int, HOST_PORT.findall(line)):
                if port not in every and port not in OTHER_PROGRAMS and not sets_its_own:
                    wrong.append(f"{where}: port {port} is no shipped config's")
            named = set(re.findall(r"configs/[\w/.-]+\.ya?ml", line))
            if len(named) != 1:
                continue
            (config,) = named
            said = {int(p) for p in HOST_PORT.findall(line)}
            for low, high in re.findall(r"metrics on (\d+)(?:-(\d+))?", line):
                said.update(range(int(low), int(high or low) + 1))
            if said - shipped.get(config, set()):
                wrong.append(f"{where}: {config} serves {sorted(shipped.get(config, ()))},"
                             f" not {sorted(said)}")  # fmt: skip
    assert wrong == []


def test_the_readme_clients_example_asks_the_bus_make_run_starts() -> None:
    readme = (ROOT / "README.md").read_text()
    make_run = re.search(r"^run: .*\n\t.*-C (\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert make_run is not None
    curl = re.search(r"curl '\S*:(\d+)/clients", readme)
    assert curl is not None, "the README has no /clients example"
    assert int(curl.group(1)) == _metrics_port(make_run.group(1))


# --- docs/performance.md: one stated run --------------------------------------


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RUN_JSON.read_text())
    return data


def _block_after(text: str, heading: str) -> str:
    start = text.index(heading)
    match = re.search(r"```\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no code block after {heading!r}"
    return match.group(1).rstrip("\n")


def _trimmed(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines())


def test_the_performance_figures_are_the_stated_run(run: dict[str, Any]) -> None:
    text = PERFORMANCE.read_text()
    expected = _trimmed(report.format_table(run))
    assert _trimmed(_block_after(text, "### Now")) == expected, (
        "docs/performance.md's table is not the run's; it should read:\n" + expected
    )
    profile = _trimmed(format_summary(run["profile"], top=10))
    assert _trimmed(_block_after(text, "**After**")) == profile
    # The stated command is the one that made the run: a full run, with a profile.
    meta = run["meta"]
    assert (meta["quick"], meta["messages"], meta["repeat"]) == (
        False,
        DEFAULT_MESSAGES,
        DEFAULT_REPEAT,
    )
    assert meta["only"] is None and meta["reference"] and run["profile"]["status"] == "ok"
    command = _block_after(text, "The figures below come from one run of")
    assert "--json docs/performance-run.json" in command and "--profile" in command
    assert f"Measured on {meta['date'][:10]}" in text


@pytest.fixture(scope="module")
def client_run() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CLIENT_RUN_JSON.read_text())
    return data


def test_the_stated_runs_judged_the_code_s_targets(
    run: dict[str, Any], client_run: dict[str, Any]
) -> None:
    """Every target of the scenarios the runs have, as the code states it now; a
    scenario added since the main run is named as such on the page."""
    ran = set(run["scenarios"]) - {"client"}
    stated = [(v["label"], v["bound"]) for v in run["targets"] if v["scenario"] in ran]
    stated += [(v["label"], v["bound"]) for v in client_run["targets"]]
    ran.add("client")
    assert stated == [(t.label, t.bound) for t in report.TARGETS if t.scenario in ran], (
        "the targets changed since docs/performance.md's runs: rerun their commands"
    )
    text = PERFORMANCE.read_text()
    for name in SCENARIO_NAMES:
        if name not in ran:
            assert f"`{name}` came after the run above" in text, name


def test_the_client_figures_are_the_stated_client_run(client_run: dict[str, Any]) -> None:
    text = PERFORMANCE.read_text()
    expected = _trimmed("\n".join(report.format_client(client_run["scenarios"]["client"])))
    assert _trimmed(_block_after(text, "### The client library")) == expected, (
        "docs/performance.md's client figures are not the client run's; they should read:\n"
        + expected
    )
    meta = client_run["meta"]
    assert meta["only"] == ["client"] and not meta["quick"]
    command = _block_after(text, "The client library's figures come from one run of")
    assert "--only client" in command and "--json docs/client-run.json" in command


def test_every_figure_the_prose_quotes_is_in_the_run_s_tables(run: dict[str, Any]) -> None:
    text = PERFORMANCE.read_text()
    prose = text[text.index("How to read it:") : text.index("With `SBUS_PURE_PYTHON=1`")]
    prose += text[text.index("Per delivery, then:") :]
    tables = report.format_table(run) + "\n" + format_summary(run["profile"], top=10)
    quoted = re.findall(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?) ?(?:x|us|%|B)(?!\w)", prose)
    assert len(quoted) > 10, quoted
    not_figures = {"30"}  # "runs of the same side often differ by 30 %": a caution, no figure
    missing = [
        number
        for number in quoted
        if number not in not_figures
        and not re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d,]|\.\d)", tables)
    ]
    assert missing == [], "figures the run does not show"


def test_the_scenario_table_gives_the_code_s_targets() -> None:
    text = PERFORMANCE.read_text()
    table = text[text.index("## Scenarios and targets") : text.index("## Figures")]
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|.*\| ([^|]*) \|$", table, re.M)
    }
    assert list(rows) == list(SCENARIO_NAMES)
    for name, cell in rows.items():
        bounds = [report.verdict(t, None)["target"] for t in report.TARGETS if t.scenario == name]
        if not bounds:
            assert cell.strip() == "-", name
        for bound in bounds:
            assert bound in cell, f"{name}: {cell!r} lacks {bound!r}"


# --- the README ---------------------------------------------------------------------


def test_the_readme_and_the_performance_page_say_how_to_get_the_reference() -> None:
    for path in (ROOT / "README.md", PERFORMANCE):
        text = path.read_text()
        assert f"git clone {UPSTREAM}" in text and "--reference-src" in text, path


def _recipe(makefile: str, target: str) -> str:
    """The commands of ``target`` in the Makefile."""
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match, f"no target {target} in the Makefile"
    return match.group(1)


def test_contributing_says_which_tests_make_test_and_make_test_slow_run_and_how_long() -> None:
    makefile = (ROOT / "Makefile").read_text()
    chosen = re.search(r"^PYTEST_ARGS \?= (.+)$", makefile, re.MULTILINE)
    assert chosen and "$(PYTEST_ARGS)" in _recipe(makefile, "test")
    assert 'pytest -m "slow and spark"' in _recipe(makefile, "test")
    assert "pytest -m slow" in _recipe(makefile, "test-slow")
    top = (ROOT / "CONTRIBUTING.md").read_text().split("## The first run")[0]
    # what each target selects, in the Makefile's own words
    assert f"pytest {chosen.group(1)}" in top, top
    assert "make test-slow" in top and "pytest -m slow" in top, top
    assert re.search(r"\d+\s+minutes", top), top


def test_every_make_target_the_docs_name_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+):", makefile, re.MULTILINE))
    for path in DOCS:
        for target in re.findall(r"`make ([\w-]+)", path.read_text()):
            assert target in targets, f"{path.name}: make {target} is no target of the Makefile"


def test_the_pipeline_s_window_examples_are_the_code_s() -> None:
    from sbus_relay.pipeline.windows import auto_window

    text = " ".join((ROOT / "docs" / "pipeline.md").read_text().split())
    said = re.search(
        r"([\d.]+) (s|min) for two minutes, ([\d.]+) (s|min) for an hour, "
        r"([\d.]+) (s|min) for a day",
        text,
    )
    assert said, "docs/pipeline.md no longer gives the default window's examples"
    values = said.groups()
    for i, span_s in enumerate((120, 3600, 86400)):
        number, unit = values[2 * i : 2 * i + 2]
        seconds = float(number) * (60 if unit == "min" else 1)
        assert seconds == auto_window(span_s * 10**9), (span_s, number, unit)


# --- every example runs -------------------------------------------------------------

#: The docs' Python examples that are programs (``# example: NAME`` first), and
#: the test file that runs each as written against a real bus.
EXAMPLES_RUN_BY = {
    ("docs/client.md", "asyncio"): "tests/client/test_docs.py",
    ("docs/client.md", "gevent"): "tests/client/test_docs.py",
    ("docs/client.md", "thread"): "tests/client/test_docs.py",
    ("docs/pipeline.md", "datasource"): "tests/pipeline/test_datasource.py",
}
#: The README's one Python example: tests/firstrun/test_first_run.py runs it.
README_EXAMPLE_AFTER = "From Python"


def test_every_python_example_in_the_docs_is_run_by_a_test() -> None:
    unrun = []
    for doc in DOCS:
        text = doc.read_text()
        where = str(doc.relative_to(ROOT))
        for block in re.finditer(r"```python\n(.*?)```", text, re.S):
            first = block.group(1).splitlines()[0]
            named = re.fullmatch(r"# example: (\w+)", first)
            if named is not None and (where, named.group(1)) in EXAMPLES_RUN_BY:
                runner = ROOT / EXAMPLES_RUN_BY[(where, named.group(1))]
                assert "# example: " in runner.read_text() or "examples()" in runner.read_text()
                assert doc.name in runner.read_text(), f"{runner} does not read {where}"
                continue
            before = text[: block.start()]
            if where == "README.md" and before.rstrip().endswith(README_EXAMPLE_AFTER + ":"):
                continue
            line = before.count("\n") + 1
            unrun.append(f"{where}:{line}: {first!r} (no test runs it)")
    assert unrun == []


#: Terms the README uses before it explains them, each with its glossary entry.
GLOSSARY_TERMS = (
    "**sbus.**",
    "**The reference `sbusd`.**",
    "**Master, relay.**",
    "**Identity, `!/cred/`.**",
    "**Flood control.**",
    "**The `up` tree.**",
    "**Socket activation.**",
    "**NATS, the NATS link, a fleet.**",
)


def test_the_glossary_explains_the_readme_s_terms_and_the_readme_points_to_it() -> None:
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    for term in GLOSSARY_TERMS:
        assert f"\n{term}" in glossary, term
    readme = (ROOT / "README.md").read_text()
    # before the first section: a newcomer reads it before any command
    assert "docs/glossary.md" in readme[: readme.index("\n## ")]
