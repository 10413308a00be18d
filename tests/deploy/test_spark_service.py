"""The Spark Connect server's systemd unit and compose service, as files.

Their command itself runs in tests/pipeline: the Connect server every
``--remote`` test uses is started by this unit's ExecStart (this venv's
program, a free port), and stopped with SIGTERM as systemd stops it.  Here:
``systemd-analyze verify`` accepts the unit, the image's command and the unit's
agree, and the compose service publishes that port on loopback only, with the
captures at the same path inside as outside.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest
import yaml

from sbus_relay.cli import spark_server
from tests.deploy.shipped import (
    DEPLOY,
    INSTALLED_BIN,
    REPO,
    VERIFY_TIMEOUT,
    find_systemd_analyze,
    load,
    verify,
)
from tests.support import VENV_BIN

UNIT = "sbus-spark.service"
DOCKERFILE = DEPLOY / "Dockerfile.spark"
COMPOSE = DEPLOY / "docker-compose.yml"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    spark_server.add_arguments(parser)
    return parser.parse_args(argv)


def unit_args() -> list[str]:
    argv = shlex.split(load(UNIT).value("Service", "ExecStart"))
    assert argv[0] == f"{INSTALLED_BIN}sbus-relay" and argv[1] == "spark-server", argv
    return argv[2:]


def image_args() -> list[str]:
    (cmd,) = [
        line.removeprefix("CMD ") for line in DOCKERFILE.read_text().splitlines()
        if line.startswith("CMD ")
    ]  # fmt: skip
    argv = json.loads(cmd)  # the exec form: signals reach the server's command
    assert argv[:2] == ["sbus-relay", "spark-server"], argv
    return [str(a) for a in argv[2:]]


@pytest.mark.timeout(VERIFY_TIMEOUT * 2)
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = find_systemd_analyze()
    text = (DEPLOY / UNIT).read_text().replace(INSTALLED_BIN, VENV_BIN + "/")
    (tmp_path / UNIT).write_text(text)
    assert verify(analyze, tmp_path, UNIT) == []


@pytest.mark.timeout(10)
def test_the_unit_and_the_image_run_the_same_server() -> None:
    unit, image = parse(unit_args()), parse(image_args())
    assert unit.host == "127.0.0.1"  # no authentication: never the network by default
    assert image.host == "0.0.0.0"  # inside the container; published on loopback below
    assert (unit.port, unit.memory, unit.conf) == (image.port, image.memory, image.conf)
    # The unit keeps the class archive where its sandbox lets it write.
    env = load(UNIT).value("Service", "Environment")
    cache = load(UNIT).value("Service", "CacheDirectory")
    assert env == f"XDG_CACHE_HOME=/var/cache/{cache}"


@pytest.mark.timeout(10)
def test_the_compose_service_publishes_on_loopback_and_mounts_at_the_same_path() -> None:
    service = yaml.safe_load(COMPOSE.read_text())["services"]["spark"]
    assert (REPO / "configs" / "deploy" / Path(service["build"]["dockerfile"]).name).exists()
    assert (DEPLOY / service["build"]["context"]).resolve() == REPO
    port = parse(image_args()).port
    assert service["ports"] == [f"127.0.0.1:{port}:{port}"]
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        assert source == target, "analyze gives the server host paths: mount them as they are"
