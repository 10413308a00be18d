"""What a config file or query says about a name it does not know: the name
nearest to it, when one is near enough to be the one meant, and every known one.

What it owns: how the nearest known name is found and said.  What it may
touch: nothing (pure functions).

    >>> unknown("max_client", ("address", "max_clients"))
    "unknown key; did you mean 'max_clients'? (known keys: address, max_clients)"
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: How alike (``difflib``'s ratio, 0..1) a known name must be to be suggested:
#: its default, which takes a typo or a missing letter and leaves unrelated words.
SIMILAR_ENOUGH = 0.6


def nearest(name: object, known: Iterable[str]) -> str | None:
    """The known name most like ``name``, if any is alike enough."""
    matches = difflib.get_close_matches(str(name), list(known), n=1, cutoff=SIMILAR_ENOUGH)
    return matches[0] if matches else None


def unknown(name: object, known: Iterable[str], what: str = "key") -> str:
    """The reason for an error about ``name``, which is not one of ``known``."""
    names = list(known)
    hint = nearest(name, names)
    guess = f"; did you mean {hint!r}?" if hint is not None else ""
    return f"unknown {what}{guess} (known {what}s: {', '.join(names)})"
