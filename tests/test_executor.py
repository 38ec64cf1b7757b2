"""The executors (harness/execute/executors.py): cells in fresh processes, several at once with
their threads capped, bitwise the same as one at a time under the same cap; a worker that
rebuilds other inputs than the driver's is refused; Ray missing is one line."""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from harness import matrix
from harness.calibrate import calibration, roles
from harness.core.errors import HarnessError
from harness.core.paths import SPECS_DIR
from harness.core.registry import PORT_MEMBER_KEY
from harness.execute import capacity, executors, jobs, plan
from harness.inputs.problem import build_problem
from harness.spec.load import load_spec
from harness.verdict.parity import FORWARD

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"checks": {"long_run": {"members": 1}, "math_parity": {"members": 1}}}


def small_matrix(executor):
    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick", SMALL)
    problem = build_problem(loaded)
    keys = plan.matrix_keys(["numpy"], ["cpu"])
    return matrix.run_cells(loaded, problem, keys, None, Console(file=io.StringIO()), repeats=1, executor=executor)


def bits(outcome) -> bytes:
    return outcome.losses.tobytes() + b"".join(np.ascontiguousarray(a).tobytes() for a in outcome.final_params.values())


@pytest.mark.parametrize("host_cores", [1, 2, 8])
def test_default_plan_keeps_the_frameworks_threads_and_jobs_cap_them(monkeypatch, host_cores):
    monkeypatch.setattr(executors, "cores", lambda: host_cores)  # the same on any host
    one = executors.local_slots(None, None)
    assert (one.jobs, one.threads) == (1, None)
    if host_cores >= 2:
        two = executors.local_slots(2, None)
        assert (two.jobs, two.threads) == (2, host_cores // 2)
    else:
        with pytest.raises(HarnessError, match="--jobs 2: more than this host's 1 cores"):
            executors.local_slots(2, None)
    assert executors.local_slots(None, 1).jobs == host_cores
    assert "1 job(s) at a time" in one.describe()


def test_two_jobs_give_the_bits_of_one_job_under_the_same_cap():
    together = small_matrix(executors.Local(capacity.Slots(capacity.LOCAL, 2, 1)))
    alone = small_matrix(executors.Local(capacity.Slots(capacity.LOCAL, 1, 1)))
    assert set(together.outcomes) == set(alone.outcomes)
    for key, outcome in together.outcomes.items():
        assert outcome.status == "ok", outcome.reason
        assert bits(outcome) == bits(alone.outcomes[key]), key.label
        assert outcome.worker["threads"] == 1 and outcome.describe["threads"] == 1
    records = {r.framework + r.precision_mode: r for r in together.records}
    assert all(r.worker is not None and r.worker.threads == 1 for r in records.values())
    assert {r.data.inputs_sha256 for r in together.records} == {jobs.inputs_sha256(together.problem)}
    assert [c.verdict for c in together.checks] == [c.verdict for c in alone.checks]


def test_calibration_runs_share_a_kept_process_with_the_bits_of_their_own(members_from_the_start):
    """The local executor runs the calibration cells (members, math parity's reference) one
    after another in a process it keeps, every other cell in a fresh one; a matrix gives
    the bits, verdicts and records it gives with every cell in the driver's process."""
    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick", SMALL)
    planned = calibration.matrix_jobs(loaded, build_problem(loaded), plan.matrix_keys(["numpy"], ["cpu"]), 1, True)
    calibrating = [c for c in planned if c.calibrates]
    assert {c.role for c in calibrating} == {roles.MEMBER, roles.MEMBER64, roles.REFERENCE}
    assert {c.role for c in planned if not c.calibrates} == {jobs.FRAMEWORK, roles.TWIN}  # recorded, timed: fresh
    local = executors.Local(capacity.Slots(capacity.LOCAL, 1, None))
    try:
        kept = {local.submit(c, os.getpid).result() for c in calibrating}
        fresh = [local.submit(c, os.getpid).result() for c in planned if not c.calibrates]
        together = small_matrix(local)
    finally:
        local.shutdown()
    assert len(kept) == 1 and len(set(fresh)) == len(fresh) and not kept & set(fresh)
    inline = small_matrix(executors.Inline())
    assert set(together.outcomes) == set(inline.outcomes)
    for key, outcome in together.outcomes.items():
        assert outcome.status == "ok" and bits(outcome) == bits(inline.outcomes[key]), key.label
    for ours, theirs in [(together.members, inline.members), (together.members64, inline.members64)]:
        assert len(ours) == len(theirs) == 1 and bits(ours[0]) == bits(theirs[0])
    assert bits(together.calibration.twin_reference) == bits(inline.calibration.twin_reference)
    assert [(c.name, c.verdict, c.ratio) for c in together.checks] == [(c.name, c.verdict, c.ratio) for c in inline.checks]


def test_a_ports_calibration_runs_share_a_kept_process_for_each_framework_and_precision():
    """A port's members are torch runs that no record holds and nothing times (issue 54: a
    fresh process each, importing torch and flax, cost 216 s of the README example's 219 s):
    the local executor runs them, float32 and float64, in a process kept for torch; flax's
    two float64 twins (first steps, re-anchored), recorded but not timed, in one kept for
    JAX (a fresh process each cost the Python API's example 14 of its 79 s); each
    framework's run still starts a process of its own, and no JAX run shares torch's."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    loaded = load_spec(ROOT / "examples" / "mlp_port" / "mlp_port.yaml", "full")
    planned = calibration.matrix_jobs(loaded, build_problem(loaded), plan.port_keys(plan.matrix_keys(["torch", "jax"], ["cpu"])), 1, True)
    groups = {c.name: c.kept_group for c in planned}
    kept = {("torch",), ("jax",)}
    assert {g for g in groups.values() if g is not None} == kept
    assert {c.name for c in planned if c.kept_group == ("jax",)} == {"jax@cpu+float64", "jax@cpu+float64~anchored"}
    assert all(c.kept_group is None for c in planned if c.role == jobs.FRAMEWORK)
    local = executors.Local(capacity.Slots(capacity.LOCAL, 1, None))
    try:
        pids = {c.name: local.submit(c, os.getpid).result() for c in planned}
    finally:
        local.shutdown()
    for group in kept:
        assert len({pids[name] for name, g in groups.items() if g == group}) == 1, group
    fresh = [pids[name] for name, g in groups.items() if g is None]
    assert len(set(fresh)) == len(fresh) and not set(fresh) & {pids[name] for name, g in groups.items() if g is not None}


def test_a_kept_process_that_dies_fails_its_cell_alone_and_the_next_gets_a_new_one():
    from harness.execute.fresh import ProcessDied

    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick", SMALL)
    problem = build_problem(loaded)
    member = roles.member_jobs(loaded, problem, roles.member_seeds(problem, part=roles.FIRST))[0]
    local = executors.Local(capacity.Slots(capacity.LOCAL, 1, None))
    try:
        first = local.submit(member, os.getpid).result()
        with pytest.raises(ProcessDied):
            local.submit(member, os._exit, 3).result()
        after = local.submit(member, os.getpid).result()
        assert after != first and local.submit(member, os.getpid).result() == after
    finally:
        local.shutdown()
    two = executors.Local(capacity.Slots(capacity.LOCAL, 2, 1))  # a kept process per cell thread
    try:
        alive = two.submit(member, time.sleep, 3.0)
        with pytest.raises(ProcessDied):
            two.submit(member, os._exit, 3).result()
        assert alive.result() is None  # the other thread's process went on
    finally:
        two.shutdown()


def test_a_worker_refuses_inputs_that_hash_otherwise():
    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick", SMALL)
    problem = build_problem(loaded)
    source = jobs.source_of(loaded, problem)
    forged = jobs.Source(**{**source.__dict__, "inputs_sha256": "0" * 64})
    (cell,) = [c for c in calibration.matrix_jobs(loaded, problem, plan.matrix_keys(["numpy"], ["cpu"]), 1, False) if c.name == "numpy@cpu"]
    with pytest.raises(jobs.InputsDiffer, match="refused"):
        jobs.run_job(forged, cell)
    assert jobs.run_job(source, cell, quiet=True).outcomes[cell.keys[0]].status == "ok"


def test_ray_missing_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(HarnessError, match=r"pip install '\.\[ray\]'"):
        executors.make("ray")
    with pytest.raises(HarnessError, match="choose local, ray or ray:ADDRESS"):
        executors.make("slurm")
    with pytest.raises(HarnessError, match="need --executor ray"):
        executors.make("local", places=["host-a"])


def test_a_worker_rebuilds_idx_inputs_from_their_folder(mnist_dir):
    """An MNIST problem (IDX files, a data source) rebuilt where a worker runs: the same inputs."""
    loaded = load_spec(SPECS_DIR / "mnist_adamw.yaml", "quick")
    problem = build_problem(loaded, mnist_dir, "test-set")
    source = jobs.source_of(loaded, problem)
    assert source.data_dir == str(mnist_dir.resolve()) or source.data_dir == str(mnist_dir)
    jobs._BUILT.clear()  # as in a fresh process
    assert jobs.inputs_sha256(jobs.rebuilt(source)) == source.inputs_sha256


def test_the_terminal_names_the_workers_and_each_cross_host_row():
    from types import SimpleNamespace

    from harness.core.registry import RunKey
    from harness.report import table
    from harness.verdict.cross_host import CrossHost

    row = CrossHost(RunKey("torch", "gpu"), "gpu-type:H100", "gpu-type:H200", ("a node 1", "b node 2"), False, 3e-7, 12, "pass", None)
    result = SimpleNamespace(loaded=SimpleNamespace(name="peaks_mlp"), cross_host=[row])
    out = Console(file=io.StringIO(), width=250)
    out.print(table.cross_host_table([result]))
    text = out.file.getvalue()
    assert "torch@gpu" in text and "differ" in text and "3e-07" in text and "H200" in text
    assert table.cross_host_table([SimpleNamespace(loaded=result.loaded, cross_host=[])]) is None
    worker = SimpleNamespace(hostname="vm", node=None, threads=1)
    assert table.workers_line([SimpleNamespace(worker=worker)] * 2) == "ran on: vm (1 thread(s)): 2 run(s)"


class _Recording:
    """An executor that runs no training: each cell sleeps a little in a thread, and the
    cells running at once are counted (all of them, and those on the GPU)."""

    def __init__(self, kind: str, jobs: int):
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self.slots = capacity.Slots(kind, jobs, None)
        self.places: list[str] = []
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.lock = threading.Lock()
        self.active: set = set()
        self.most = {"all": 0, "gpu": 0}

    def submit(self, cell, call, *args):
        import time

        from harness.run.runner import Outcome

        def work():
            with self.lock:
                self.active.add(cell)
                self.most["all"] = max(self.most["all"], len(self.active))
                self.most["gpu"] = max(self.most["gpu"], sum(c.gpu for c in self.active))
            time.sleep(0.05)
            with self.lock:
                self.active.discard(cell)
            return jobs.Finished({k: Outcome(k, "ok", timings={"train_s": 0.0}, metrics={"train_loss": 0.0}) for k in cell.keys})

        return self.pool.submit(work)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)


@pytest.mark.parametrize(("kind", "most_gpu"), [(capacity.LOCAL, 1), (capacity.RAY, 3)])
def test_a_local_executor_runs_one_gpu_cell_at_a_time_beside_cpu_cells(kind, most_gpu):
    """Two GPU cells on one machine would share the GPU and each other's timings: the driver
    holds a second back on a local executor, not CPU cells beside it. Ray places GPU cells
    itself (num_gpus=1 each), so the driver does not hold them back there."""
    from harness.core.registry import RunKey
    from harness.execute import schedule

    planned = [
        jobs.Job(f"{f}@{d}", jobs.FRAMEWORK, ((RunKey(f, d), f"{f}@{d}"),), cost=float(i))
        for i, (f, d) in enumerate([("torch", "gpu"), ("jax", "gpu"), ("cupy", "gpu"), ("torch", "cpu"), ("jax", "cpu"), ("numpy", "cpu")])
    ]
    executor = _Recording(kind, jobs=3)
    done = schedule.execute(planned, None, executor, Console(file=io.StringIO()), total_steps=10)
    assert set(done) == {c.name for c in planned}
    assert executor.most["gpu"] == most_gpu
    assert executor.most["all"] >= 2  # CPU cells ran beside a GPU cell


def test_an_interrupt_during_the_wait_is_a_keyboard_interrupt_and_the_handler_comes_back():
    """SIGINT while the driver waits on its jobs: a KeyboardInterrupt raised at the driver's
    next check (the CLI keeps the finished runs on it), not one raised inside the futures'
    lock handling (the first GPU contact saw `RuntimeError: release unlocked lock`); Python's
    own handler is back afterwards."""
    import os
    import signal
    import threading

    from harness.core.registry import RunKey
    from harness.execute import schedule

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("this process does not have Python's Ctrl-C handler (started with SIGINT ignored)")
    planned = [jobs.Job("torch@cpu", jobs.FRAMEWORK, ((RunKey("torch", "cpu"), "torch@cpu"),), cost=1.0)]
    executor = _Recording(capacity.LOCAL, jobs=1)
    executor.submit = lambda cell, call, *args: executor.pool.submit(threading.Event().wait, 2)  # a job that outlasts the interrupt
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        schedule.execute(planned, None, executor, Console(file=io.StringIO()), total_steps=10)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_that_ends_the_last_jobs_process_is_a_keyboard_interrupt():
    """Ctrl-C reaches the process group: the last job's process dies of the same INT and has
    no outcome. The driver raises KeyboardInterrupt (the CLI says `interrupted`, exit 130),
    not a result missing that job (it was `KeyError: RunKey(...)` in harness/matrix.py)."""
    import signal

    from harness.core.registry import RunKey
    from harness.execute import schedule
    from harness.execute.fresh import ProcessDied

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("this process does not have Python's Ctrl-C handler (started with SIGINT ignored)")

    def ended_by_the_groups_int():
        os.kill(os.getpid(), signal.SIGINT)
        raise ProcessDied

    planned = [jobs.Job("numpy@cpu", jobs.FRAMEWORK, ((RunKey("numpy", "cpu"), "numpy@cpu"),), cost=1.0)]
    executor = _Recording(capacity.LOCAL, jobs=1)
    executor.submit = lambda cell, call, *args: executor.pool.submit(ended_by_the_groups_int)
    with pytest.raises(KeyboardInterrupt):
        schedule.execute(planned, None, executor, Console(file=io.StringIO()), total_steps=10)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_math_paritys_cells_skip_the_whole_set_predictions(members_from_the_start):
    """Math parity's reference and float64 members compare curves and probe outputs only:
    their cells skip the final predictions over the whole sets (most of a CNN member's
    time); every run a record or the float32 envelope reads keeps them."""
    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick", SMALL)
    problem = build_problem(loaded)
    planned = calibration.matrix_jobs(loaded, problem, plan.matrix_keys(["numpy", "jax"], ["cpu"]), 1, True)
    assert {c.role for c in planned if not c.metrics} == {roles.REFERENCE, roles.MEMBER64}
    assert all(c.metrics for c in planned if c.role in (jobs.FRAMEWORK, roles.MEMBER, roles.TWIN))
    (reference,) = [c for c in planned if c.role == roles.REFERENCE]
    outcome = jobs.run_job(jobs.source_of(loaded, problem), reference, quiet=True).outcomes[reference.keys[0]]
    assert outcome.status == "ok" and outcome.metrics == {} and outcome.final_outputs is not None


def test_every_executor_is_an_executor():
    """The in-process and local executors (and the fake one of these tests) have the Executor
    Protocol's slots, places, submit and shutdown."""
    from harness.execute import executors

    local = executors.make(capacity.LOCAL, 1)
    try:
        assert isinstance(local, executors.Executor) and local.places == []
    finally:
        local.shutdown()
    assert isinstance(executors.Inline(), executors.Executor)
    assert isinstance(_Recording(capacity.LOCAL, 1), executors.Executor)
    assert not isinstance(object(), executors.Executor)


def test_jobs_run_later_take_the_states_of_jobs_finished_earlier():
    """A second look's re-anchored members need the reference's states, which a run of the
    first look finished: given those outcomes (`finished`), they run; without them the
    driver refuses to wait on a job that never runs."""
    from types import SimpleNamespace

    from harness.core.registry import RunKey
    from harness.execute import schedule
    from harness.run.runner import Outcome

    reference = RunKey("torch", "cpu", precision="float64")
    first = {reference.label: {reference: Outcome(reference, "ok", timings={}, metrics={})}}
    later = [jobs.Job("torch@cpu+float64~order5@anchored", jobs.FRAMEWORK, ((reference, "a member"),), needs=(reference.label,))]
    executor = _Recording(capacity.LOCAL, jobs=1)
    source = SimpleNamespace(document={"checks": {"math_parity": {"steps": 8}}})  # what the driver announces of a re-anchored job
    given = lambda done: {8: "the state at step 8"}  # noqa: E731 - the driver's states(done)
    try:
        done = schedule.execute(later, source, executor, Console(file=io.StringIO()), states=given, total_steps=10, finished=first)
        assert set(done) == {reference.label, later[0].name} and done[later[0].name][reference].status == "ok"
        with pytest.raises(RuntimeError, match="never run"):
            schedule.execute(later, source, executor, Console(file=io.StringIO()), states=given, total_steps=10)
    finally:
        executor.shutdown()


def test_a_ports_file_runs_where_its_start_check_and_torchs_members_then_run():
    """matrix.port_apart (issue 54): on the local executor a port's module facts and its
    start check run in the process it keeps for torch's calibration runs, the one torch's
    members then take, not in a fresh process of their own nor in the driver; inline, in
    this process, as every run; on another executor, or none yet (Ray's is made after the
    problems), in a fresh process."""
    local = executors.Local(capacity.Slots(capacity.LOCAL, 1, None))
    member = jobs.Job("mlp_port torch@cpu~order1", roles.MEMBER, ((PORT_MEMBER_KEY, "a member"),), recorded=False, own_process=False)
    try:
        facts = matrix.port_apart("mlp_port", local)(os.getpid)
        start = matrix.port_apart("mlp_port", local, FORWARD)(os.getpid)
        assert facts == start == local.submit(member, os.getpid).result() != os.getpid()
    finally:
        local.shutdown()
    assert matrix.port_apart("mlp_port", executors.Inline())(os.getpid) == os.getpid()
    assert matrix.port_apart("mlp_port", None) is matrix.port_apart("mlp_port", object()) is executors.in_fresh_process
