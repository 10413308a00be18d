"""Finding the reference: --reference-src, the environment variable, the checkout's
surroundings; and from a fresh clone, where to get it and a build from its project's clone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sbus_relay.bench.build import BuildError
from sbus_relay.bench.reference import (
    HOW_TO_GET,
    SOURCE_ENV,
    SOURCES,
    UPSTREAM,
    find_sources,
    resolve_reference,
)

ROOT = Path(__file__).resolve().parents[2]


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
    assert reason == f"${SOURCE_ENV}={tmp_path} has no sbusd.c and libsbusd.c; {HOW_TO_GET}"


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
    assert reason == f"no reference sources (sbusd.c) beside the checkout; {HOW_TO_GET}"
    assert (
        f"git clone {UPSTREAM}" in reason and "--reference-src" in reason and SOURCE_ENV in reason
    )


@pytest.mark.timeout(10)
def test_a_clone_of_the_project_beside_the_checkout_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    checkout = tmp_path / "src" / "sbus_relay"
    checkout.mkdir(parents=True)
    clone = sources_in(tmp_path / "src" / "sbus")  # what `git clone UPSTREAM` makes
    assert find_sources(checkout) == (clone, "")


@pytest.mark.timeout(10)
def test_reference_src_wins_and_must_hold_the_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCE_ENV, str(sources_in(tmp_path / "env")))
    given = sources_in(tmp_path / "given")
    assert find_sources(tmp_path, given=given) == (given, "")
    with pytest.raises(BuildError) as refused:
        resolve_reference(None, False, tmp_path / "cache", tmp_path / "empty")
    assert str(refused.value) == (
        f"--reference-src {tmp_path / 'empty'} has no sbusd.c and libsbusd.c; {HOW_TO_GET}"
    )


@pytest.mark.timeout(10)
def test_no_reference_flag_needs_no_sources() -> None:
    ref = resolve_reference(None, disabled=True)
    assert ref.path is None and ref.reason == "--no-reference given"


def _git(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=60,
    )


def _bench(cwd: Path, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``python -m sbus_relay bench`` run in ``cwd`` (its package: that checkout's)."""
    out = tmp / "bench.json"
    cmd = [sys.executable, "-m", "sbus_relay", "bench", "--quick", "--only", "1to1"]
    cmd += ["--messages", "2000", "--json", str(out), "--cache-dir", str(tmp / "cache"), *args]
    env = {k: v for k, v in os.environ.items() if k != SOURCE_ENV}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=150)
    assert out.exists(), proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.timeout(180)
@pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("gcc") is None, reason="needs git and gcc"
)
def test_a_fresh_clone_without_the_reference_says_where_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    clone = tmp_path / "clone"
    _git("clone", "-q", str(ROOT), str(clone))
    assert find_sources(clone)[0] is None  # nothing beside it
    proc, data = _bench(clone, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reason = data["scenarios"]["1to1"]["reference_left_out"]
    assert reason == f"no reference sources (sbusd.c) beside the checkout; {HOW_TO_GET}"
    assert f"reference sbusd: {reason}; its column is left out" in proc.stderr.splitlines()


@pytest.mark.timeout(240)
@pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("gcc") is None, reason="needs git and gcc"
)
def test_the_bench_builds_the_reference_from_a_clone_of_its_project(tmp_path: Path) -> None:
    sources, reason = find_sources()
    if sources is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must measure the reference: {reason}")
        pytest.skip(reason)
    # The sbus project's repository as a user would clone it: every source file of
    # the tree found (itself a clone, or a copy), as a repository of its own.
    upstream = tmp_path / "upstream"
    built = ("*.o", "*.a", "*.so", "sbusd", "test")
    shutil.copytree(sources, upstream, ignore=shutil.ignore_patterns(".git", *built))
    _git("init", "-q", cwd=upstream)
    _git("add", "-A", cwd=upstream)
    _git("commit", "-q", "-m", "sbus", cwd=upstream)
    clone = tmp_path / "sbus"
    _git("clone", "-q", str(upstream), str(clone))
    proc, data = _bench(ROOT, tmp_path, "--reference-src", str(clone))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # by name, never by the paths they had here (a run's file is read elsewhere)
    assert data["meta"]["reference_source"] == clone.name
    assert data["meta"]["reference"].startswith("reference-")
    assert data["meta"]["reference"].endswith("/sbusd")
    side = data["scenarios"]["1to1"]["sides"]["reference"]
    assert side["delivered"] == side["expected"] > 0
    assert not any(clone.glob("*.o")) and not (clone / "sbusd").exists()  # built elsewhere


@pytest.mark.timeout(10)
def test_a_tree_in_a_directory_everyone_may_write_to_is_not_taken_unasked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /tmp/sbus may be anyone's: compiling and running it unasked is not safe.
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    shared = tmp_path / "a" / "b" / "shared"  # every ancestor searched is in tmp_path
    checkout = shared / "repo"
    checkout.mkdir(parents=True)
    planted = sources_in(shared / "sbus")
    shared.chmod(0o1777)
    found, reason = find_sources(checkout)
    assert found is None and "no reference sources" in reason
    assert find_sources(checkout, given=planted) == (planted, "")  # named: taken
