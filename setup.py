"""The compiled parts of sbus_relay; everything else is in pyproject.toml.

* ``sbus_relay.bus._batchio`` (C): many packets per system call.
* ``sbus_relay.link._natsc`` (Cython over libnats, the official NATS C
  client): the NATS link's nats.c engine, built only where ``pkg-config``
  finds libnats (``libnats-dev``); elsewhere the link runs nats-py.
* The hot path's Python modules, compiled by Cython each into a module of its
  own beside its source (``sbus_relay/accel.py`` lists them and explains).

Both are optional.  Without a C compiler, or without Cython, the install goes
on and the bus runs its pure-Python path.  What was compiled, and from which
sources, is recorded in ``sbus_relay/_compiled.json``, so that a checkout
edited since is never run with stale compiled code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
#: Cython's settings: the .pxd files say the C types, the annotations are for mypy.
DIRECTIVES = {
    "language_level": "3",
    "annotation_typing": False,
    "always_allow_keywords": False,
    "nonecheck": False,
    # the pure-Python branch of ``if cython.compiled:`` is unreachable, by design
    "warn.unreachable": False,
}


def _accel():  # type: ignore[no-untyped-def]
    """sbus_relay/accel.py, loaded alone (the package itself is not imported)."""
    spec = importlib.util.spec_from_file_location("_sbus_accel", ROOT / "sbus_relay" / "accel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


accel = _accel()


def _compiled_extensions() -> list[Extension]:
    """The hot path's modules for Cython, or none (one line says why)."""
    if os.environ.get(accel.PURE_PYTHON_ENV, "") not in ("", "0"):
        print(f"sbus_relay: {accel.PURE_PYTHON_ENV} is set: not compiling the hot path")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("sbus_relay: Cython is not installed: the hot path stays pure Python")
        return []
    extensions = []
    for name in accel.COMPILED:
        source, pxd = accel.source_files(name)
        extensions.append(
            Extension(
                name,
                [str(source.relative_to(ROOT))],
                depends=[str(pxd.relative_to(ROOT))],
                optional=True,
            )
        )
    # force: a module's C layout depends on every .pxd it cimports, so all
    # are regenerated together, never some against older declarations
    compiled = cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        build_dir="build/cython",
        quiet=True,
        force=True,
    )
    for ext in compiled:
        ext.optional = True  # cythonize makes new Extensions: without a compiler, go on
    return list(compiled)


def _libnats() -> dict[str, list[str]] | None:
    """pkg-config's flags for libnats, or None where it is not installed."""
    if shutil.which("pkg-config") is None:
        return None
    try:
        cflags = subprocess.run(
            ["pkg-config", "--cflags", "libnats"], capture_output=True, text=True, check=True
        ).stdout.split()
        libs = subprocess.run(
            ["pkg-config", "--libs", "libnats"], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {
        "include_dirs": [f[2:] for f in cflags if f.startswith("-I")],
        "library_dirs": [f[2:] for f in libs if f.startswith("-L")],
        "libraries": [f[2:] for f in libs if f.startswith("-l")],
    }


def _nats_c_extension() -> list[Extension]:
    """The link's nats.c engine, where libnats and Cython are (one line says why not)."""
    if os.environ.get(accel.PURE_PYTHON_ENV, "") not in ("", "0"):
        return []
    flags = _libnats()
    if flags is None:
        print("sbus_relay: libnats not found (pkg-config libnats): the NATS link runs nats-py")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    # natsc_private.h beside the .pyx: the one place it reaches into libnats's private parts
    flags["include_dirs"] = [*flags["include_dirs"], "sbus_relay/link"]
    ext = Extension(
        "sbus_relay.link._natsc",
        ["sbus_relay/link/_natsc.pyx"],
        depends=["sbus_relay/link/natsc_private.h"],
        optional=True,
        **flags,
    )
    built = cythonize(
        [ext], compiler_directives={"language_level": "3"}, build_dir="build/cython", quiet=True
    )
    for e in built:
        e.optional = True
    return list(built)


class BuildExt(build_ext):
    """Builds what it can, each core compiling a module at a time (unless ``-j``
    says how many), then records the sources of what was compiled."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        super().run()
        built = [
            ext.name
            for ext in self.extensions
            if ext.name in accel.COMPILED and os.path.exists(self.get_ext_fullpath(ext.name))
        ]
        target = Path(self.get_ext_fullpath("sbus_relay._compiled")).parent
        record = target / accel.DIGESTS_FILE
        if built:
            target.mkdir(parents=True, exist_ok=True)
            data = {"modules": sorted(built), "sources": accel.digest()}
            record.write_text(json.dumps(data, indent=1) + "\n")
        elif record.exists():
            record.unlink()
        missing = sorted(set(accel.COMPILED) - set(built))
        if missing:
            print(
                "sbus_relay: not compiled (the bus runs the pure-Python path): "
                + ", ".join(missing),
                file=sys.stderr,
            )


setup(
    ext_modules=[
        Extension(
            "sbus_relay.bus._batchio", ["sbus_relay/bus/_batchio.c"], optional=True
        ),
        *_compiled_extensions(),
        *_nats_c_extension(),
    ],
    cmdclass={"build_ext": BuildExt},
)
