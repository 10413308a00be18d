"""The project's image, built once per session (tests/containers/images.py);
every test here skips in one line where containers cannot run."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.containers import images
from tests.containers.podman import PODMAN, container_problem, runtime_problem


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    problem = container_problem()
    if problem is not None:
        pytest.skip(f"!!! containers NOT run: {problem} !!!")
    assert PODMAN is not None
    try:
        base = images.base_image(PODMAN)
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        first = str(exc).strip().splitlines()[0]
        pytest.skip(f"!!! containers NOT run: no Debian base could be made here: {first} !!!")
    problem = runtime_problem(base)
    if problem is not None:
        pytest.skip(f"!!! containers NOT run: podman cannot start one here: {problem} !!!")
    yield images.project_image(PODMAN)
