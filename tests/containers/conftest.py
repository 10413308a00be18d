"""The project's image, built once per session (tests/containers/images.py);
every test here skips in one line where containers cannot run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.containers import images
from tests.containers.podman import PODMAN, usable_image


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    usable_image(images.base_image, "containers NOT run")
    assert PODMAN is not None
    yield images.project_image(PODMAN)
