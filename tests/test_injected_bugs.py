"""A check that cannot fail is a defect: known implementation bugs, injected into copies of
the real adapters, must be reported by the harness as failed checks against the oracle,
while the correct adapters in the same matrix pass.

Each buggy adapter is a fresh module executed from a real adapter's source file (so its
functions look their helpers up in the copy, not in the original) with one global
replaced (for the NumPy bug, its `network`: itself a fresh copy of
harness/reference/network.py whose optimizer registry hands it an Adam with its update
replaced, since that module's train_step calls it). It is registered under its own name in harness.core.registry.ADAPTERS and in
sys.modules while its matrix runs, and goes through harness.matrix.run_cells like any
other framework. Two matrices are run once per module and shared by the tests: peaks
(Adam, chaotic after a few dozen steps) and a shortened moons (plain gradient descent).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import sys
import types
from contextlib import contextmanager
from itertools import combinations

import pytest
from rich.console import Console

from adapters import torch_layers
from harness import optimizers
from harness.core import registry
from harness.core.paths import SPECS_DIR
from harness.core.registry import CALIBRATION_KEY, FLOAT64, ORACLE_KEY, RunKey
from harness.execute.plan import matrix_keys
from harness.inputs.problem import build_problem
from harness.matrix import SpecResult, run_cells
from harness.optimizers import adam
from harness.reference import network
from harness.spec import catalogue
from harness.spec.load import LoadedSpec, load_spec, parse_document, validate_document
from harness.verdict.checks import Check
from tests.layer_bugs import JAX_LAYER_BUGS, JAX_TEXT_BUGS, LAYER_BUGS, TEXT_BUGS
from tests.recipe_bugs import JAX_RECIPE_BUGS, RECIPE_BUGS

# Both matrices snapshot the parameters after step 10 (peaks quick, and MOONS_SHORT below).
SHORT_HORIZON = ("initial_outputs", "initial_loss", "params_after_step_1", "params_after_step_10")
REAL = tuple(f for f in registry.ADAPTERS if registry.runs_on(f, "cpu"))  # the honest adapters
TEST_PROFILE = "injected_bugs"
# moons quick (1,000 points) stopped after 20 steps: the float64 oracle costs ~0.1 s a step.
MOONS_SHORT = {"training": {"epochs": 20}, "checks": {"params_after_steps": {"step": 10}}}


# --- the injected bugs --------------------------------------------------------------------


def denominator_eps_inside_sqrt(xp, v_hat, eps):
    """The bug: eps under the square root, sqrt(v_hat + eps), instead of sqrt(v_hat) + eps."""
    return xp.sqrt(v_hat + eps)


def module_copy(name: str) -> types.ModuleType:
    """A fresh module executed from module `name`'s source file: its functions look their
    helpers up in the copy, so a global replaced there is the one they call."""
    origin = importlib.util.find_spec(name).origin
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(f"injected_bugs_{name.replace('.', '_')}", origin))
    module.__spec__.loader.exec_module(module)
    return module


def network_eps_inside_sqrt() -> types.ModuleType:
    """harness.reference.network whose Adam update (called by its train_step) puts eps inside the square root."""
    copy = module_copy(network.__name__)
    buggy = types.SimpleNamespace(**{**vars(adam), "update": functools.partial(adam.update, denominator=denominator_eps_inside_sqrt)})
    copy.optimizers = types.SimpleNamespace(rule=lambda opt: buggy if opt.kind == "adam" else optimizers.rule(opt))
    return copy


def torch_loss_summed(torch, spec, model, n_examples, outputs, targets):
    """torch_adapter._loss with the data term summed over the batch instead of averaged."""
    real = registry.load("torch")
    summed = spec.model_copy(update={"reduction": "sum"})
    return real._loss(torch, summed, model, n_examples, outputs, targets)


def torch_loss_scaled(torch, spec, model, n_examples, outputs, targets):
    """torch_adapter._loss times 1 + 1e-6: a real change of the objective, far below what
    float32 resolves in these specs' checks."""
    return registry.load("torch")._loss(torch, spec, model, n_examples, outputs, targets) * (1 + 1e-6)


def torch_layers_low_precision(low: str) -> types.SimpleNamespace:
    """adapters.torch_layers whose network's Linear layers multiply in `low` (bfloat16,
    float16) and cast the product back: what TF32 or autocast would do to the float32 matmul."""

    def network(torch, spec, params, dev, dtype):
        model = torch_layers.network(torch, spec, params, dev, dtype)
        low_dtype = getattr(torch, low)

        def forward(self, x):
            return (x.to(low_dtype) @ self.weight.to(low_dtype).T).to(x.dtype) + self.bias

        linears = [layer for layer in model.modules() if isinstance(layer, torch.nn.Linear)]
        assert linears, "the torch network holds no Linear layer to make low-precision"
        for layer in linears:
            layer.forward = types.MethodType(forward, layer)
        return model

    return types.SimpleNamespace(**{**vars(torch_layers), "network": network})


# name -> (real adapter, the globals the copy gets instead of the real ones)
MLP_BUGS = {
    "numpy_eps_inside": ("numpy", {"network": network_eps_inside_sqrt()}),
    "torch_loss_sum": ("torch", {"_loss": torch_loss_summed}),
    "torch_matmul_bfloat16": ("torch", {"torch_layers": torch_layers_low_precision("bfloat16")}),
    "torch_matmul_float16": ("torch", {"torch_layers": torch_layers_low_precision("float16")}),
    "torch_loss_scaled": ("torch", {"_loss": torch_loss_scaled}),
}
# The porting bugs of the other layer kinds (tests/layer_bugs.py): the generated family's.
BUGGY = {
    **MLP_BUGS,
    **{name: ("torch", {"torch_layers": copy}) for name, (copy, _) in LAYER_BUGS.items()},
    **{name: ("jax", {"jax_layers": copy}) for name, (copy, _) in JAX_LAYER_BUGS.items()},
    **{name: ("torch", {"torch_layers": copy}) for name, (copy, _) in TEXT_BUGS.items()},
    **{name: ("jax", {"jax_layers": copy}) for name, (copy, _) in JAX_TEXT_BUGS.items()},
    # and the recipe bugs (tests/recipe_bugs.py)
    **{name: ("torch", overrides) for name, (overrides, _) in RECIPE_BUGS.items()},
    **{name: ("jax", overrides) for name, (overrides, _) in JAX_RECIPE_BUGS.items()},
}
LOW_PRECISION = ("torch_matmul_bfloat16", "torch_matmul_float16")


# --- building and running the matrices ----------------------------------------------------


def register_copy(monkeypatch: pytest.MonkeyPatch, name: str, real: str, overrides: dict) -> None:
    """Execute adapter `real`'s source as a new module, replace `overrides` in it, and
    register it as adapter `name` until `monkeypatch` is undone."""
    origin = importlib.util.find_spec(registry.ADAPTERS[real]).origin
    module_path = f"injected_bugs_{name}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(module_path, origin))
    monkeypatch.setitem(sys.modules, module_path, module)  # dataclasses look their module up there
    module.__spec__.loader.exec_module(module)
    module.NAME = name
    for attr, value in overrides.items():
        assert hasattr(module, attr), f"adapter {real} has no {attr} to replace"
        setattr(module, attr, value)
    monkeypatch.setitem(registry.ADAPTERS, name, module_path)


def shortened_spec(name: str, extra: dict) -> LoadedSpec:
    """The quick profile of a spec with `extra` merged on top, validated by the same rules
    as a profile written in the file."""
    path = SPECS_DIR / f"{name}.yaml"
    doc = parse_document(path, path.read_text())
    doc["profiles"][TEST_PROFILE] = _merge(doc["profiles"]["quick"], extra)
    spec, overrides = validate_document(path, doc, TEST_PROFILE)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return LoadedSpec(spec=spec, path=path, sha256=sha, profile=TEST_PROFILE, overrides=overrides)


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merge(merged[key], value) if nested else value
    return merged


@contextmanager
def torch_single_threaded():
    """On 2 cores, torch's CPU step gets ~30x slower once JAX has run in the same process
    after torch did (two spinning thread pools); one torch thread avoids it. Results are
    compared to tolerances far above what the thread count changes."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_with_copies(loaded: LoadedSpec, buggy: list[str], problem=None) -> SpecResult:
    """The spec through every real adapter and the buggy copies. A copy is its library with
    one bug: the library's catalogued differences (harness/known_differences.yaml) are its
    too, so that what it is judged on is its bug."""
    with pytest.MonkeyPatch.context() as monkeypatch, torch_single_threaded():
        entries = catalogue.library_differences()
        inherited = tuple(e.model_copy(update={"framework": name}) for name in buggy for e in entries if e.framework == BUGGY[name][0])
        monkeypatch.setattr(catalogue, "library_differences", lambda: entries + inherited)
        for name in buggy:
            real, overrides = BUGGY[name]
            register_copy(monkeypatch, name, real, overrides)
        keys = matrix_keys([*REAL, *buggy], ["cpu"])
        problem = build_problem(loaded) if problem is None else problem
        return run_cells(loaded, problem, keys, None, Console(file=io.StringIO()), repeats=1)


@pytest.fixture(scope="module")
def peaks() -> SpecResult:
    return run_with_copies(load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick"), list(MLP_BUGS))


@pytest.fixture(scope="module")
def moons() -> SpecResult:
    return run_with_copies(shortened_spec("moons_net", MOONS_SHORT), ["torch_loss_sum", "torch_loss_scaled", *LOW_PRECISION])


# --- reading the results ------------------------------------------------------------------


def require(result: SpecResult, framework: str) -> None:
    """Skip where the real framework is missing; otherwise the run must have finished."""
    outcome = result.outcomes[RunKey(framework, "cpu")]
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.status == "ok", f"{framework}: {outcome.status}: {outcome.reason}"


def against_oracle(result: SpecResult, framework: str, precision: str = "strict") -> dict[str, Check]:
    key = RunKey(framework, "cpu", precision=precision)
    found = {c.name: c for c in result.checks if c.a == key and c.b == ORACLE_KEY}
    assert found, f"no checks of {framework} against the oracle"
    return found


def verdicts(checks: dict[str, Check], names) -> dict[str, str]:
    return {name: checks[name].verdict for name in names}


def summary(checks: dict[str, Check]) -> str:
    return "; ".join(f"{c.name} {c.verdict} (abs {c.max_abs_error}, rel {c.max_rel_error})" for c in checks.values())


# --- the tests ----------------------------------------------------------------------------


def test_adam_eps_inside_the_square_root_fails_the_update_checks(peaks):
    require(peaks, "numpy_eps_inside")
    checks = against_oracle(peaks, "numpy_eps_inside")
    # The forward pass is untouched: step 0 agrees.
    passing = ["initial_outputs", "initial_loss"]
    assert verdicts(checks, passing) == dict.fromkeys(passing, "pass"), summary(checks)
    # The first update already moves small-gradient weights by lr * eps / (2 g^2) too little.
    failing = ["params_after_step_1", "params_after_step_10", "loss_curve_horizon"]
    assert verdicts(checks, failing) == dict.fromkeys(failing, "fail"), summary(checks)
    assert checks["loss_curve_horizon"].horizon_steps < peaks.loaded.spec.checks.loss_curve.must_hold_for
    # The same code with the correct update, in the same matrix, passes them all.
    calibration = against_oracle(peaks, CALIBRATION_KEY.framework)
    names = [*SHORT_HORIZON, "loss_curve_horizon"]
    assert verdicts(calibration, names) == dict.fromkeys(names, "pass"), summary(calibration)


@pytest.mark.parametrize("result_name", ["moons", "peaks"])
def test_summed_loss_fails_initial_loss(result_name, request):
    result = request.getfixturevalue(result_name)
    require(result, "torch")
    require(result, "torch_loss_sum")
    checks = against_oracle(result, "torch_loss_sum")
    assert checks["initial_outputs"].verdict == "pass", summary(checks)
    assert checks["initial_loss"].verdict == "fail", summary(checks)
    assert checks["loss_curve_horizon"].first_failure_step == 0, summary(checks)
    real = against_oracle(result, "torch")
    assert verdicts(real, SHORT_HORIZON) == dict.fromkeys(SHORT_HORIZON, "pass"), summary(real)


def test_summed_loss_under_gradient_descent_fails_the_update_checks(moons):
    # SGD steps scale with the loss (N times too far here); Adam's would not, so on peaks
    # only the loss checks see this bug.
    require(moons, "torch_loss_sum")
    checks = against_oracle(moons, "torch_loss_sum")
    failing = ["params_after_step_1", "params_after_step_10", "loss_curve_envelope", "final_outputs"]
    assert verdicts(checks, failing) == dict.fromkeys(failing, "fail"), summary(checks)


@pytest.mark.parametrize("result_name", ["peaks", "moons"])
@pytest.mark.parametrize("buggy", LOW_PRECISION)
def test_low_precision_matmul_fails_initial_outputs(buggy, result_name, request):
    result = request.getfixturevalue(result_name)
    require(result, "torch")
    require(result, buggy)
    checks = against_oracle(result, buggy)
    failing = ["initial_outputs", "initial_loss"]
    assert verdicts(checks, failing) == dict.fromkeys(failing, "fail"), summary(checks)
    real = against_oracle(result, "torch")
    assert verdicts(real, SHORT_HORIZON) == dict.fromkeys(SHORT_HORIZON, "pass"), summary(real)


def real_pairs(result: SpecResult) -> list[Check]:
    """The checks between two real runs (the oracle, the calibration and every framework
    that ran), leaving the buggy copies out."""
    keys = {k for k, o in result.outcomes.items() if o.status == "ok" and k.framework not in BUGGY}
    assert ORACLE_KEY in keys and CALIBRATION_KEY in keys, "the oracle and the calibration run must run"
    pairs = {frozenset(pair) for pair in combinations(keys, 2)}
    return [c for c in result.checks if frozenset((c.a, c.b)) in pairs]


def failures(checks: list[Check], allowed: tuple[str, ...]) -> list[str]:
    return [
        f"{c.a.label} vs {c.b.label}: {c.name} {c.verdict} (abs {c.max_abs_error}, rel {c.max_rel_error})" for c in checks if c.verdict not in allowed
    ]


def test_real_adapters_pass_the_short_horizon_on_peaks(peaks):
    """Control: the correct adapters agree over the short horizon, but for JAX's known optax
    difference. (The long-run envelope is not asserted: Adam at lr 0.08 is chaotic.)"""
    checks = [c for c in real_pairs(peaks) if c.name in (*SHORT_HORIZON, "loss_curve_horizon")]
    assert checks and not failures(checks, ("pass", "known"))
    # The calibrated step-1 check sees optax's float32 bias corrections (a library entry).
    known = [c for c in checks if c.verdict == "known"]
    assert all("jax" in (c.a.framework, c.b.framework) and "optax-adam" in c.diagnosis for c in known)


def test_real_adapters_pass_every_check_on_moons(moons):
    """Control: gradient descent on moons is not chaotic, so every check, the envelope
    included, passes between the correct runs (the calibration pair skips the envelope)."""
    checks = real_pairs(moons)
    assert not failures(checks, ("pass", "skipped"))
    skipped = {c.name for c in checks if c.verdict == "skipped" and {c.a, c.b} != {CALIBRATION_KEY, ORACLE_KEY}}
    assert not skipped, skipped


@pytest.mark.parametrize("result_name", ["peaks", "moons"])
def test_a_one_in_a_million_change_of_the_loss_is_caught_by_math_parity_alone(result_name, request):
    """The objective scaled by 1 + 1e-6: below what float32 resolves here, so every float32
    check passes (an honest rounding would look the same), while the float64 twin differs
    from the oracle by 1e8 times its calibrated tolerance at step 0: different math."""
    result = request.getfixturevalue(result_name)
    require(result, "torch_loss_scaled")
    float32 = against_oracle(result, "torch_loss_scaled")
    assert all(c.verdict == "pass" for c in float32.values()), summary(float32)
    parity = against_oracle(result, "torch_loss_scaled", FLOAT64)
    assert parity["math_initial_loss"].verdict == "fail" and parity["math_initial_loss"].ratio > 1e6, summary(parity)
    assert parity["math_initial_outputs"].verdict == "pass"  # the forward pass is untouched
    assert parity["math_initial_loss"].diagnosis.startswith("implementation: the float64 twin differs from the oracle")
    real = against_oracle(result, "torch", FLOAT64)
    assert all(c.verdict == "pass" for c in real.values()), summary(real)


@pytest.mark.parametrize("result_name", ["peaks", "moons"])
def test_every_injected_bug_is_diagnosed_as_implementation(result_name, request):
    """Each buggy copy fails math parity, and each of its failing float32 checks says so."""
    result = request.getfixturevalue(result_name)
    buggy = sorted({k.framework for k in result.outcomes if k.framework in BUGGY})
    assert buggy
    for name in buggy:
        require(result, name)
        parity = against_oracle(result, name, FLOAT64)
        assert any(c.verdict == "fail" for c in parity.values()), f"{name}: {summary(parity)}"
        failing = [c for c in against_oracle(result, name).values() if c.verdict == "fail"]
        assert all(c.diagnosis.startswith(f"implementation: the float64 twin of {name}@cpu") for c in failing), name


def test_honest_adapters_pass_math_parity(peaks, moons):
    for result in (peaks, moons):
        for framework in REAL:
            require(result, framework)
            parity = against_oracle(result, framework, FLOAT64)
            assert parity and all(c.verdict == "pass" for c in parity.values()), summary(parity)
