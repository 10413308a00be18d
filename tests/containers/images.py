"""The images the container tests run: a Debian base made on this machine and
the project's image built on it from ``configs/deploy/Dockerfile``.

No image registry is needed.  The base comes from ``debootstrap`` (Debian's
package mirror) imported into podman; the image is built from the wheel
``make dist`` makes of this checkout's sources, with the Dockerfile's own
build arguments for a build without a package index: the wheels of the
dependencies are downloaded here, with this venv's pip, and mounted into the
build (``PIP_INSTALL_OPTIONS``); the Spark extra and the Java runtime are
left out (``EXTRAS=``, ``JRE=``), so that a build takes a minute or two, not
ten.

Both are reused while their inputs are the same: each is tagged with a digest
of what it was made from (the base: suite, mirror, packages; the image: the
base, the build arguments and every file of the build context), and an older
tag of the same name is removed when a new one is made.  The wheels are kept
under ``CACHE`` for the same reason.

Two more images are the base with packages removed (``stripped_image``): a
fresh Debian 12 as a new user has it, before the README's line of packages,
and one with Python but no C compiler, where the project's wheel must run
compiled.  The project's own sdist and wheel (``make dist``, ``dist``) are
built once per set of sources and kept under ``CACHE`` too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "configs" / "deploy" / "Dockerfile"
#: The Debian release and mirror of the base; its Python is the build's and the image's.
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: That release's Python: the wheels downloaded here are for it, whatever runs the tests.
BASE_PYTHON = "3.11"
#: What the tests need of a base: Python with venv; a C compiler, Python's
#: headers, libnats (the C NATS client) and pkg-config for the builds made in it
#: (the hot path, the NATS link's nats.c engine; the stripped images remove them).
BASE_PACKAGES = (
    "python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "libnats-dev", "pkg-config",
)  # fmt: skip
BASE_NAME = "localhost/sbus-relay-test-base"
IMAGE_NAME = "localhost/sbus-relay-test"
#: Kept between runs: the dependencies' wheels, one directory per set.
CACHE = Path("/var/cache/sbus-relay-tests")
#: The most a debootstrap, a wheel download or an image build may take.
BUILD_TIMEOUT = 1200
#: The build context: what the Dockerfile's COPY lines name, beside the
#: wheel of ``dist()`` in dist/.
CONTEXT_FILES = ("configs/master.yaml", "configs/relay.yaml")
#: Left out of the copied package: what an install here built beside the sources.
#: (Cython writes its C files under build/, never beside the sources: every
#: .c there is a source, the helper's and the load generator's.)
BUILT_HERE = ("__pycache__", "*.so", "_compiled.json", "*.egg-info")
#: What ``make dist`` builds from: the package and the files that say how.
DIST_FILES = ("pyproject.toml", "setup.py", "README.md", "Makefile")
#: The base with every package removed that a minimal Debian 12 (debootstrap's
#: minbase: priority "required", and apt) lacks, but these:
STRIPPED = {
    # a fresh machine: no Python, venv, compiler, make or git
    "fresh": (),
    # Python and its venv, but no C compiler and no Python headers
    "no-compiler": ("python3", "python3-venv"),
}
#: Commands that would compile a C extension; none may be left by ``stripped_image``.
COMPILERS = ("cc", "gcc", "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-gcc-12", "c99")
#: Packages of the tests run against the installed wheel (tests/firstrun/test_wheel.py).
TEST_REQUIREMENTS = ("pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:16]


def _run(argv: list[str], what: str, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(
        argv,
        capture_output=True,
        timeout=BUILD_TIMEOUT,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).decode(errors="replace")[-3000:]
        raise AssertionError(f"{what} failed ({result.returncode}): {' '.join(argv)}\n{tail}")
    return result


def image_exists(podman: str, name: str) -> bool:
    found = subprocess.run([podman, "image", "exists", name], timeout=60, check=False)
    return found.returncode == 0


def _dangling(podman: str) -> set[str]:
    """The ids of the untagged images."""
    listed = subprocess.run(
        [podman, "images", "-q", "--no-trunc", "--filter", "dangling=true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return set(listed.stdout.split())


def _drop_other_tags(podman: str, repo: str, keep: str) -> None:
    """Remove the images of ``repo`` but ``keep`` (older inputs' images); one
    that a container still uses (another checkout's run) stays."""
    listed = subprocess.run(
        [podman, "images", "--format", "{{.Repository}}:{{.Tag}}", repo],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    for name in listed.stdout.split():
        if name != keep:
            subprocess.run([podman, "rmi", name], capture_output=True, timeout=120, check=False)


def base_image(podman: str) -> str:
    """The Debian base, made with debootstrap and imported, unless it exists."""
    tag = _digest(SUITE.encode(), MIRROR.encode(), " ".join(BASE_PACKAGES).encode(), b"minbase")
    name = f"{BASE_NAME}:{tag}"
    if image_exists(podman, name):
        return name
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise AssertionError("debootstrap is missing: .ci/system-deps.sh installs it")
    work = Path(tempfile.mkdtemp(prefix="sbus-base-", dir="/var/tmp"))
    try:
        root = work / "root"
        _run(
            [debootstrap, "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES),
             SUITE, str(root), MIRROR],
            "debootstrap",
        )  # fmt: skip
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
        (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            _run([podman, "import", "--change", 'CMD ["/bin/bash"]', "-", name],
                 "podman import", stdin=tar.stdout)  # fmt: skip
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _drop_other_tags(podman, BASE_NAME, name)
    return name


def stripped_image(podman: str, kind: str) -> str:
    """The base with the packages of ``STRIPPED[kind]`` only (beyond a minimal
    Debian's), unless it exists: every package is marked as installed
    automatically, the required ones, apt and those kept as asked for, and apt
    removes the rest."""
    base = base_image(podman)
    keep = STRIPPED[kind]
    name = f"{BASE_NAME}-{kind}:{_digest(base.encode(), ' '.join(keep).encode())}"
    if image_exists(podman, name):
        return name
    required = "dpkg-query -W -f '${Package} ${Priority}\\n' | awk '$2 == \"required\" {print $1}'"
    script = "\n".join([
        "set -e",
        "export DEBIAN_FRONTEND=noninteractive",
        "apt-mark auto $(dpkg-query -W -f '${Package}\\n') >/dev/null",
        f"apt-mark manual apt $({required}) {' '.join(keep)} >/dev/null",
        "apt-get autoremove --purge -y -q >/dev/null",
        *[f"! command -v {c}" for c in COMPILERS],
    ])  # fmt: skip
    work = f"sbus-strip-{kind}-{os.getpid()}"
    try:
        _run([podman, "run", "--name", work, "--network=none", base, "bash", "-c", script],
             f"removing packages from the base ({kind})")  # fmt: skip
        _run([podman, "commit", "-q", work, name], "podman commit")
    finally:
        subprocess.run([podman, "rm", "-f", work], capture_output=True, timeout=120, check=False)
    _drop_other_tags(podman, f"{BASE_NAME}-{kind}", name)
    return name


def _copy_sources(target: Path, names: tuple[str, ...]) -> None:
    """``names`` and the package, as this checkout has them, without what an
    install here built beside the sources."""
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)
    shutil.copytree(REPO / "sbus_relay", target / "sbus_relay", ignore=_ignore)


def dist() -> Path:
    """A directory with ``make dist``'s sdist and wheel of this checkout's
    sources (the working tree as it is), built once per set of sources with
    this test run's venv (``make`` sees its install as current)."""
    venv = Path(sys.executable).parent.parent
    if not (venv / ".installed-dev").exists():
        raise AssertionError(f"{venv} is no dev install by make: make .venv/.installed-dev")
    work = Path(tempfile.mkdtemp(prefix="sbus-dist-", dir="/var/tmp"))
    try:
        _copy_sources(work, DIST_FILES)
        target = CACHE / f"dist-{_context_digest(work).decode()}"
        if target.is_dir():
            return target
        (work / ".venv").symlink_to(venv)
        for path in work.rglob("*"):  # older than the venv's stamps: nothing is reinstalled
            if not path.is_symlink():
                os.utime(path, (0, 0))
        _run(["make", "dist"], "make dist", cwd=work)
        CACHE.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target.with_name(target.name + ".partial"), ignore_errors=True)
        shutil.copytree(work / "dist", target.with_name(target.name + ".partial"))
        target.with_name(target.name + ".partial").rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in CACHE.glob("dist-*"):
        if old != target and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return target


def testing_wheels() -> Path:
    """A directory with the wheels of the tests run against an installed wheel."""
    return _downloaded("test-wheels", list(TEST_REQUIREMENTS))


def _requirements() -> list[str]:
    """The package's dependencies and its build's requirements (pyproject.toml)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [*project["build-system"]["requires"], *project["project"]["dependencies"]]


def wheels() -> Path:
    """A directory with the wheels of every requirement, downloaded once per set."""
    return _downloaded("wheels", _requirements())


def _downloaded(kind: str, wanted: list[str]) -> Path:
    key = _digest(" ".join(wanted).encode(), BASE_PYTHON.encode())
    target = CACHE / f"{kind}-{key}"
    if target.is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=CACHE))
    try:
        # pip wheel, not download: a requirement with no wheel on the index (nkeys
        # is an sdist) is built here; this interpreter is the image's version
        assert f"{sys.version_info[0]}.{sys.version_info[1]}" == BASE_PYTHON, BASE_PYTHON
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(partial),
              *wanted], "pip wheel")  # fmt: skip
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    for old in CACHE.glob(f"{kind}-*"):
        if old != target and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return target


def _ignore(directory: str, names: list[str]) -> set[str]:
    import fnmatch

    return {n for pattern in BUILT_HERE for n in fnmatch.filter(names, pattern)}


def _context(target: Path) -> None:
    """The Dockerfile's build context: the configs it copies, as this checkout
    has them, and the wheel ``make dist`` built of its sources."""
    for name in CONTEXT_FILES:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)
    (target / "dist").mkdir()
    for wheel in dist().glob("*.whl"):
        shutil.copy2(wheel, target / "dist" / wheel.name)
    (target / "Dockerfile").write_bytes(DOCKERFILE.read_bytes())


def _context_digest(root: Path) -> bytes:
    parts = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        parts.append(str(path.relative_to(root)).encode())
        parts.append(path.read_bytes())
    return _digest(*parts).encode()


def project_image(podman: str) -> str:
    """The project's image on ``base_image``, built unless one from the same inputs exists."""
    base = base_image(podman)
    wheel_dir = wheels()
    work = Path(tempfile.mkdtemp(prefix="sbus-image-", dir="/var/tmp"))
    try:
        _context(work)
        args = {
            "BASE": base,
            "EXTRAS": "",
            "JRE": "",
            "PIP_INSTALL_OPTIONS": "--no-index --find-links /wheels",
        }
        tag = _digest(_context_digest(work), repr(sorted(args.items())).encode(),
                      " ".join(sorted(os.listdir(wheel_dir))).encode())  # fmt: skip
        name = f"{IMAGE_NAME}:{tag}"
        if image_exists(podman, name):
            return name
        argv = [podman, "build", "--pull=never", "-f", str(work / "Dockerfile"), "-t", name,
                "-v", f"{wheel_dir}:/wheels:ro"]  # fmt: skip
        for key, value in args.items():
            argv += ["--build-arg", f"{key}={value}"]
        before = _dangling(podman)
        _run([*argv, str(work)], "podman build")
        # the build stage's image, left untagged: ours to remove
        for left in _dangling(podman) - before:
            subprocess.run([podman, "rmi", left], capture_output=True, timeout=120, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _drop_other_tags(podman, IMAGE_NAME, name)
    return name
