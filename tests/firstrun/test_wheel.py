"""The wheel: built by ``make dist``, installed where there is no C compiler,
running the compiled path; the sdist there falls back to pure Python.

``make dist`` runs once per set of sources (tests/containers/images.py,
``dist``): an sdist and a wheel with the hot path compiled by Cython and the
C helper, made manylinux by auditwheel.  The wheel goes into a fresh venv in
a container of the tests' Debian base with the compiler and Python's headers
removed (``stripped_image("no-compiler")``), with the dependencies' wheels
downloaded here (no network in the container); there it must run compiled --
every compiled module of the wheel imports, ``accel`` says so, a bus logs
it -- and pass the protocol tests.  The sdist installed beside it says in its
one line that nothing was compiled, and runs pure Python.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.containers import images
from tests.containers.podman import PODMAN, usable_image

#: The first run builds the wheel (a minute or two) and downloads the test
#: packages; then the protocol tests in the container.
pytestmark = pytest.mark.timeout(1500)

ROOT = Path(__file__).resolve().parents[2]
#: The protocol tests run against the installed wheel: the packets, routing,
#: secret keys, flood control and packed batches, through real server processes,
#: and the C helper's own tests.
PROTOCOL_TESTS = (
    "tests/server/test_protocol.py",
    "tests/server/test_routing.py",
    "tests/server/test_secret.py",
    "tests/server/test_flood.py",
    "tests/server/test_batches.py",
    "tests/server/test_batchio.py",
)
#: Seconds the whole run in the container may take.
IN_CONTAINER = 1200
#: The line setup.py prints where it compiled nothing (its one-line notice).
NOT_COMPILED = "sbus_relay: not compiled (the bus runs the pure-Python path): "
#: Imports the modules named before ``--``, then checks that each library named
#: after it was mapped from the installed wheel's ``sbus_relay.libs``.
IMPORT_ALL = """
import importlib, sys
cut = sys.argv.index("--")
for name in sys.argv[1:cut]:
    importlib.import_module(name)
maps = open("/proc/self/maps").read()
for library in sys.argv[cut + 1:]:
    assert "/sbus_relay.libs/" + library in maps, library + " is not the wheel's own"
print("IMPORTED", cut - 1)
"""
#: What a Python extension module's file name ends with, here.
EXTENSION = re.compile(r"^(sbus_relay/.+)\.cpython-\d+-[\w-]+\.so$")


@pytest.fixture(scope="module")
def image() -> str:
    return usable_image(
        lambda podman: images.stripped_image(podman, "no-compiler"),
        "the wheel NOT checked without a compiler",
    )


@pytest.fixture(scope="module")
def dist() -> Path:
    return images.dist()


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("sbus_relay-*.whl")
    return wheel


def test_make_dist_builds_an_sdist_and_a_compiled_manylinux_wheel(dist: Path) -> None:
    wheel = wheel_of(dist)
    (sdist,) = dist.glob("sbus_relay-*.tar.gz")
    assert re.search(r"-cp3\d+-cp3\d+-[\w.]*manylinux_\d+_\d+_x86_64", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    modules = {m.group(1).replace("/", ".") for n in names if (m := EXTENSION.match(n))}
    from sbus_relay import accel

    assert set(accel.COMPILED) | {"sbus_relay.bus._batchio"} <= modules
    assert "sbus_relay/_compiled.json" in names
    # a library an extension links outside the manylinux policy (libnats, for a
    # compiled NATS module built where it is found) is bundled beside the package
    for name in bundled_libraries(wheel):
        assert re.fullmatch(r"lib[\w+.-]+-[0-9a-f]{8}\.so[\d.]*", name), name
    auditwheel = shutil.which("auditwheel", path=str(Path(sys.executable).parent))
    assert auditwheel is not None, "auditwheel is missing: make .venv/.installed-dev"
    shown = subprocess.run(
        [auditwheel, "show", str(wheel)], capture_output=True, text=True, timeout=120, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "consistent with the following platform tag" in " ".join(shown.stdout.split())
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read("sbus_relay/_compiled.json").decode()
    assert all(name in record for name in accel.COMPILED)
    assert sdist.stat().st_size > 0


def bundled_libraries(wheel: Path) -> list[str]:
    """The shared libraries auditwheel copied into the wheel (sbus_relay.libs/)."""
    with zipfile.ZipFile(wheel) as archive:
        return [
            Path(n).name
            for n in archive.namelist()
            if n.startswith("sbus_relay.libs/") and not n.endswith("/")  # (its directory's entry)
        ]


def test_the_wheel_runs_compiled_and_passes_the_protocol_tests_without_a_compiler(
    image: str, dist: Path, tmp_path: Path
) -> None:
    assert PODMAN is not None
    check = tmp_path / "check"  # the tests, and pytest's settings; not the package
    shutil.copytree(ROOT / "tests", check / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", check / "pyproject.toml")
    wheel = wheel_of(dist)
    (sdist,) = dist.glob("sbus_relay-*.tar.gz")
    extensions = _extension_modules(wheel)
    script = "\n".join([
        "set -e",
        "export PYTHONDONTWRITEBYTECODE=1 PIP_NO_INDEX=1 PIP_FIND_LINKS='/wheels /test-wheels'",
        "export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1",
        f"for c in {' '.join(images.COMPILERS)}; do",
        '  if command -v "$c"; then echo "a compiler is here: $c"; exit 3; fi',
        "done",
        "python3 -m venv /tmp/wheel",
        f"/tmp/wheel/bin/pip install -q /dist/{wheel.name} {shlex.join(images.TEST_REQUIREMENTS)}",
        "/tmp/wheel/bin/python -c 'import sbus_relay.accel as a; print(\"MODE\", a.mode())'",
        # every compiled module imports; a library bundled in the wheel is loaded
        # from the wheel, never from this system
        f"/tmp/wheel/bin/python -c {shlex.quote(IMPORT_ALL)}"
        f" {shlex.join(sorted(extensions))} -- {shlex.join(bundled_libraries(wheel))}",
        # a bus says which path it runs in its server.started line
        "/tmp/wheel/bin/sbus-relay serve -f -c -a /tmp/bus.sock --log-format json 2>/tmp/bus.log &",
        "for i in $(seq 100); do [ -S /tmp/bus.sock ] && break; sleep 0.1; done",
        "/tmp/wheel/bin/sbus-relay pub -a /tmp/bus.sock -n wheel/check",
        "wait",
        "grep -o '\"hot_path\": \"[^\"]*\"' /tmp/bus.log | sed 's/^/BUS /'",
        "cd /check",
        f"/tmp/wheel/bin/python -m pytest -q -p no:cacheprovider {' '.join(PROTOCOL_TESTS)}",
        # the sdist, where nothing can be compiled: its one line, and pure Python
        "python3 -m venv /tmp/sdist",
        f"/tmp/sdist/bin/pip install -v /dist/{sdist.name} > /tmp/sdist.log 2>&1"
        " || { tail -50 /tmp/sdist.log; exit 4; }",
        "grep -F 'sbus_relay: ' /tmp/sdist.log | sed 's/^ *//; s/^/SDIST /'",
        "/tmp/sdist/bin/python -c 'import sbus_relay.accel as a; print(\"SDIST-MODE\", a.mode())'",
    ])  # fmt: skip
    mounts = {
        dist: "/dist",
        images.wheels(): "/wheels",
        images.testing_wheels(): "/test-wheels",
        check: "/check",
    }
    # as root, as the suite runs here (the downloaded wheels are root's alone)
    argv = [PODMAN, "run", "--rm", "--network=none", "-e", "HOME=/tmp"]
    for source, target in mounts.items():
        argv += ["-v", f"{source}:{target}:ro"]
    done = subprocess.run(
        [*argv, image, "bash", "-c", script],
        capture_output=True, text=True, timeout=IN_CONTAINER, check=False,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, f"{shlex.join(argv[:3])} ...: {out[-4000:]}{done.stderr[-3000:]}"
    said = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(
        ("MODE ", "IMPORTED ", "BUS ", "SDIST-MODE ")
    ))  # fmt: skip
    assert said["MODE"] == "compiled (Cython)", out
    assert said["IMPORTED"] == str(len(extensions)), out
    assert said["BUS"] == '"hot_path": "compiled (Cython)"', out
    assert re.search(r"\d+ passed", out) and " failed" not in out, out[-3000:]
    notices = [line for line in out.splitlines() if line.startswith("SDIST sbus_relay: ")]
    assert [n.removeprefix("SDIST ") for n in notices if NOT_COMPILED in n], out
    assert said["SDIST-MODE"] == "pure Python (the hot path was not compiled at install time)"


def _extension_modules(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {
            m.group(1).replace("/", ".") for n in archive.namelist() if (m := EXTENSION.match(n))
        }
