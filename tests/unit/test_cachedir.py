"""One cache directory, ``~/.cache/sbus-relay``; what an older version cached
under ``~/.cache/sbus_relay`` is moved into it on first use."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbus_relay.bench.build import default_cache_dir
from sbus_relay.ops.cachedir import cache_dir
from sbus_relay.pipeline import classarchive

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_the_bench_and_analyze_share_one_cache_directory(cache_home: Path) -> None:
    assert cache_dir() == cache_home / "sbus-relay"
    assert classarchive.cache_dir() == cache_dir()
    assert default_cache_dir() == cache_dir() / "bench"


def test_without_xdg_cache_home_it_is_under_the_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    assert cache_dir() == Path("/nonexistent-home/.cache/sbus-relay")


def test_the_old_directory_is_moved_into_the_one(cache_home: Path) -> None:
    old_build = cache_home / "sbus_relay" / "bench" / "0123abcd"
    old_build.mkdir(parents=True)
    (old_build / "loadgen").write_bytes(b"\x7fELF built")
    (cache_home / "sbus-relay").mkdir()
    (cache_home / "sbus-relay" / "spark-x.jsa").write_bytes(b"archive")
    assert default_cache_dir() == cache_home / "sbus-relay" / "bench"
    # the build is found where it is looked for, nothing rebuilt; the old name is gone
    assert (default_cache_dir() / "0123abcd" / "loadgen").read_bytes() == b"\x7fELF built"
    assert (cache_home / "sbus-relay" / "spark-x.jsa").read_bytes() == b"archive"
    assert not (cache_home / "sbus_relay").exists()


def test_an_entry_both_have_keeps_the_one_directory_s(cache_home: Path) -> None:
    for name, text in (("sbus_relay", "old"), ("sbus-relay", "new")):
        (cache_home / name / "bench" / "0123abcd").mkdir(parents=True)
        (cache_home / name / "bench" / "0123abcd" / "loadgen").write_text(text)
    (cache_home / "sbus_relay" / "reference-1").mkdir()
    cache_dir()
    assert (cache_home / "sbus-relay" / "bench" / "0123abcd" / "loadgen").read_text() == "new"
    assert (cache_home / "sbus-relay" / "reference-1").is_dir()
    assert not (cache_home / "sbus_relay").exists()
