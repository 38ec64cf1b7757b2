"""Training recipes (harness/optimizers/): each adapter's translation into torch.optim
and optax computes the spec's math, in float64, against the oracle; and the evidence of the
catalogued library differences (harness/known_differences.yaml): for each, the oracle
changed by the catalogued formula agrees with that library's float64 twin, and the oracle
as specified does not."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from harness.calibrate import roles
from harness.core import registry
from harness.core.errors import SpecError
from harness.core.registry import FLOAT64, RunKey
from harness.inputs import library
from harness.inputs import problem as inputs
from harness.optimizers.recipe import StepDecay, WarmupCosine
from harness.spec import catalogue
from harness.spec.load import load_spec

STEPS = 24
ADAM = {"kind": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
RMSPROP = {"kind": "rmsprop", "lr": 0.003, "alpha": 0.99, "eps": 1e-8}
COSINE = {"kind": "warmup_cosine", "warmup_steps": 5, "decay_steps": 20, "init_fraction": 0.0, "end_fraction": 0.01}
RECIPES = {
    "sgd_momentum": {"optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}},
    "sgd_nesterov_decay": {"optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}},
    "sgd_dampening": {"optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.1}},
    "adam_coupled_decay": {"optimizer": {**ADAM, "weight_decay": 1e-2}},
    "adamw": {"optimizer": {**ADAM, "kind": "adamw", "weight_decay": 1e-2}},
    "sgd_clipped": {"optimizer": {"kind": "sgd", "lr": 0.2, "clip_global_norm": 0.05}},
    "sgd_step_schedule": {"optimizer": {"kind": "sgd", "lr": 0.2, "schedule": {"kind": "step", "every": 7, "gamma": 0.5}}},
    "adamw_warmup_cosine": {"optimizer": {**ADAM, "kind": "adamw", "weight_decay": 1e-2, "schedule": COSINE}},
    "label_smoothing": {"loss": {"kind": "cross_entropy", "reduction": "mean", "label_smoothing": 0.1}},
    "rmsprop": {"optimizer": RMSPROP},
    "rmsprop_momentum_decay": {"optimizer": {**RMSPROP, "alpha": 0.9, "momentum": 0.9, "weight_decay": 1e-3}},
    "rmsprop_momentum_schedule": {"optimizer": {**RMSPROP, "momentum": 0.5, "schedule": {"kind": "step", "every": 7, "gamma": 0.5}}},
}
# Where a framework's float64 twin is expected to differ: the catalogued library difference.
CATALOGUED = {
    ("torch", "sgd_clipped"): "torch-clip-grad-norm-eps",
    ("jax", "sgd_dampening"): "optax-sgd-no-dampening",
    ("jax", "sgd_step_schedule"): "optax-schedule-float32",
    ("jax", "adamw_warmup_cosine"): "optax-schedule-float32",
    ("jax", "rmsprop_momentum_schedule"): "optax-schedule-float32",
}
AGREE = 1e-12  # float64 rounding over 24 steps of moons (measured: 4e-16 to 3e-14)
APART = 1e-9  # the smallest catalogued difference here (optax's float32 step schedule: 2e-8)


def problem_of(recipe: str):
    loaded = load_spec("specs/moons_net.yaml", "quick", RECIPES[recipe])
    return inputs.truncated(inputs.build_problem(loaded), STEPS)


def trained(framework: str, problem) -> tuple[np.ndarray, dict]:
    adapter = registry.load(framework)
    key = RunKey(framework, "cpu", precision=FLOAT64)
    if adapter.unavailable(key):
        pytest.skip(adapter.unavailable(key))
    trainer = adapter.build(problem, adapter.put(problem, key), key)
    adapter.train(trainer, 0, STEPS)
    state = adapter.state(trainer, STEPS)
    return np.asarray(state.losses), {k: np.asarray(v, np.float64) for k, v in state.params.items()}


def apart(a: tuple[np.ndarray, dict], b: tuple[np.ndarray, dict]) -> float:
    """The largest relative difference of the loss curves and of the final tensors."""
    curve = float(np.max(np.abs(a[0] - b[0]) / np.abs(b[0])))
    tensors = max(float(np.linalg.norm(a[1][k] - w) / np.linalg.norm(w)) for k, w in b[1].items())
    return max(curve, tensors)


@pytest.fixture(scope="module")
def oracle_runs():
    return {recipe: trained("numpy", problem_of(recipe)) for recipe in RECIPES}


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_each_recipe_is_the_specs_math_or_a_catalogued_difference(framework, recipe, oracle_runs):
    distance = apart(trained(framework, problem_of(recipe)), oracle_runs[recipe])
    if (framework, recipe) in CATALOGUED:
        assert distance > APART, f"{CATALOGUED[framework, recipe]} no longer shows ({distance:.3g}): drop the entry"
    else:
        assert distance < AGREE


def catalogued_formula(entry_id: str):
    return next(e.formula for e in catalogue.library_differences() if e.id == entry_id)


@pytest.mark.parametrize(
    ("framework", "recipe"),
    list(CATALOGUED),
)
def test_the_oracle_computing_the_catalogued_formula_is_the_librarys_twin(framework, recipe, oracle_runs):
    """torch's clipping scales by max_norm / (norm + 1e-6), clamped at 1; optax's momentum
    has no dampening; optax's schedules give float32 rates (RMSprop's too): the oracle computing the entry's
    `formula` (library.library_problem, with the rates optax computes: roles.resolved; what that
    framework's twin is judged against) agrees with its float64 twin to rounding."""
    problem = problem_of(recipe)
    twin = trained(framework, problem)
    if framework == "jax":
        pytest.importorskip("optax")
    formula = roles.resolved(catalogued_formula(CATALOGUED[framework, recipe]), problem)
    as_library = trained("numpy", library.library_problem(problem, formula))
    assert apart(twin, as_library) < AGREE < APART < apart(twin, oracle_runs[recipe])


@pytest.mark.parametrize("recipe", ["sgd_step_schedule", "adamw_warmup_cosine"])
def test_optax_schedules_are_the_oracles_rounded_to_float32(recipe, monkeypatch, oracle_runs):
    """The oracle at optax's own schedule values (float32 under x64) agrees with JAX's twin."""
    optax = pytest.importorskip("optax")
    problem = problem_of(recipe)
    jax_run = trained("jax", problem)
    opt = problem.spec.optimizer
    values = _optax_rates(optax, opt)
    monkeypatch.setattr(type(opt), "lr_at", lambda self, t: values[t])
    at_optax_rates = trained("numpy", problem)
    assert apart(jax_run, at_optax_rates) < AGREE < APART < apart(jax_run, oracle_runs[recipe])


def _optax_rates(optax, opt) -> list[float]:
    import jax
    import jax.numpy as jnp

    s = opt.schedule
    if s.kind == "step":
        f = optax.exponential_decay(opt.lr, transition_steps=s.every, decay_rate=s.gamma, staircase=True)
    else:
        f = optax.warmup_cosine_decay_schedule(opt.lr * s.init_fraction, opt.lr, s.warmup_steps, s.decay_steps, opt.lr * s.end_fraction)
    return [float(jax.jit(f)(jnp.int32(t))) for t in range(STEPS)]  # jitted, as inside the update


@pytest.mark.parametrize(
    ("recipe", "alias"),
    [
        ("rmsprop", {}),  # optax.rmsprop's default: eps inside the square root
        ("rmsprop_momentum_schedule", {"eps_in_sqrt": False}),  # the rate inside the momentum trace
    ],
)
def test_optax_rmsprop_alias_is_not_torchs_rmsprop_its_parts_are(recipe, alias, monkeypatch, oracle_runs):
    """Why adapters/jax_adapter.py builds RMSprop from optax's parts: optax.rmsprop with the
    spec's decay and eps puts eps inside the square root by default, and applies the rate
    before its momentum trace, where torch.optim.RMSprop (the spec) multiplies the buffer
    by the current rate; each differs in float64. Its parts, chained as the adapter chains
    them, are the spec's math (test_each_recipe_is_the_specs_math_or_a_catalogued_difference)."""
    pytest.importorskip("optax")
    from adapters import jax_adapter
    from tests.recipe_bugs import rmsprop_alias

    problem = problem_of(recipe)
    monkeypatch.setitem(jax_adapter.OPTIMIZERS, "rmsprop", functools.partial(rmsprop_alias, **alias))
    as_alias = trained("jax", problem)
    if recipe == "rmsprop_momentum_schedule":  # optax's float32 rates aside (optax-schedule-float32)
        formula = roles.resolved(catalogued_formula("optax-schedule-float32"), problem)
        reference = trained("numpy", library.library_problem(problem, formula))
    else:
        reference = oracle_runs[recipe]
    assert apart(as_alias, reference) > APART
    monkeypatch.undo()
    assert apart(trained("jax", problem), reference) < AGREE


def test_schedules_are_torchs_and_optaxs():
    """The spec's multipliers against torch's StepLR and optax's schedules (float32: 1e-6)."""
    torch = pytest.importorskip("torch")
    optax = pytest.importorskip("optax")
    import jax.numpy as jnp

    step = StepDecay(kind="step", every=3, gamma=0.7)
    cosine = WarmupCosine(**COSINE)
    param = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([param], lr=1.0)
    step_lr = torch.optim.lr_scheduler.StepLR(sgd, step_size=3, gamma=0.7)
    torch_rates = []
    for _ in range(30):
        torch_rates.append(sgd.param_groups[0]["lr"])
        sgd.step()
        step_lr.step()
    np.testing.assert_allclose([step.factor(t) for t in range(30)], torch_rates, rtol=1e-12)
    f = optax.warmup_cosine_decay_schedule(0.0, 1.0, COSINE["warmup_steps"], COSINE["decay_steps"], COSINE["end_fraction"])
    np.testing.assert_allclose([cosine.factor(t) for t in range(30)], [float(f(jnp.int32(t))) for t in range(30)], rtol=1e-6, atol=1e-7)
    assert cosine.factor(0) == 0.0 and cosine.factor(5) == 1.0 and cosine.factor(25) == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"optimizer": {"kind": "sgd", "lr": 0.1, "nesterov": True}}, "nesterov"),
        ({"optimizer": {"kind": "sgd", "lr": 0.1, "dampening": 0.5}}, "dampening"),
        ({"optimizer": {**ADAM, "kind": "adamw"}}, "weight_decay"),
        ({"optimizer": {**ADAM, "schedule": {**COSINE, "decay_steps": 5}}}, "decay_steps"),
        ({"optimizer": {**ADAM, "clip_global_norm": 0}}, "clip_global_norm"),
    ],
)
def test_a_recipe_that_cannot_be_trained_is_refused_naming_its_key(extra, message):
    with pytest.raises(SpecError, match=message):
        load_spec("specs/moons_net.yaml", "quick", extra)


def test_label_smoothing_needs_classes():
    with pytest.raises(SpecError, match="label_smoothing"):
        load_spec("specs/peaks_mlp.yaml", "quick", {"loss": {"kind": "mse", "reduction": "mean", "label_smoothing": 0.1}})


def test_an_optimizer_kind_a_library_lacks_is_an_error_never_another_kinds_update(monkeypatch):
    """A kind an adapter's table lacks is refused, in torch, JAX and the allocation-free
    path alike, and a kind the registry lacks is a ValueError: none trains as SGD."""
    from adapters import jax_adapter, torch_adapter, torch_optim, xp_fast
    from harness import optimizers
    from harness.core.errors import Unsupported

    problem = problem_of("rmsprop")
    monkeypatch.delitem(torch_optim.OPTIMIZERS, "rmsprop")
    with pytest.raises(Unsupported, match="rmsprop"):
        torch_adapter._optimizer(
            pytest.importorskip("torch"),
            problem.spec,
            torch_adapter.torch_layers.network(torch_adapter._torch(), problem.spec, problem.initial_params, "cpu", torch_adapter._torch().float32),
        )
    monkeypatch.delitem(jax_adapter.OPTIMIZERS, "rmsprop")
    with pytest.raises(Unsupported, match="rmsprop"):
        jax_adapter.transformation(problem.spec.optimizer)
    assert not problem.spec.optimizer.plain  # the fast paths never take it, and if handed it:
    params = [(np.zeros((2, 2), np.float32), np.zeros(2, np.float32))]
    with pytest.raises(ValueError, match="rmsprop"):
        xp_fast.FastMLP(np, problem, {}, params, "float32", np.zeros(STEPS, np.float32))
    monkeypatch.delitem(optimizers.KINDS, "rmsprop")
    with pytest.raises(ValueError, match="rmsprop"):
        optimizers.rule(problem.spec.optimizer)
