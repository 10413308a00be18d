"""Property: no client ever receives a ``!/cred/`` message addressed to another identity.

One master and one relay run for the whole module; each hypothesis example is a
real round (``hardening.secret.run_round``): forked clients with their own pids
subscribe random patterns on either server, the test publishes secret keys to
every identity (and to near misses) from both servers, and checks every
delivery.  It also checks that each client got each of its own messages once,
so a server that delivered nothing would fail too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hardening.harness.secret import (
    RESTS,
    SAFE,
    SERVERS,
    TARGETS,
    WILD,
    ChildPlan,
    Hierarchy,
    Plan,
    Publish,
    run_round,
)

pytestmark = pytest.mark.timeout(120)

child_plans = st.builds(
    ChildPlan,
    st.sampled_from(SERVERS),
    st.lists(st.sampled_from(SAFE), max_size=4),
    st.lists(st.sampled_from(WILD), max_size=4),
)
publishes = st.builds(
    Publish,
    st.sampled_from(SERVERS),
    st.sampled_from(TARGETS),
    st.integers(0, 3),
    st.sampled_from(RESTS),
)
plans = st.builds(
    Plan,
    st.lists(child_plans, min_size=2, max_size=4),
    st.lists(publishes, min_size=1, max_size=20),
)
_rounds = itertools.count()


@pytest.fixture(scope="module")
def hierarchy() -> Iterator[Hierarchy]:
    h = Hierarchy()
    yield h
    assert h.close() == [], "a server died or logged a traceback"


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=plans)
def test_no_foreign_secret_is_ever_delivered(hierarchy: Hierarchy, plan: Plan) -> None:
    result = run_round(hierarchy.master.address, hierarchy.relay.address, plan, f"t{next(_rounds)}")
    assert result["violations"] == []
    assert hierarchy.master.alive() and hierarchy.relay.alive()


def test_a_leak_would_be_seen(hierarchy: Hierarchy) -> None:
    """The check is not vacuous: a child that subscribes to its own chain gets its messages."""
    plan = Plan(
        [ChildPlan("relay"), ChildPlan("master")],
        [Publish(via, "child", k, b"x") for via in SERVERS for k in (0, 1)],
    )
    result = run_round(hierarchy.master.address, hierarchy.relay.address, plan, "own")
    assert result["violations"] == []
    assert result["own_secret_deliveries"] == 4
