"""The full-length hardening runs (docs/reliability.md): ``pytest -m slow tests/hardening``.

The same functions as ``test_runs.py`` with the parameters the figures in
docs/reliability.md were measured with; each fails on any broken promise.
"""

from __future__ import annotations

from typing import Any

import pytest

from .harness import chaos, faults, fleetchaos, fuzz, load, soak
from .harness.__main__ import _failures
from .harness.fabric import fabric_problem
from .harness.fleet import nats_binary
from .harness.secret import run_secret

pytestmark = pytest.mark.slow


def _held(figures: dict[str, Any]) -> None:
    assert _failures(figures) == []


@pytest.mark.timeout(900)
def test_full_live_fuzz_and_secret_rounds() -> None:
    _held(
        {
            "live_fuzz": fuzz.run_fuzz(inputs=400_000, fuzzers=8, good_messages=5000, seed=7),
            "secret_rounds": run_secret(rounds=300, seed=7),
        }
    )


@pytest.mark.timeout(900)
def test_full_fault_runs() -> None:
    _held(faults.run_faults(quick=False))


@pytest.mark.timeout(600)
def test_full_load() -> None:
    _held({"load": load.run_load(clients=1000, shared=200)})


@pytest.mark.timeout(600)
def test_full_soak() -> None:
    _held({"soak": soak.run_soak(duration=120.0)})


@pytest.mark.timeout(2400)
def test_full_chaos() -> None:
    _held({"chaos": chaos.run_chaos(duration=1800.0, seed=7)})


@pytest.mark.timeout(2400)
def test_full_fleet_chaos() -> None:
    problem = fabric_problem() or (None if nats_binary() else "no nats-server installed")
    if problem is not None:
        pytest.skip(f"FLEET NAMESPACES SKIPPED: {problem}")
    _held({"fleetchaos": fleetchaos.run_fleetchaos(duration=1800.0, seed=7)})
