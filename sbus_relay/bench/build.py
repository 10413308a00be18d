"""Compile the benchmark's C programs with the system gcc, once per source version."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from sbus_relay.ops.cachedir import cache_dir

#: The C sources live in csrc/ beside this module (package data, see pyproject.toml).
SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
#: Programs built from ``<name>.c``.
PROGRAMS = ("loadgen", "natsload")
#: Programs built only where a library is installed (its pkg-config name): the
#: NATS load generator needs libnats, the official C client.
NEEDS = {"natsload": "libnats"}
#: Headers the programs include: part of the cache key, so editing one rebuilds.
HEADERS: tuple[str, ...] = ("common.h",)
CFLAGS = ("-O2", "-Wall", "-Wextra")
#: Seconds one gcc run may take.
COMPILE_TIMEOUT = 120.0


class BuildError(RuntimeError):
    """gcc is missing or a benchmark program failed to compile."""


def default_cache_dir() -> Path:
    """``bench/`` in the package's cache (``~/.cache/sbus-relay/bench`` by default)."""
    return cache_dir() / "bench"


def _digest(cc: str) -> str:
    h = hashlib.sha256(cc.encode())
    h.update(" ".join(CFLAGS).encode())
    for name in (*PROGRAMS, *HEADERS):
        suffix = "" if name.endswith(".h") else ".c"
        h.update((SOURCE_DIR / f"{name}{suffix}").read_bytes())
    return h.hexdigest()[:16]


def _package_flags(package: str) -> list[str] | None:
    """pkg-config's compile and link flags for ``package``; None where it is missing."""
    if shutil.which("pkg-config") is None:
        return None
    proc = subprocess.run(
        ["pkg-config", "--cflags", "--libs", package], capture_output=True, text=True, check=False
    )
    return shlex.split(proc.stdout) if proc.returncode == 0 else None


def build_programs(cache_dir: Path | None = None, cc: str = "gcc") -> dict[str, Path]:
    """Return ``{name: executable}``, compiling into the cache when the sources changed
    (a program whose library is missing, ``NEEDS``, is left out).

    The output directory is named after a hash of the sources and flags, and each
    binary is renamed into place only once complete, so concurrent runs are safe.
    """
    compiler = shutil.which(cc)
    if compiler is None:
        raise BuildError(f"{cc} not found: the benchmark compiles its load generator with it")
    out_dir = (cache_dir or default_cache_dir()) / _digest(compiler)
    out_dir.mkdir(parents=True, exist_ok=True)
    built: dict[str, Path] = {}
    for name in PROGRAMS:
        extra: list[str] = []
        if name in NEEDS:
            found = _package_flags(NEEDS[name])
            if found is None:
                continue
            extra = found
        target = out_dir / name
        if not os.access(target, os.X_OK):
            fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=out_dir)
            os.close(fd)
            cmd = [compiler, *CFLAGS, "-o", tmp, str(SOURCE_DIR / f"{name}.c"), *extra]
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT, check=False
            )
            if proc.returncode != 0:
                Path(tmp).unlink(missing_ok=True)
                raise BuildError(f"compiling {name}.c failed:\n{proc.stderr}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        built[name] = target
    return built
