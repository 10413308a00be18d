"""The 3-node NATS cluster the tests of a module share (tests/nats/cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nats.cluster import Cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("nats"))
    yield c
    c.stop()
