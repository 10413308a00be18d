"""analyze on a real standalone cluster (master and worker from the installed pyspark),
through --master and through spark-submit: the same tables as local mode.

How long each mode takes is measured by the pipeline benchmark
(``python -m sbus_relay.bench.pipeline``, docs/pipeline.md), not asserted
here: on a shared 2-core machine a timing bound would fail by chance."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from sbus_relay.bench.cluster import standalone_cluster  # noqa: E402
from sbus_relay.bench.synth import generate  # noqa: E402
from sbus_relay.cli import submit as submit_script  # noqa: E402
from tests.support import VENV_BIN  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

#: Rows of the synthetic capture: enough for every stage to have real work.
ROWS = 1_000_000


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.monotonic()
    result = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=env
    )
    elapsed = time.monotonic() - t0
    assert result.returncode == 0, result.stderr[-4000:]
    return elapsed, result.stdout


def tables(out: Path) -> dict[str, list[dict[str, object]]]:
    got = {}
    for name in ("prefix_windows", "size_percentiles", "instances", "bursts", "size_histogram"):
        rows = pq.read_table(out / name).to_pylist()
        got[name] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
    return got


def test_cluster_matches_local_and_is_not_slower(tmp_path: Path) -> None:
    cap = tmp_path / "cap"
    generate(cap, ROWS, seconds=3600.0)
    analyze = [os.path.join(VENV_BIN, "sbus-relay"), "analyze", str(cap), "--no-report"]
    local_s, _ = run([*analyze, "--out", str(tmp_path / "local")])
    # An activated venv: spark-submit's driver is this venv's python, no PYSPARK_* needed.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    cores = min(2, os.cpu_count() or 2)
    with standalone_cluster(cores=cores, memory="2g", work_dir=tmp_path / "spark") as cluster:
        cluster_s, out = run(
            [*analyze, "--out", str(tmp_path / "cluster"), "--master", cluster.url]
        )
        assert f"analysed {ROWS:,} messages" in out
        submit = os.path.join(VENV_BIN, "spark-submit")
        script = str(Path(submit_script.__file__))
        _, out = run(
            [submit, "--master", cluster.url, script, str(cap), "--out",
             str(tmp_path / "submitted"), "--no-report"],
            env=env,
        )  # fmt: skip
        assert f"analysed {ROWS:,} messages" in out
        apps = list((tmp_path / "spark" / "work").iterdir())
        assert len(apps) == 2, "both runs were on the cluster's executors"
    print(f"local {local_s:.1f} s, cluster {cluster_s:.1f} s")  # shown with -s
    local = tables(tmp_path / "local")
    assert tables(tmp_path / "cluster") == local
    assert tables(tmp_path / "submitted") == local
