"""The nats_cluster: key of an `up` file: what is taken and the errors."""

from __future__ import annotations

import pytest

from sbus_relay.ops.natscluster import NatsNode, argv, parse_cluster
from sbus_relay.protocol.errors import ConfigError

pytestmark = pytest.mark.timeout(10)


def test_nodes_and_their_routes() -> None:
    nodes = parse_cluster("f.yaml", [{"name": "n1", "port": 1, "cluster_port": 2},
                                     {"name": "n2", "port": 3, "cluster_port": 4}])  # fmt: skip
    assert nodes == (NatsNode("n1", 1, 2), NatsNode("n2", 3, 4))
    line = argv("nats-server", nodes[0], nodes)
    assert line[line.index("--routes") + 1] == "nats://127.0.0.1:4"
    assert "--routes" not in argv("nats-server", nodes[0], nodes[:1])


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ([], "nats_cluster"),
        ([{"name": "n1", "port": 1}], "nats_cluster[0].cluster_port"),
        ([{"name": "n 1", "port": 1, "cluster_port": 2}], "nats_cluster[0].name"),
        ([{"name": "n1", "port": 1, "cluster_port": 2, "x": 1}], "nats_cluster[0].x"),
        ([{"name": "a", "port": 1, "cluster_port": 2}, {"name": "b", "port": 2, "cluster_port": 3}],
         "nats_cluster"),
    ],
)  # fmt: skip
def test_errors(value: object, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_cluster("f.yaml", value)
    assert e.value.key == key and e.value.source == "f.yaml"
