"""Fixtures shared by the real-process server tests: one bus per test module."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.server.rawclient import RawClient, client_factory, module_bus


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real ``sbusd`` shared by the tests of one module."""
    yield from module_bus(tmp_path_factory)


@pytest.fixture
def connect(bus: Any) -> Iterator[Callable[[], RawClient]]:
    """Make raw clients of ``bus``; they are closed after the test."""
    yield from client_factory(bus)
