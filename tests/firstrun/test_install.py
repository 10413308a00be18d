"""What the install gives a new user: optional extras say how to get them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import VENV_BIN, run_cli

pytestmark = pytest.mark.timeout(60)

#: Modules of the optional ``spark`` extra, hidden one at a time below.
SPARK_MODULES = ("pyarrow", "pyspark")


def hide(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing ``modules`` fails as if not installed."""
    shadow = tmp_path / "shadow"
    shadow.mkdir(exist_ok=True)
    for name in modules:
        (shadow / f"{name}.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    return {**os.environ, "PYTHONPATH": str(shadow)}


@pytest.mark.parametrize(
    "argv",
    [
        ["record", "--duration", "1", "--out", "{captures}"],
        ["analyze", "{captures}", "--out", "{r}"],
    ],
    ids=["record", "analyze"],
)
def test_record_and_analyze_without_the_spark_extra_say_how_to_install_it(
    tmp_path: Path, argv: list[str]
) -> None:
    captures = tmp_path / "captures"
    captures.mkdir()
    (captures / "part-0.parquet").write_bytes(b"PAR1")  # so analyze gets past its checks
    args = [a.format(captures=captures, r=tmp_path / "report") for a in argv]
    done = run_cli(*args, env=hide(tmp_path, *SPARK_MODULES))
    err = done.stderr.decode()
    assert done.returncode == 3, err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "spark" in lines[0] and "pip install" in lines[0]


def test_bench_profile_finds_py_spy_in_the_dev_install() -> None:
    # `make test` installs the dev extra, which carries py-spy for `bench --profile`.
    done = subprocess.run(
        [os.path.join(VENV_BIN, "py-spy"), "--version"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith(b"py-spy ")


#: The checkout's root (this file is tests/firstrun/...).
ROOT = Path(__file__).resolve().parents[2]


def test_reports_written_to_report_are_ignored_by_git() -> None:
    # `sbus-relay analyze ... --out report`, as the README shows.
    done = subprocess.run(
        ["git", "check-ignore", "-q", "report/report.md"],
        cwd=ROOT,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, "report/ is not in .gitignore"


def test_docs_stand_on_their_own() -> None:
    # A clone has no files beside the repository: the protocol is docs/protocol.md.
    assert (ROOT / "docs" / "protocol.md").is_file()
    outside = ("shared/sbus-README", "shared/SPEC", "../shared")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for needle in outside:
            assert needle not in text, f"{path.name} points at {needle}"
