"""The short versions of every ``python -m tests.hardening.harness`` run (docs/reliability.md).

Each test calls the same function the command runs, with small parameters,
and fails on the run's ``failures`` (each a broken promise) and on figures that
show the run did not really exercise anything.
"""

from __future__ import annotations

import pytest

from .harness import chaos, faults, fuzz, load, soak


@pytest.mark.timeout(90)
def test_live_fuzz() -> None:
    result = fuzz.run_fuzz(inputs=20_000, fuzzers=4, good_messages=300, seed=7)
    assert result["failures"] == []
    assert result["inputs_delivered"] > 15_000
    assert all(n > 0 for n in result["inputs_by_kind"].values()), result["inputs_by_kind"]
    assert result["outcome"]["closed_by_server"] > 100  # bad input did close clients
    assert result["well_behaved"]["received"] == result["well_behaved"]["expected"] > 0


@pytest.mark.timeout(90)
def test_master_killed_under_load() -> None:
    result = faults.master_kills(kills=3, interval=0.6, rate=500)
    assert result["failures"] == []
    assert result["duplicates"] == 0 and result["out_of_order"] == 0
    assert result["received"] > result["published"] * 0.9


@pytest.mark.timeout(90)
def test_master_killed_with_a_small_relay_queue_counts_its_drops() -> None:
    result = faults.master_kills(kills=2, interval=1.0, rate=1000, queue_messages=50)
    assert result["failures"] == []
    assert result["missing_counted_by_relay"] > 0  # the outage outlasted 50 messages
    assert result["missing"] >= result["missing_counted_by_relay"]


@pytest.mark.timeout(60)
def test_relays_killed_and_restarted() -> None:
    result = faults.relay_kills(cycles=3)
    assert result["failures"] == []
    assert result["delivered_through_relay"] == 3


@pytest.mark.timeout(60)
def test_clients_vanishing_mid_send() -> None:
    result = faults.vanishing_clients(clients=16)
    assert result["failures"] == []
    assert result["messages_through"] > 0


@pytest.mark.timeout(60)
def test_fd_limit() -> None:
    result = faults.fd_limit()
    assert result["failures"] == []
    assert result["accept_error_logs"] > 0
    assert result["served_after_freeing"] > 0


@pytest.mark.timeout(60)
def test_thousand_clients() -> None:
    result = load.run_load(clients=1000, shared=20)
    assert result["failures"] == []
    assert result["messages_checked"] == 21_000


@pytest.mark.timeout(60)
def test_soak_with_a_stalled_subscriber() -> None:
    result = soak.run_soak(duration=8.0)
    assert result["failures"] == []
    assert result["stalled_dropped_hard_discard"] > 0
    assert result["reader_received"] == result["published"] > 0


@pytest.mark.timeout(400)
def test_chaos_in_a_tree_loses_nothing_silently() -> None:
    """Two minutes of upgrades, reloads, kills, pauses, floods and slow readers
    in a tree of four buses (``harness/chaos.py``)."""
    result = chaos.run_chaos(duration=120.0, seed=7)
    assert result["failures"] == [], result
    kinds = set(result["faults"])
    assert kinds >= set(chaos.KINDS) - {"compound"}, kinds
    assert any("+" in kind for kind in kinds), kinds  # a compound fault
    assert result["sent_outside_fault_windows"] > 0
    assert result["lost_outside_fault_windows"] == result["lost_uncounted"] == 0
