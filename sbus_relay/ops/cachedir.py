"""The one cache directory of sbus_relay: ``$XDG_CACHE_HOME/sbus-relay``
(``~/.cache/sbus-relay`` by default).

What it owns: where everything the package caches goes (the benchmark's
programs and reference, analyze's class archives) and the move of an older
version's cache into it.  What it may touch: those two directories only.

The move happens on the first look at the cache: each entry of the old
directory is renamed into the new one where that name is free (a rename:
nothing is copied) and the old directory removed once empty.  An entry the
new directory already has is the older of the two copies and is removed: a
cache is rebuilt on demand, and keeping both would leave the old directory
for ever.  Two processes moving at once is harmless: whatever one has moved
the other no longer finds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

#: The cache directory's name, the project's command name.
NAME = "sbus-relay"
#: Where versions before the one cache directory kept the benchmark's builds.
OLD_NAME = "sbus_relay"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/sbus-relay``, or ``~/.cache/sbus-relay`` (not created here)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / NAME
    old = base / OLD_NAME
    if old.is_dir() and not old.is_symlink():
        _move(old, path)
    return path


def _move(old: Path, new: Path) -> None:
    """Move the old cache's entries into ``new``; remove what ``new`` has already."""
    with contextlib.suppress(OSError):
        new.mkdir(parents=True, exist_ok=True)
        for entry in old.iterdir():
            target = new / entry.name
            with contextlib.suppress(FileNotFoundError):
                if target.exists():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                else:
                    entry.rename(target)
        old.rmdir()
