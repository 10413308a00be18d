"""Finding the reference sources: the environment variable, then the checkout's surroundings."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbus_relay.bench.reference import SOURCE_ENV, SOURCES, find_sources, resolve_reference


def sources_in(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for name in SOURCES:
        (directory / name).write_text("/* stub */\n")
    return directory


@pytest.mark.timeout(10)
def test_environment_variable_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = sources_in(tmp_path / "elsewhere")
    sources_in(tmp_path / "checkout" / "reference-sbus")
    monkeypatch.setenv(SOURCE_ENV, str(named))
    assert find_sources(tmp_path / "checkout") == (named, "")


@pytest.mark.timeout(10)
def test_environment_variable_without_sources_is_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCE_ENV, str(tmp_path))
    found, reason = find_sources(tmp_path)
    assert found is None
    assert reason == f"${SOURCE_ENV}={tmp_path} has no sbusd.c and libsbusd.c"


@pytest.mark.timeout(10)
def test_found_one_level_below_a_parent_of_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    checkout = tmp_path / "work" / "repo"
    checkout.mkdir(parents=True)
    beside = sources_in(tmp_path / "work" / "common" / "reference-sbus")
    assert find_sources(checkout) == (beside, "")


@pytest.mark.timeout(10)
def test_directory_without_sbusd_c_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    checkout = tmp_path / "a" / "b" / "c" / "d" / "repo"
    checkout.mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "d" / "reference-sbus").mkdir()
    found, reason = find_sources(checkout)
    assert found is None
    assert "no reference sources found" in reason and SOURCE_ENV in reason


@pytest.mark.timeout(10)
def test_no_reference_flag_needs_no_sources() -> None:
    ref = resolve_reference(None, disabled=True)
    assert ref.path is None and ref.reason == "--no-reference given"
