"""The reference C ``sbusd``, measured live beside ours: found, built, or left out.

What it owns: finding or building the reference sbusd.  What it may touch: its
source tree (read only), gcc, the cache directory.

The reference is the daemon of the sbus project (``UPSTREAM``): a clone of it
is all the benchmark needs.  ``--reference PATH`` names a built binary;
``--reference-src DIR`` (or ``$SBUS_REFERENCE_SRC``) names a source tree, such
as that clone; otherwise a source tree is looked for beside the checkout or one
level below any of its ancestors, under the name a clone gets (``sbus``) or
``reference-sbus``, if it is this user's or root's and not in a directory
everyone may write to.  The sources are compiled once with gcc into the bench
cache, keyed by a hash of the sources; the build writes nothing into the
source directory.  When there is no reference, ``Reference.path`` is None and
``reason`` says in one line why, and where to get it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .build import COMPILE_TIMEOUT, BuildError, default_cache_dir

#: Where the reference comes from: the sbus project's repository (also mirrored,
#: read-only, at https://github.com/maandree/sbus).
UPSTREAM = "https://codeberg.org/maandree/sbus"
#: Environment variable naming the directory of the reference sources.
SOURCE_ENV = "SBUS_REFERENCE_SRC"
#: Names of a directory holding the reference sources, looked for near the
#: checkout: what ``git clone UPSTREAM`` creates, and a copy's usual name.
SOURCE_DIR_NAMES = ("sbus", "reference-sbus")
#: How to get the reference, as every "not found" message says it.
HOW_TO_GET = (
    f"it is the sbusd of the sbus project: `git clone {UPSTREAM}`, then pass"
    f" --reference-src DIR (the clone) or set ${SOURCE_ENV}=DIR, or pass --reference PATH"
    " to a built sbusd"
)
#: The daemon's translation units (its Makefile links sbusd.o with libsbusd.a).
SOURCES = ("sbusd.c", "libsbusd.c")
#: The reference's own config.mk flags, so the binary is the one its Makefile makes.
CFLAGS = (
    "-std=c99",
    "-O2",
    "-D_DEFAULT_SOURCE",
    "-D_BSD_SOURCE",
    "-D_XOPEN_SOURCE=700",
    "-D_GNU_SOURCE",
)
#: Ancestors of the checkout searched for the sources (beside them and one level down).
SEARCH_DEPTH = 4


@dataclass(frozen=True)
class Reference:
    """The reference binary to measure, or why there is none."""

    path: Path | None
    reason: str = ""
    source: str = ""


def _checkout_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _has_sources(directory: Path) -> bool:
    return all((directory / name).is_file() for name in SOURCES)


def _trusted(directory: Path) -> bool:
    """Whether a found tree is one to compile and run unasked: owned by this
    user or root, in a directory nobody else may create it in (``/tmp/sbus``
    may be anyone's: it is taken only when named)."""
    try:
        owner = directory.stat().st_uid
        parent_mode = directory.parent.stat().st_mode
    except OSError:
        return False
    return owner in (0, os.geteuid()) and not parent_mode & stat.S_IWOTH


def find_sources(start: Path | None = None, given: Path | None = None) -> tuple[Path | None, str]:
    """The reference source directory, or None and the reason it was not found.

    ``given`` (``--reference-src``) first, then ``$SBUS_REFERENCE_SRC``, then
    the checkout's surroundings (from ``start``, default the checkout itself).
    """
    if given is not None:
        if _has_sources(given):
            return given, ""
        return None, f"--reference-src {given} has no {' and '.join(SOURCES)}; {HOW_TO_GET}"
    named = os.environ.get(SOURCE_ENV)
    if named:
        if _has_sources(Path(named)):
            return Path(named), ""
        return None, f"${SOURCE_ENV}={named} has no {' and '.join(SOURCES)}; {HOW_TO_GET}"
    root = (start or _checkout_root()).resolve()
    for ancestor in [root, *root.parents][:SEARCH_DEPTH]:
        for name in SOURCE_DIR_NAMES:
            for candidate in (ancestor / name, *sorted(ancestor.glob(f"*/{name}"))):
                if _has_sources(candidate) and _trusted(candidate):
                    return candidate, ""
    return None, f"no reference sources (sbusd.c) beside the checkout; {HOW_TO_GET}"


def _digest(compiler: str, source: Path) -> str:
    h = hashlib.sha256(compiler.encode())
    h.update(" ".join(CFLAGS).encode())
    for path in sorted([*source.glob("*.c"), *source.glob("*.h")]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build_reference(source: Path, cache_dir: Path | None = None, cc: str = "gcc") -> Path:
    """Compile the reference ``sbusd`` from ``source`` into the cache; return its path."""
    compiler = shutil.which(cc)
    if compiler is None:
        raise BuildError(f"{cc} not found: it is needed to build the reference sbusd")
    out_dir = (cache_dir or default_cache_dir()) / f"reference-{_digest(compiler, source)}"
    target = out_dir / "sbusd"
    if os.access(target, os.X_OK):
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sbusd-", dir=out_dir)
    os.close(fd)
    cmd = [compiler, *CFLAGS, "-I", str(source), "-o", tmp, *(str(source / s) for s in SOURCES)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT, check=False)
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise BuildError(f"compiling the reference sbusd failed:\n{proc.stderr}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def resolve_reference(
    binary: Path | None,
    disabled: bool,
    cache_dir: Path | None = None,
    source_dir: Path | None = None,
) -> Reference:
    """What to compare with: ``--reference``, else a build from the sources
    (``--reference-src``, else found), else nothing.  A binary or source tree
    named on the command line that is not one is a ``BuildError``."""
    if disabled:
        return Reference(None, "--no-reference given")
    if binary is not None:
        if not os.access(binary, os.X_OK) or binary.is_dir():
            raise BuildError(f"--reference {binary}: not an executable file")
        return Reference(binary.resolve(), source=str(binary))
    source, reason = find_sources(given=source_dir)
    if source is None:
        if source_dir is not None:
            raise BuildError(reason)
        return Reference(None, reason)
    try:
        return Reference(build_reference(source, cache_dir), source=str(source))
    except (BuildError, OSError, subprocess.SubprocessError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        why = f"building the reference from {source} failed: {first}"
        if source_dir is not None:
            raise BuildError(why) from None
        return Reference(None, why)
