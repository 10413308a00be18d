"""Which NATS client the link runs (link/choice.py): nats.c where it was
built, nats-py when asked or where it was not, with one line saying so."""

from __future__ import annotations

import pytest

from sbus_relay.link import choice
from sbus_relay.link.engine import NATS_C, NATS_PY

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def said() -> list[str]:
    return []


def test_auto_runs_nats_c_where_it_was_built(
    monkeypatch: pytest.MonkeyPatch, said: list[str]
) -> None:
    monkeypatch.delenv("SBUS_PURE_PYTHON", raising=False)
    monkeypatch.setattr(choice, "nats_c_built", lambda: True)
    assert choice.choose("auto", said.append) == NATS_C and said == []


def test_auto_falls_back_to_nats_py_and_says_so(
    monkeypatch: pytest.MonkeyPatch, said: list[str]
) -> None:
    monkeypatch.delenv("SBUS_PURE_PYTHON", raising=False)
    monkeypatch.setattr(choice, "nats_c_built", lambda: False)
    assert choice.choose("auto", said.append) == NATS_PY
    assert len(said) == 1 and "not built" in said[0]


def test_the_pure_python_setting_runs_nats_py(
    monkeypatch: pytest.MonkeyPatch, said: list[str]
) -> None:
    monkeypatch.setenv("SBUS_PURE_PYTHON", "1")
    monkeypatch.setattr(choice, "nats_c_built", lambda: True)
    assert choice.choose("auto", said.append) == NATS_PY and said == []
    assert choice.choose(NATS_C, said.append) == NATS_PY and len(said) == 1


def test_nats_py_by_name(monkeypatch: pytest.MonkeyPatch, said: list[str]) -> None:
    monkeypatch.delenv("SBUS_PURE_PYTHON", raising=False)
    monkeypatch.setattr(choice, "nats_c_built", lambda: True)
    assert choice.choose(NATS_PY, said.append) == NATS_PY and said == []


def test_the_nats_c_engine_is_built_here_where_libnats_is() -> None:
    import shutil
    import subprocess

    have = (
        shutil.which("pkg-config")
        and subprocess.run(["pkg-config", "--exists", "libnats"], check=False).returncode == 0
    )
    if not have:
        pytest.skip("libnats is not installed here (libnats-dev): the link runs nats-py")
    assert choice.nats_c_built(), "libnats is installed but the nats.c engine was not built"
