"""The hot path compiled, or pure Python (sbus_relay.accel): which one runs, and why.

The decision is made from the environment and the build's record alone; a
build without a compiler leaves the pure path with one line saying so; a
server says in its first log line which path it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from sbus_relay import accel
from tests.support import start_bus

pytestmark = pytest.mark.timeout(120)

ROOT = Path(accel.__file__).resolve().parents[1]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the compiled modules' sources that ``accel`` looks at instead."""
    package = tmp_path / "sbus_relay"
    for name in accel.COMPILED:
        for source in accel.source_files(name):
            target = package / source.relative_to(ROOT / "sbus_relay")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    monkeypatch.setattr(accel, "_ROOT", package)
    monkeypatch.delenv(accel.PURE_PYTHON_ENV, raising=False)
    return package


def record(package: Path, **changes: object) -> None:
    data = {"modules": sorted(accel.COMPILED), "sources": accel.digest(), **changes}
    (package / accel.DIGESTS_FILE).write_text(json.dumps(data))


def test_nothing_compiled_means_pure_python(tree: Path) -> None:
    assert accel._decide() == (
        False,
        "pure Python (the hot path was not compiled at install time)",
    )


def test_a_module_left_out_of_the_build_means_pure_python_for_all(tree: Path) -> None:
    record(tree, modules=sorted(accel.COMPILED)[1:])
    compiled, why = accel._decide()
    assert not compiled and why.startswith("pure Python (not compiled at install time: ")


def test_sources_edited_since_the_build_mean_pure_python_and_a_warning(tree: Path) -> None:
    record(tree)
    source = accel.source_files(next(iter(accel.COMPILED)))[0]
    source.write_text(source.read_text() + "\n# edited\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled, why = accel._decide()
    assert not compiled and "compiled from older sources" in why
    assert [str(w.message) for w in caught] == ["sbus_relay: " + why]


def test_the_environment_asks_for_pure_python(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record(tree)
    monkeypatch.setenv(accel.PURE_PYTHON_ENV, "1")
    assert accel._decide() == (False, f"pure Python ({accel.PURE_PYTHON_ENV} is set)")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler here")
def test_the_install_compiled_the_hot_path_where_a_compiler_is() -> None:
    # make test installs with gcc present: the compiled path must be the one in use
    if accel.pure_python_requested():
        pytest.skip("pure Python asked for")
    assert accel.mode() == "compiled (Cython)"


def test_a_build_without_a_compiler_goes_on_and_says_so_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    env.pop(accel.PURE_PYTHON_ENV, None)
    result = subprocess.run(
        [
            *(sys.executable, "setup.py", "-q", "build_ext"),
            *("--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "temp")),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("sbus_relay:")]
    assert said == [
        "sbus_relay: not compiled (the bus runs the pure-Python path): "
        + ", ".join(sorted(accel.COMPILED))
    ]
    assert not (tmp_path / "lib" / "sbus_relay" / accel.DIGESTS_FILE).exists()


@pytest.mark.parametrize("pure", [False, True], ids=["default", "SBUS_PURE_PYTHON"])
def test_a_server_says_which_path_it_runs(tmp_path: Path, pure: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != accel.PURE_PYTHON_ENV}
    if pure:
        env[accel.PURE_PYTHON_ENV] = "1"
    bus = start_bus(tmp_path, command="serve", env=env)
    try:
        deadline = time.monotonic() + 10
        while '"server.started"' not in bus.stderr_text() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        bus.stop()
    lines = bus.stderr_text().splitlines()
    started = [json.loads(line) for line in lines if '"server.started"' in line]
    # the path a process with the server's environment takes (this one may run pure)
    expected = subprocess.run(
        [sys.executable, "-c", "from sbus_relay import accel; print(accel.mode())"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    if pure:
        assert expected == f"pure Python ({accel.PURE_PYTHON_ENV} is set)"
    assert [e["hot_path"] for e in started] == [expected]


def test_every_pxd_file_is_a_compiled_module_and_back() -> None:
    """The Makefile rebuilds when a .pxd or its .py changes: the two lists agree."""
    pxds = {
        str(p.relative_to(ROOT).with_suffix("")).replace("/", ".")
        for p in ROOT.glob("sbus_relay/*/_c_*.pxd")
    }
    assert pxds == set(accel.COMPILED)
