"""The fleet fault run's arithmetic (``harness/fleetchaos.steps``): the fewest
counter steps that explain where a message is missing, with and without
subscribers whose loss a killed bus on the way explains already."""

from __future__ import annotations

import pytest

from .harness.fleet import HOSTS, ROLES, bus_name
from .harness.fleetchaos import steps

pytestmark = pytest.mark.timeout(30)

BUSES = sorted(bus_name(h, r) for h in HOSTS for r in ROLES)


def others(*hosts: int) -> set[str]:
    return {bus_name(h, r) for h in hosts for r in ROLES}


def test_a_host_that_missed_it_whole_is_one_step_and_all_others_at_once_one() -> None:
    assert steps("h3-m", others(1), BUSES) == 1
    assert steps("h3-m", others(1, 2), BUSES) == 1  # it never left host 3
    assert steps("h3-m", {"h1-m", "h1-r2"}, BUSES) == 2  # two subscribers apart
    assert steps("h3-r1", others(1, 2) | {"h3-m", "h3-r2"}, BUSES) == 1  # never left its relay


def test_a_subscriber_behind_a_killed_bus_may_have_missed_it_the_same_way() -> None:
    missed = others(1, 2) - {"h1-r1"}
    assert steps("h3-m", missed, BUSES) == 3
    assert steps("h3-m", missed, BUSES, {"h1-r1"}) == 1
    assert steps("h3-m", {"h1-m"}, BUSES, {"h1-r1"}) == 1  # h1-r2 got it: not whole
    assert steps("h3-m", set(), BUSES, {"h1-r1"}) == 0
    relay = others(1, 2) | {"h3-m", "h3-r2"}
    assert steps("h3-r1", relay - {"h2-r1"}, BUSES, {"h2-r1"}) == 1
