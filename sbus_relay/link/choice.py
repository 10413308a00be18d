"""Which engine the link runs, and making it (``engine`` says what an engine is).

What it owns: the choice between nats.c and nats-py.  What it may touch:
nothing but the environment variable and the import it checks.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from sbus_relay.accel import PURE_PYTHON_ENV, pure_python_requested

from .engine import NATS_C, NATS_C_MODULE, NATS_PY, Engine, EngineSettings


def nats_c_built() -> bool:
    """Whether the nats.c engine was compiled at install time."""
    return importlib.util.find_spec(NATS_C_MODULE) is not None


def choose(wanted: str, say: Callable[[str], None]) -> str:
    """The engine to run for the setting ``wanted`` ("auto" or an engine's
    name); ``say`` is given one line when the choice is not what was asked for
    or falls back."""
    if wanted == NATS_PY:
        return NATS_PY
    if pure_python_requested():
        if wanted == NATS_C:
            say(f"the NATS link runs nats-py: {PURE_PYTHON_ENV} is set")
        return NATS_PY
    if nats_c_built():
        return NATS_C
    say("the NATS link runs nats-py: the nats.c engine was not built (libnats missing at install)")
    return NATS_PY


def make(name: str, settings: EngineSettings) -> Engine:
    """An engine by name (``choose`` says which)."""
    if name == NATS_C:
        from .natsc import NatsCEngine

        return NatsCEngine(settings)
    from .natspy import NatsPyEngine

    return NatsPyEngine(settings)
