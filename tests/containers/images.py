"""The images the container tests run: a Debian base made on this machine and
the project's image built on it from ``configs/deploy/Dockerfile``.

No image registry is needed.  The base comes from ``debootstrap`` (Debian's
package mirror) imported into podman; the image is built with the
Dockerfile's own build arguments for a build without a package index: the
wheels of the dependencies are downloaded here, with this venv's pip, and
mounted into the build (``PIP_INSTALL_OPTIONS``); the Spark extra and the
Java runtime are left out (``EXTRAS=``, ``JRE=``), so that a build takes a
minute or two, not ten.

Both are reused while their inputs are the same: each is tagged with a digest
of what it was made from (the base: suite, mirror, packages; the image: the
base, the build arguments and every file of the build context), and an older
tag of the same name is removed when a new one is made.  The wheels are kept
under ``CACHE`` for the same reason.
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
#: What the Dockerfile needs of a base: Python with venv, and (the build stage)
#: a C compiler and Python's headers for the hot path, libnats (the C NATS
#: client) and pkg-config for the NATS link's nats.c engine.
BASE_PACKAGES = (
    "python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "libnats-dev", "pkg-config",
)  # fmt: skip
BASE_NAME = "localhost/sbus-relay-test-base"
IMAGE_NAME = "localhost/sbus-relay-test"
#: Kept between runs: the dependencies' wheels, one directory per set.
CACHE = Path("/var/cache/sbus-relay-tests")
#: The most a debootstrap, a wheel download or an image build may take.
BUILD_TIMEOUT = 1200
#: The build context: what the Dockerfile's COPY lines name.
CONTEXT_FILES = (
    "pyproject.toml", "setup.py", "README.md", "configs/master.yaml", "configs/relay.yaml",
)  # fmt: skip
#: Left out of the copied package: what an install here built beside the sources.
BUILT_HERE = ("__pycache__", "*.so", "*.c", "_compiled.json", "*.egg-info")
#: Kept: the helper's C source is a source, not a build product.
C_SOURCES = ("_batchio.c",)


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


def _requirements() -> list[str]:
    """The package's dependencies and its build's requirements (pyproject.toml)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [*project["build-system"]["requires"], *project["project"]["dependencies"]]


def wheels() -> Path:
    """A directory with the wheels of every requirement, downloaded once per set."""
    wanted = _requirements()
    key = _digest(" ".join(wanted).encode(), BASE_PYTHON.encode())
    target = CACHE / f"wheels-{key}"
    if target.is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="wheels-", dir=CACHE))
    try:
        # pip wheel, not download: a requirement with no wheel on the index (nkeys
        # is an sdist) is built here; this interpreter is the image's version
        assert f"{sys.version_info[0]}.{sys.version_info[1]}" == BASE_PYTHON, BASE_PYTHON
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(partial),
              *wanted], "pip wheel")  # fmt: skip
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    for old in CACHE.glob("wheels-*"):
        if old != target and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return target


def _ignore(directory: str, names: list[str]) -> set[str]:
    import fnmatch

    dropped = {n for pattern in BUILT_HERE for n in fnmatch.filter(names, pattern)}
    return dropped - set(C_SOURCES)


def _context(target: Path) -> None:
    """The Dockerfile's build context: what it copies, as this checkout has it."""
    for name in CONTEXT_FILES:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)
    shutil.copytree(REPO / "sbus_relay", target / "sbus_relay", ignore=_ignore)
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
