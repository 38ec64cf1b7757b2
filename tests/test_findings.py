"""Evidence for the known differences (harness/known_differences.yaml) and for the
calibration: runs that differ only in summation order stay inside every calibrated check."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from harness.calibrate import roles, spread
from harness.core.paths import SPECS_DIR
from harness.core.registry import CALIBRATION_KEY, ORACLE_KEY, RunKey
from harness.execute import jobs
from harness.inputs import members
from harness.inputs import problem as inputs
from harness.layers import dense
from harness.optimizers import adam
from harness.reference import network
from harness.run import runner
from harness.spec.load import load_spec
from harness.verdict import checks, rules
from tests.conftest import quick_problem

STEPS = 40

pytestmark = pytest.mark.slow  # the evidence runs take minutes: `nox -s slow`


def float32_bias_corrections(opt, t):
    """1 - beta^t computed as optax does: in float32, with beta rounded to float32."""
    one = np.float32(1)
    return one - np.float32(opt.beta1) ** np.float32(t), one - np.float32(opt.beta2) ** np.float32(t)


def early_curve(problem, key):
    outcome = runner.run(problem, key)
    assert outcome.status == "ok", outcome.reason
    return outcome.losses[:STEPS]


def test_optax_float32_bias_correction_explains_the_jax_drift_on_peaks(monkeypatch):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    problem = quick_problem("peaks_mlp")
    jax_curve = early_curve(problem, RunKey("jax", "cpu"))
    oracle = early_curve(problem, ORACLE_KEY)
    reference32 = early_curve(problem, RunKey("numpy", "cpu"))
    like_optax_adam = functools.partial(adam.update, corrections=float32_bias_corrections)
    monkeypatch.setattr(adam, "update", like_optax_adam)
    like_optax = early_curve(problem, RunKey("numpy", "cpu"))

    def rel(a, b):
        return float(np.max(np.abs(a - b) / np.abs(b)))

    # JAX leaves the oracle more than ten times faster than float32 rounding alone does ...
    assert rel(jax_curve, oracle) > 10 * rel(reference32, oracle)
    # ... and the same array-module code, given optax's float32 bias correction, follows JAX
    # at the level of float32 rounding.
    assert rel(like_optax, jax_curve) < 0.1 * rel(jax_curve, oracle)
    assert rel(like_optax, jax_curve) < 1e-6


def test_inductor_sums_the_moons_cross_entropy_with_fewer_partial_sums():
    """torch.compile's mean of the 5,000 per-example losses is what leaves the envelope on
    moons (fast mode), not the per-example values: those are as accurate as eager torch's."""
    torch = pytest.importorskip("torch")
    from harness.core.paths import SPECS_DIR
    from harness.inputs import problem as inputs
    from harness.spec.load import load_spec

    problem = inputs.build_problem(load_spec(SPECS_DIR / "moons_net.yaml", "bench"))  # the full 5,000 points
    params = problem.initial_params
    w1, b1, w2, b2 = (params[name] for name in ("dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias"))
    x, y = problem.x_train.astype(np.float32), problem.y_train
    outputs = np.tanh(x.astype(np.float64) @ w1 + b1) @ w2 + b2
    per_example64 = -network.log_softmax(np, outputs)[np.arange(len(y)), y]
    W1, B1, W2, B2 = (torch.from_numpy(a) for a in (w1, b1, w2, b2))

    def cross_entropy(x, y, reduction):
        return torch.nn.functional.cross_entropy(torch.tanh(x @ W1 + B1) @ W2 + B2, y, reduction=reduction)

    compiled = torch.compile(cross_entropy, dynamic=False)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    per_eager = cross_entropy(tx, ty, "none").numpy()
    per_compiled = compiled(tx, ty, "none").numpy()
    mean64 = per_example64.mean()

    def rel(value):
        return abs(float(value) - mean64) / mean64

    def worst(per_example):
        return float(np.max(np.abs(per_example - per_example64) / per_example64))

    assert worst(per_compiled) <= 2 * worst(per_eager)  # per example, as close to float64 as eager's values ...
    assert rel(per_compiled.astype(np.float64).mean()) < 1e-8  # ... and, summed exactly, they give the mean
    mean_compiled = rel(compiled(tx, ty, "mean"))
    assert mean_compiled > 2 * rel(cross_entropy(tx, ty, "mean"))  # eager torch's own reduction
    assert mean_compiled > 10 * rel(per_compiled.sum(dtype=np.float32) / len(y))  # NumPy's pairwise float32 sum


# --- the crossover sweep's peaks failures ---------------------------------------------------


def sweep_problem(points_per_axis: int, steps: int):
    extra = {"data": {"points_per_axis": points_per_axis}, "training": {"epochs": steps}}
    return inputs.build_problem(load_spec(SPECS_DIR / "peaks_mlp.yaml", "sweep", extra=extra))


def ok(outcome):
    assert outcome.status == "ok", outcome.reason
    return outcome


class Judge:
    """The matrix's checks of one run against the oracle (rules.pair_checks), with the
    envelope calibrated as the matrix calibrates it: the float32 array-module run and its
    members that sum in other orders (roles.calibration_members)."""

    def __init__(self, problem):
        self.problem = problem
        self.spec = problem.spec
        self.oracle = ok(runner.run(problem, ORACLE_KEY))
        self.members = [self.member(key, p) for key, p in roles.calibration_members(problem)]
        self.reference = ok(runner.run(problem, CALIBRATION_KEY))
        self.calibration = spread.measure(self.oracle, [self.reference, *self.members], "float32")
        self.second_looks = 0

    @staticmethod
    def member(key, problem):
        return jobs.in_plain_units(ok(runner.run(problem, key)), problem.unit_orders)

    def __call__(self, outcome, cal=None) -> dict[str, checks.Check]:
        """Each check by name; the step-10 parameters' as `params_after_step`."""
        outcome = replace(ok(outcome), key=RunKey(outcome.key.framework, "cpu", "under-test"))
        cal = spread.Calibration(cal or self.calibration, None)
        found = {c.name: c for c in rules.pair_checks(self.spec, outcome, self.oracle, cal)}
        found["params_after_step"] = found.pop(f"params_after_step_{self.spec.checks.params_after_steps.step}")
        return found

    @functools.cached_property
    def wider(self):
        """The envelope's second look (harness/matrix.py): measured again on
        long_run.second_look members in all."""
        more = roles.calibration_members(self.problem, upto=self.spec.checks.long_run.second_look)
        return spread.measure(self.oracle, [self.reference, *self.members, *(self.member(k, p) for k, p in more)], "float32")

    def as_the_matrix(self, outcome) -> dict[str, checks.Check]:
        """The verdicts the matrix gives a run whose float32 failures are rounding alone (a
        reordering's float64 twin is the oracle's code): where a check fails on the first
        look, every check is judged again on the second."""
        found = self(outcome)
        if any(c.verdict == "fail" for c in found.values()):
            self.second_looks += 1
            return self(outcome, self.wider)
        return found


def einsum_affine(a, w, b):
    return np.einsum("nk,kj->nj", a, w, optimize=False) + b


def einsum_weight_gradient(a_in, d_z):
    return np.einsum("nk,nj->kj", a_in, d_z, optimize=False)


def relative_to_magnitude(value, exact, magnitude) -> float:
    """A product's error, relative to the sum of its terms' magnitudes (what rounding scales with)."""
    return float(np.max(np.abs(value - exact) / np.maximum(magnitude, 1e-30)))


def other_order(problem, seed: int):
    """The float32 run of `problem` with its sums in the order of `seed` (members.reordered),
    its parameters put back in the plain problem's unit order, as the driver puts back a
    member's: compared in the reordered order, every tensor of hidden units would differ."""
    moved = members.reordered(problem, seed)
    return jobs.in_plain_units(ok(runner.run(moved, CALIBRATION_KEY)), moved.unit_orders)


def test_the_calibrated_checks_hold_other_summation_orders_at_40000_points(monkeypatch):
    """The members sum in other orders (members.reordered), so a run that differs from them
    only in the order of its float32 sums passes every calibrated check, as the matrix judges
    it: twenty more orderings of the same code, and the same code with its forward products
    summed by einsum (exactly as accurate as BLAS's), on the article's own 40,000 points.
    Calibrated by one-ulp members of a single ordering instead, 12 of those 20 left the
    envelope (at step 6 or 11).

    On an Intel host (OpenBLAS's SkylakeX kernels) all 20 pass on the first look's 8
    members (the step-10 parameters at most 0.12 of their tolerance over 40 orderings). On an
    AMD EPYC host (Haswell kernels) 3 of the 20 (seeds 106, 110, 120) leave it by 1.10x to
    1.14x, a jump that 8 members did not see, and pass the envelope's second look (16
    members) under 0.5x. The step-10 parameter check is calibrated by the same members: the
    einsum run, which missed the earlier fixed tolerance (1e-5 + 1e-4 |p|) by 14 times,
    passes it."""
    problem = sweep_problem(200, 40)
    judge = Judge(problem)
    assert judge.calibration.runs == 9
    for seed in range(101, 121):
        found = judge.as_the_matrix(other_order(problem, seed))
        assert [c.name for c in found.values() if c.verdict != "pass"] == [], seed
        assert found["params_after_step"].ratio > 1e-3  # judged: the orderings' parameters differ
    assert judge.second_looks <= 5  # a jump now and then, not a first look that fails as a rule
    # Its hidden units left where the reordering put them, an ordering fails the step-10
    # check by four orders of magnitude. An earlier version of this test compared them so, and
    # took that for a false alarm of the calibrated check (a ReLU flip no member covered).
    left = judge(ok(runner.run(members.reordered(problem, 101), CALIBRATION_KEY)))["params_after_step"]
    assert left.verdict == "fail" and left.ratio > 1000

    w, x = problem.initial_params["dense1.weight"], problem.x_train
    exact = x.astype(np.float64) @ w.astype(np.float64)
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    blas = relative_to_magnitude(x @ w, exact, magnitude)
    assert relative_to_magnitude(einsum_affine(x, w, 0), exact, magnitude) <= 1.5 * blas  # as accurate
    assert judge.wider.runs == 17  # its members measured with BLAS's products, before einsum replaces them
    monkeypatch.setattr(dense, "affine", einsum_affine)
    einsum = judge.as_the_matrix(runner.run(problem, CALIBRATION_KEY))
    assert einsum["loss_curve_envelope"].verdict == "pass"
    assert einsum["params_after_step"].verdict == "pass"
    assert einsum["params_after_step"].max_abs_error > 10 * 1e-5  # ten times the fixed check's atol


def test_torch_at_160000_points_differs_by_summation_order(monkeypatch):
    """The sweep's torch run at 400 x 400 points stays inside the envelope and passes the
    calibrated step-10 parameter check it missed by 3.4e-5 under a fixed tolerance: float32
    summation order, not torch. torch's weight-
    gradient products (MKL) round like NumPy's einsum, both well within float32's
    expectations and both about ten times further from exact than OpenBLAS; the NumPy code
    with einsum weight gradients, no torch in it, also stays inside the envelope."""
    torch = pytest.importorskip("torch")
    problem = sweep_problem(400, 40)
    judge = Judge(problem)
    x = problem.x_train
    d_z = np.random.default_rng(0).standard_normal((len(x), 20)).astype(np.float32) / len(x)
    exact = x.astype(np.float64).T @ d_z.astype(np.float64)
    magnitude = np.abs(x.astype(np.float64)).T @ np.abs(d_z.astype(np.float64))
    mkl = relative_to_magnitude(torch.mm(torch.from_numpy(d_z).T, torch.from_numpy(x)).numpy().T, exact, magnitude)
    einsum = relative_to_magnitude(einsum_weight_gradient(x, d_z), exact, magnitude)
    assert mkl < 1e-6 and einsum < 1e-6  # all far inside sqrt(160,000) float32 roundings (2.4e-5)

    torch_run = judge(runner.run(problem, RunKey("torch", "cpu")))
    assert torch_run["loss_curve_envelope"].verdict == "pass"
    assert torch_run["params_after_step"].verdict == "pass"
    monkeypatch.setattr(dense, "weight_gradient", einsum_weight_gradient)
    reordered = judge(runner.run(problem, CALIBRATION_KEY))
    assert reordered["loss_curve_envelope"].verdict == "pass"


@pytest.mark.parametrize("points_per_axis, steps", [(10, 100), (20, 100), (100, 100), (283, 10)])
def test_optax_bias_corrections_explain_the_jax_sweep_failures(monkeypatch, points_per_axis, steps):
    """The sweep's JAX failures at 100, 400, 10,000 and 80,089 points (final outputs, final loss,
    parameters after step 10): the array-module code given optax's float32 bias corrections
    fails every check JAX fails, or comes within 25% of JAX's ratio where one of them is
    near its tolerance; without them it fails none.
    A check JAX fails near its tolerance may fall on either side of it for the other run
    (100 points, on an AMD EPYC host: JAX's loss curve at 1.06x, the code's at 0.98x): its
    ratios agree within 25%. Past a jump of peaks' chaotic curve the sizes do not
    reproduce between two runs that round otherwise, and both failing is the finding."""
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    problem = sweep_problem(points_per_axis, steps)
    judge = Judge(problem)

    def failing(outcome) -> dict[str, checks.Check]:
        return {name: c for name, c in judge(outcome).items() if c.verdict == "fail"}

    jax_fails = failing(runner.run(problem, RunKey("jax", "cpu")))
    assert jax_fails
    assert not failing(judge.reference)
    monkeypatch.setattr(adam, "update", functools.partial(adam.update, corrections=float32_bias_corrections))
    like_optax = judge(runner.run(problem, CALIBRATION_KEY))
    for name, jax_check in jax_fails.items():
        mine = like_optax[name].ratio
        # Both fail it: once a chaotic curve has jumped, how far it and everything after it
        # land is not reproducible between two runs that round otherwise (10,000 points on
        # an Intel host, 2026-11-26: the loss curve JAX 1,195x, the code 163x; the final
        # outputs 1.7x and 58x). Near the tolerance, one may pass: the ratios agree instead.
        both_fail = mine > 1 and jax_check.ratio > 1
        assert both_fail or mine == pytest.approx(jax_check.ratio, rel=0.25), name
    assert any(c.verdict == "fail" for c in like_optax.values())
