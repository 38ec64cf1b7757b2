"""Re-anchored twins (harness/run/anchored.py): every adapter goes on from a saved training
state exactly where the oracle would, and a math difference that starts late in a run is
caught there, in the segment where it starts, while the first steps' twins cannot see it."""

from __future__ import annotations

import types

import numpy as np
import pytest

from harness.core import registry
from harness.core.registry import FLOAT64, ORACLE_KEY, CheckVerdict, RunKey
from harness.inputs import problem as inputs
from harness.spec.load import load_spec
from tests.test_injected_bugs import run_with_copies, shortened_spec
from tests.test_recipes import RECIPES

START, STEPS = 9, 6  # go on from the state after 9 updates, for 6 updates


def oracle_states(problem, at: int):
    """The oracle's losses over the whole run, and its whole state after `at` updates."""
    adapter = registry.load("numpy")
    trainer = adapter.build(problem, adapter.put(problem, ORACLE_KEY), ORACLE_KEY)
    adapter.train(trainer, 0, at)
    state = adapter.training_state(trainer)
    adapter.train(trainer, at, problem.total_steps)
    return np.asarray(adapter.state(trainer, problem.total_steps).losses), state


def went_on(framework: str, problem, state):
    """`framework`'s float64 twin loaded with the oracle's state at step START and trained
    STEPS steps from there: its adapter and trainer (skipped where it is not installed)."""
    adapter = registry.load(framework)
    key = RunKey(framework, "cpu", precision=FLOAT64)
    if adapter.unavailable(key):
        pytest.skip(adapter.unavailable(key))
    trainer = adapter.build(problem, adapter.put(problem, key), key)
    adapter.load_state(trainer, state, START)
    adapter.train(trainer, START, START + STEPS)
    return adapter, trainer


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("recipe", ["sgd_momentum", "sgd_nesterov_decay", "adam_coupled_decay", "adamw", "label_smoothing", "sgd_clipped"])
def test_each_adapter_goes_on_from_the_oracles_state(framework, recipe):
    """Loaded at step 9 (parameters, moments or momentum buffers, update count), each float64
    twin's next steps are the oracle's own, to float64 rounding (bit for bit in NumPy)."""
    problem = inputs.truncated(inputs.build_problem(load_spec("specs/moons_net.yaml", "quick", RECIPES[recipe])), START + STEPS)
    losses, state = oracle_states(problem, START)
    adapter, trainer = went_on(framework, problem, state)
    got = np.asarray(adapter.state(trainer, START + STEPS).losses[START:])
    want = losses[START : START + STEPS]
    if framework == "numpy":
        assert np.array_equal(got, want)
    else:  # torch's clipping eps is a catalogued difference: 1e-6 / norm per clipped step
        assert np.max(np.abs(got - want) / np.abs(want)) < (1e-5 if (framework, recipe) == ("torch", "sgd_clipped") else 1e-13)


def late_lr_change(real_step):
    """torch's step, its learning rate 0.1% higher from update 301 on."""

    def _train_step(trainer, model, optimizer, step, scheduler=None):
        if step >= 301:
            for group in optimizer.param_groups:
                group["lr"] = trainer.problem.spec.optimizer.lr * 1.001
        return real_step(trainer, model, optimizer, step, scheduler)

    return _train_step


def test_a_late_learning_rate_change_is_caught_in_its_segment(monkeypatch):
    """peaks_mlp (quick data, 500 steps): a torch whose learning rate grows by 0.1% from update
    301 passes the first steps' math parity, and the re-anchored twins report it as
    implementation, starting between steps 300 and 400; the honest twins pass there."""
    torch_adapter = pytest.importorskip("adapters.torch_adapter")
    loaded = shortened_spec("peaks_mlp", {"training": {"epochs": 500}, "checks": {"math_parity": {"every": 100}}})
    with monkeypatch.context() as m:
        from tests import test_injected_bugs

        m.setitem(test_injected_bugs.BUGGY, "torch_late_lr", ("torch", {"_train_step": late_lr_change(torch_adapter._train_step)}))
        result = run_with_copies(loaded, ["torch_late_lr"])
    checks = {(c.a.label, c.name): c for c in result.checks if c.b == ORACLE_KEY}
    late = "torch_late_lr@cpu+float64"
    assert checks[late, "math_loss_curve"].verdict == CheckVerdict.PASS  # the first 100 steps cannot see it
    anchored = checks[late, "math_anchored_loss_curve"]
    assert anchored.verdict == CheckVerdict.FAIL and anchored.segment == 300 and 300 < anchored.first_failure_step < 400
    assert (
        anchored.diagnosis.startswith("implementation")
        and "starts at step 30" in anchored.diagnosis
        and "re-anchored at step 300" in anchored.diagnosis
    )
    for framework in ("torch", "jax", "numpy"):
        honest = checks.get((f"{framework}@cpu+float64", "math_anchored_loss_curve"))
        if honest is not None:
            assert honest.verdict == CheckVerdict.PASS, honest


def test_a_re_anchored_cell_prints_its_steps_and_training_time_for_tools_timings(tmp_path):
    """The terminal's lines of a re-anchored cell: its segments' steps as it starts, their
    training time as it ends; tools/timings.py counts them as re-anchored runs."""
    import io
    import subprocess
    import sys

    from rich.console import Console

    from harness.calibrate import roles
    from harness.execute import jobs, schedule
    from harness.run.runner import Outcome
    from tests.conftest import ROOT

    key = RunKey("torch", "cpu", precision="float64", variant="anchored")
    cell = jobs.Job(key.label, roles.ANCHORED_TWIN, ((key, f"moons_net {key.label} (float64 twin, re-anchored)"),), needs=("oracle@cpu",))
    out = io.StringIO()
    console = Console(file=out, width=200)
    schedule._announce(console, cell, 100, 3)
    outcome = Outcome(key, "ok", timings={"train_s": 1.25})
    outcome.segments = {100: np.zeros(100), 200: np.zeros(100), 300: np.zeros(100)}
    schedule._report(console, cell, {key: outcome})
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("(float64, 300 steps, 1 repeat(s): 3 re-anchored segments)")
    assert lines[1].strip() == "train 1.250 s, 3 segments"
    log = tmp_path / "run.log"
    log.write_text(out.getvalue())
    table = subprocess.run([sys.executable, "tools/timings.py", str(log)], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "| moons_net | torch@cpu+float64~anchored | re-anchored runs | 300 | 1 | 1.2 |" in table


def late_bn_momentum(real_step):
    """torch's step, every batch norm's momentum doubled from update LATE_BN on: only the
    running statistics change, and with them evaluation; no training loss does."""

    def _train_step(trainer, model, optimizer, step, scheduler=None):
        if step >= LATE_BN:
            for module in model.modules():
                if hasattr(module, "running_var"):
                    module.momentum = 2 * trainer.problem.spec.model.layers[1].momentum
        return real_step(trainer, model, optimizer, step, scheduler)

    return _train_step


LATE_BN = 40
BATCH_NORM_NET = {
    "name": "generated",
    "title": "a generated workload",
    "article": "tests/test_anchored.py",
    "data": {"kind": "image_patterns", "n_samples": 80, "shape": [2, 8, 8], "classes": 3, "noise": 0.3, "seed": 3},
    "model": {
        "input_shape": [2, 8, 8],
        "layers": [
            {"kind": "conv2d", "filters": 3, "kernel": 3, "stride": 1, "padding": "same", "activation": "relu"},
            {"kind": "batch_norm", "momentum": 0.1, "eps": 1e-5, "running_var": "unbiased"},
            {"kind": "flatten"},
            {"width": 3},
        ],
    },
    "init": {"weights": "glorot_uniform", "biases": "zeros", "seed": 1},
    "loss": {"kind": "cross_entropy", "reduction": "mean"},
    "optimizer": {"kind": "sgd", "lr": 0.05},
    "training": {"epochs": 9, "batch_size": 8, "shuffle": True, "shuffle_seed": 1, "last_batch": "keep"},
    "logging": {"loss_every": 1, "print_every": 1000},
    "checks": {"params_after_steps": {"step": 10}, "math_parity": {"steps": 30, "every": 30}},
    "timing": {"repeats": 1},
}


def test_a_late_batch_norm_statistics_slip_is_caught_at_its_segments_end(monkeypatch):
    """A torch whose batch norm's momentum doubles from update 40 changes no training loss:
    the first steps' twin and every re-anchored loss curve pass. The re-anchored twin's
    tensors at the end of the segment from step 30 (its running statistics) and its
    evaluation-mode outputs there fail, diagnosed implementation with the layer named; the
    honest twins pass both at every segment's end."""
    torch_adapter = pytest.importorskip("adapters.torch_adapter")
    from tests import family, test_injected_bugs

    with monkeypatch.context() as m:
        m.setitem(test_injected_bugs.BUGGY, "torch_late_bn", ("torch", {"_train_step": late_bn_momentum(torch_adapter._train_step)}))
        result = run_with_copies(family.loaded(BATCH_NORM_NET), ["torch_late_bn"])
    checks = {(c.a.label, c.name): c for c in result.checks if c.b == ORACLE_KEY}
    late = "torch_late_bn@cpu+float64"
    for name in ("math_params_after_step_10", "math_loss_curve", "math_anchored_loss_curve"):
        assert checks[late, name].verdict == CheckVerdict.PASS, checks[late, name]
    state, outputs = checks[late, "math_anchored_state"], checks[late, "math_anchored_outputs"]
    assert state.verdict == CheckVerdict.FAIL and state.segment == 30 and state.tensor.startswith("bn1.running_")
    assert state.diagnosis.startswith("implementation") and "re-anchored at step 30" in state.diagnosis and "in bn1.running_" in state.diagnosis
    assert outputs.verdict == CheckVerdict.FAIL and outputs.segment == 30
    for framework in ("torch", "jax", "numpy"):
        for name in ("math_anchored_state", "math_anchored_outputs"):
            honest = checks.get((f"{framework}@cpu+float64", name))
            assert honest is not None and honest.verdict == CheckVerdict.PASS, honest


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("recipe", ["sgd_momentum", "adamw"])
def test_each_adapter_gives_back_its_whole_training_state_by_the_specs_names(framework, recipe):
    """training_state is load_state's inverse: loaded from the oracle's state at step 9 and
    trained 6 steps, each twin's tensors and optimizer moments (Adam's m and v, SGD's
    momentum buffer) carry the oracle's names and are the oracle's own to float64 rounding."""
    problem = inputs.truncated(inputs.build_problem(load_spec("specs/moons_net.yaml", "quick", RECIPES[recipe])), START + STEPS)
    oracle = registry.load("numpy")
    reference = oracle.build(problem, oracle.put(problem, ORACLE_KEY), ORACLE_KEY)
    oracle.train(reference, 0, START)
    state = oracle.training_state(reference)
    oracle.train(reference, START, START + STEPS)
    want = oracle.training_state(reference)
    adapter, trainer = went_on(framework, problem, state)
    got = adapter.training_state(trainer)
    assert sorted(got) == sorted(want) and any("/" in name for name in want)
    for name, a in want.items():
        assert got[name].shape == a.shape and np.max(np.abs(got[name] - a)) <= 1e-12 * max(np.max(np.abs(a)), 1e-300), name


@pytest.mark.parametrize("recipe", ["adamw_warmup_cosine", "rmsprop_momentum_schedule", "sgd_clipped"])
def test_a_jax_twins_segments_compile_once_and_train_as_a_trainer_built_for_each(recipe, monkeypatch):
    """JAX's re-anchored twin builds its trainer again for each segment (BuildsAgain) with the
    first one's jitted step, so the step compiles once, not once a segment, and outside the
    segments' timed training (warmed up first, as every timed run is); its segments' losses,
    end states and outputs are bit for bit those of a trainer built anew for each segment
    (optax's counts, moments, schedules and clipping all loaded by load_state)."""
    jax_adapter = pytest.importorskip("adapters.jax_adapter")
    from harness.run import anchored

    loaded = load_spec("specs/moons_net.yaml", "quick", {**RECIPES[recipe], "checks": {"math_parity": {"steps": 4}}})
    problem = inputs.truncated(inputs.build_problem(loaded), 16)
    oracle = registry.load("numpy")
    reference = oracle.build(problem, oracle.put(problem, ORACLE_KEY), ORACLE_KEY)
    states = {}
    for start, stop in ((0, 4), (4, 8), (8, 12)):
        oracle.train(reference, start, stop)
        states[stop] = oracle.training_state(reference)
    key = RunKey("jax", "cpu", precision=FLOAT64, variant="anchored")
    if jax_adapter.unavailable(key):
        pytest.skip(jax_adapter.unavailable(key))
    made = []
    functions = jax_adapter._functions
    monkeypatch.setattr(jax_adapter, "_functions", lambda p, dtype, compute=None: made.append(p) or functions(p, dtype, compute))
    again = anchored.run_segments(problem, key, states)
    assert again.status == "ok" and len(made) == 1, (again.reason, len(made))
    without = types.SimpleNamespace(**{n: getattr(jax_adapter, n) for n in dir(jax_adapter) if not n.startswith("_") and n != "build_again"})
    monkeypatch.setattr(anchored, "prepared_adapter", lambda k: (without, None))
    anew = anchored.run_segments(problem, key, states)
    assert anew.status == "ok" and len(made) == 1 + len(states)
    assert sorted(again.segments) == sorted(anew.segments) == [4, 8, 12]
    for start in states:
        assert again.segments[start].tobytes() == anew.segments[start].tobytes()
        assert again.segment_outputs[start].tobytes() == anew.segment_outputs[start].tobytes()
        assert sorted(again.segment_ends[start]) == sorted(anew.segment_ends[start])
        assert all(again.segment_ends[start][n].tobytes() == anew.segment_ends[start][n].tobytes() for n in anew.segment_ends[start])
