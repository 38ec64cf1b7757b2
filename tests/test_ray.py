"""Ray (harness/execute/ray_executor.py) on a simulated cluster of two nodes on this machine
(ray.cluster_utils.Cluster), custom resources standing in for two hosts: the same records,
bitwise, as the local executor under the same thread cap; a cross-host row per run made on
both; a worker killed mid-cell loses nothing."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from harness import matrix
from harness.core.paths import SPECS_DIR
from harness.execute import capacity, executors, plan
from harness.inputs.problem import build_problem
from harness.spec.load import load_spec

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")
pytestmark = pytest.mark.slow

SMALL = {"checks": {"long_run": {"members": 1}, "math_parity": {"members": 1}}}
PLACES = ["host-a", "host-b"]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"host-a": 1}})
    made.add_node(num_cpus=1, resources={"host-b": 1})
    ray.init(address=made.address, include_dashboard=False, logging_level="WARNING")
    yield made
    ray.shutdown()
    made.shutdown()


def small_matrix(executor, work_dir: Path | None = None):
    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick", SMALL)
    problem = build_problem(loaded)
    keys = plan.matrix_keys(["numpy"], ["cpu"])
    return matrix.run_cells(loaded, problem, keys, None, Console(file=io.StringIO()), repeats=1, executor=executor, work_dir=work_dir)


def bits(outcome) -> bytes:
    return outcome.losses.tobytes() + b"".join(np.ascontiguousarray(a).tobytes() for a in outcome.final_params.values())


@pytest.fixture(scope="module")
def local():
    return small_matrix(executors.Local(capacity.Slots(capacity.LOCAL, 1, 1)))


def test_ray_gives_the_local_records_bitwise_and_a_cross_host_row_per_run(cluster, local):
    from harness.execute.ray_executor import RayExecutor

    result = small_matrix(RayExecutor(None, None, 1, [], PLACES))
    assert set(result.outcomes) == set(local.outcomes)
    for key, outcome in result.outcomes.items():
        assert outcome.status == "ok", outcome.reason
        assert bits(outcome) == bits(local.outcomes[key]), key.label
    assert [c.verdict for c in result.checks] == [c.verdict for c in local.checks]
    rows = {row.key.label: row for row in result.cross_host}
    assert set(rows) == {"numpy@cpu", "oracle@cpu"}  # the framework cells, once per place
    for row in rows.values():
        assert (row.first, row.other) == tuple(PLACES)
        assert row.bitwise_identical and row.verdict == "pass"
        assert row.hosts[0] != row.hosts[1]  # two Ray nodes, named
    nodes = {o.worker["node"] for o in result.outcomes.values()}
    assert all(nodes)


def _ray_cells() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if title.startswith(b"ray::_task"):
            found.append(int(pid))
    return found


def test_a_worker_killed_mid_cell_is_retried_and_nothing_is_lost(cluster, local, tmp_path):
    from harness.execute.ray_executor import RayExecutor

    killed = []

    def kill_one():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for pid in _ray_cells():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one)
    killer.start()
    result = small_matrix(RayExecutor(None, None, 1, [], []), tmp_path)
    killer.join()
    assert killed, "no Ray worker was seen running a cell"
    for key, outcome in result.outcomes.items():
        assert outcome.status == "ok", outcome.reason
        assert bits(outcome) == bits(local.outcomes[key]), key.label
    # every finished run kept, whole (the reference too), and nothing half-written beside them
    kept = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert len(kept) == 2 * (len(result.outcomes) + len(result.members) + len(result.members64) + 1), kept
    assert all(name.endswith((".json", ".npz")) for name in kept)
