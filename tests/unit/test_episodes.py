"""Reports of things that repeat (protocol.episodes), on a clock of our own."""

from __future__ import annotations

import pytest

from sbus_relay.protocol.episodes import ENDED, ONGOING, Episodes
from sbus_relay.protocol.limits import EPISODE_QUIET, EPISODE_REPORT_INTERVAL

pytestmark = pytest.mark.timeout(30)


def said(reports: list) -> list[tuple[str, str, int]]:
    return [(what, e.event, e.count) for what, e in reports]


def test_the_first_occurrence_begins_and_the_rest_are_counted() -> None:
    eps = Episodes()
    first = eps.begin("x", 0.0)
    assert first is not None and first.count == 1
    assert eps.begin("x", 0.1) is None
    assert eps.begin("x", 0.2) is None
    assert eps.get("x") is first and first.count == 3


def test_a_quiet_episode_ends_with_its_total_after_a_whole_tick() -> None:
    eps = Episodes()
    eps.begin("x", 0.0)
    eps.begin("x", 0.5)
    # the first tick after it began never ends it: it lasts one whole tick at least
    assert said(eps.tick(EPISODE_QUIET)) == []
    assert said(eps.tick(2 * EPISODE_QUIET)) == [(ENDED, "x", 2)]
    assert not eps


def test_a_single_occurrence_ends_silently_unless_its_end_is_news() -> None:
    eps = Episodes()
    eps.begin("warned", 0.0)
    eps.begin("dropped", 0.0, tell_end=True)
    eps.tick(1.0)
    assert said(eps.tick(2.0)) == [(ENDED, "dropped", 1)]


def test_a_lasting_episode_is_reported_at_a_bounded_rate() -> None:
    eps = Episodes()
    episode = eps.begin("x", 0.0)
    assert episode is not None
    lines = []
    t = 0.0
    while t < 3 * EPISODE_REPORT_INTERVAL:
        t += EPISODE_QUIET
        episode.count += 1000  # occurrences are counted without a clock
        lines += said(eps.tick(t))
    assert [w for w, _, _ in lines] == [ONGOING] * 3
    assert [n for _, _, n in lines] == sorted({n for _, _, n in lines})  # running counts


def test_a_held_episode_lasts_without_occurrences() -> None:
    eps = Episodes()
    episode = eps.begin("shedding", 0.0, tell_end=True)
    assert episode is not None
    episode.held = True
    for t in range(1, 30):
        eps.tick(float(t))
    assert eps.get("shedding") is episode
    episode.held = False  # released, and quiet for a whole tick already: it ends
    assert said(eps.tick(30.0)) == [(ENDED, "shedding", 1)]


def test_close_ends_everything_open() -> None:
    eps = Episodes()
    eps.begin("a", 0.0)
    eps.begin("a", 0.0)
    eps.begin("b", 0.0)
    assert said(eps.close()) == [(ENDED, "a", 2)]
    assert not eps
