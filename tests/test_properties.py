"""Property tests: on random MLPs (1-3 layers, widths 1-16, relu/tanh/identity hidden
layers, mse or cross-entropy, mean or sum, with or without L2) and random float32 inputs,
every installed adapter's forward outputs and gradients agree with the float64 oracle to
float32 rounding. Agreeing with the oracle to that tolerance makes any two adapters agree
to twice it.

The gradient is read through the public protocol: one SGD step with a power-of-two
learning rate, g = (p0 - p1) / lr. The product lr * g is exact, and with lr large the
update dominates p0, so the only rounding is that of p1 itself: |error| <= eps (|p0| / lr
+ |g|), where lr = 1 would leave an error of eps |p0| whatever the size of g.

The tolerance of each entry is ULPS float32 epsilons times its condition magnitude: the
same forward and backward pass in float64 on absolute values (sum of |terms| of every dot
product), plus the error that a saturated tanh derivative (1 - a^2) and a softmax of
float32 logits pick up. It is tight where nothing cancels (about 1e-6 relative) and
honest where float32 itself cannot do better (cancelling sums, saturated units).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.core import registry
from harness.inputs.problem import Problem
from harness.reference import network
from harness.spec.model import Spec
from tests.conftest import CPU_FRAMEWORKS, key_for, trainer_of

EPS32 = 2.0**-24  # float32 unit roundoff
ULPS = 32  # the worst seen in about 2,000 random cases (every adapter) was under 5
LR = 1024.0  # a power of two: lr * g is exact in float32
RELU_MARGIN = 1e-4  # |z| / magnitude(z) below this and float32 may put z on the other side of the kink
HIDDEN_ACTIVATIONS = ["relu", "tanh", "identity"]
ACTIVATION_GRAD = {
    "relu": lambda z: (z > 0).astype(np.float64),
    "tanh": lambda z: 1 - np.tanh(z) ** 2,
    "identity": np.ones_like,
}
PROPERTY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- random problems ----------------------------------------------------------------------


def random_spec(input_width: int, layers: list[tuple[int, str]], loss: dict) -> Spec:
    """A valid spec for a one-step, full-batch SGD run. The data section is an idx stub:
    the data arrays are handed to the adapters in the Problem, never loaded."""
    stub = {"file": "unused.gz", "sha256": "0" * 64}
    close = {"rtol": 1e-5, "atol": 1e-6}
    return Spec.model_validate(
        {
            "name": "random_mlp",
            "title": "random MLP (property test)",
            "article": "none",
            "data": {
                "kind": "idx",
                "dataset": "random",
                "scale": 1.0,
                "split_seed": 0,
                "source": "random",
                "sources": {"random": {"images": stub, "labels": stub, "validation": 1}},
            },
            "model": {"input_width": input_width, "layers": [{"width": w, "activation": a} for w, a in layers]},
            "init": {"weights": "glorot_uniform", "biases": "zeros", "seed": 0},
            "loss": loss,
            "optimizer": {"kind": "sgd", "lr": LR},
            "training": {
                "epochs": 1,
                "batch_size": "full",
                "shuffle": False,
                "shuffle_seed": 0,
                "last_batch": "keep",
            },
            "logging": {"loss_every": 1, "print_every": 1},
            "checks": {
                "probe_size": 1,
                "initial_outputs": close,
                "initial_loss": close,
                "params_after_first_step": close,
                "params_after_steps": {"step": 1, **close},
                "loss_curve": {"rtol": 1e-5, "must_hold_for": None},
                "long_run": {"factor": 10.0, "members": 0, "curve_floor": 0.0, "output_floor": 0.0, "metric_floor": 0.0},
            },
            "timing": {"repeats": 1},
        }
    )


@st.composite
def problems(draw) -> Problem:
    input_width = draw(st.integers(1, 8))
    hidden = draw(st.lists(st.tuples(st.integers(1, 16), st.sampled_from(HIDDEN_ACTIVATIONS)), max_size=2))
    kind = draw(st.sampled_from(["mse", "cross_entropy"]))
    out_width = draw(st.integers(2 if kind == "cross_entropy" else 1, 16))
    loss = {"kind": kind, "reduction": draw(st.sampled_from(["mean", "sum"]))}
    if draw(st.booleans()):
        loss["l2"] = {"coefficient": draw(st.sampled_from([0.01, 0.5])), "divide_by_examples": draw(st.booleans())}
    n_examples = draw(st.integers(1, 32))
    x_scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    w_scale = draw(st.sampled_from([0.5, 1.0, 2.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    layers = [*hidden, (out_width, "identity")]
    spec = random_spec(input_width, layers, loss)
    x = rng.uniform(-x_scale, x_scale, size=(n_examples, input_width)).astype(np.float32)
    if kind == "mse":
        y = rng.normal(size=(n_examples, out_width)).astype(np.float32)
    else:
        y = rng.integers(0, out_width, size=n_examples)
    params = {}
    fan_in = input_width
    for i, (width, _) in enumerate(layers, start=1):
        limit = w_scale * np.sqrt(3.0 / fan_in)
        params[f"dense{i}.weight"] = rng.uniform(-limit, limit, size=(fan_in, width)).astype(np.float32)
        params[f"dense{i}.bias"] = rng.uniform(-0.5, 0.5, size=width).astype(np.float32)
        fan_in = width
    return Problem(
        spec=spec,
        x_train=x,
        y_train=y,
        x_val=None,
        y_val=None,
        initial_params=params,
        batch_order=None,
        bounds=[(0, n_examples)],
    )


# --- reference, magnitudes and tolerance --------------------------------------------------


def layer_names(problem: Problem) -> list[str]:
    return [p.name for p in problem.spec.model.placed]


def pairs(problem: Problem, params: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight, bias) of each layer of a problem's MLP, from its tensors by name."""
    assert set(params) == {f"{name}.{t}" for name in layer_names(problem) for t in ("weight", "bias")}
    return [(params[f"{name}.weight"], params[f"{name}.bias"]) for name in layer_names(problem)]


def params64(problem: Problem):
    return [(w.astype(np.float64), b.astype(np.float64)) for w, b in pairs(problem, problem.initial_params)]


def forward64(problem: Problem, params):
    """The oracle's outputs and per-layer caches (cache, z, a) on the training set, in float64."""
    named = {f"{name}.{t}": a for name, pair in zip(layer_names(problem), params) for t, a in zip(("weight", "bias"), pair)}
    x = problem.x_train.astype(np.float64)
    return network.forward(np, problem.spec.model.placed, named, x, network.Context())


def activations(problem: Problem) -> list[str]:
    return [layer.activation for layer in problem.spec.model.layers]


def magnitudes(problem: Problem):
    """The condition magnitude of every output and gradient entry (see the docstring): a
    float32 result may be off by a few EPS32 times it, and it bounds the exact value."""
    params = params64(problem)
    acts = activations(problem)
    x = problem.x_train.astype(np.float64)
    out, cache = forward64(problem, params)
    m_z = []  # sum of |terms| of each pre-activation
    m = np.abs(x)
    for w, b in params:
        m_z.append(m @ np.abs(w) + np.abs(b))
        m = m_z[-1]  # |act(z)| <= |z| and every activation is 1-Lipschitz
    m_out = m_z[-1]

    n = len(x)
    loss = problem.spec.loss
    if loss.kind == "mse":
        d_a = 2 * (m_out + np.abs(problem.y_train)) / (out.size if loss.reduction == "mean" else 1)
    else:
        p = np.exp(network.log_softmax(np, out))
        onehot = np.zeros_like(p)
        onehot[np.arange(n), problem.y_train] = 1
        # softmax of logits off by about eps * m_out: each probability is off relatively by twice that
        d_a = (p * (1 + 2 * m_out.max(axis=1, keepdims=True)) + onehot) / (n if loss.reduction == "mean" else 1)
    l2 = 2 * network.l2_scale(loss, n)
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        z = cache[i][1]
        d_z = d_a * ACTIVATION_GRAD[acts[i]](z)
        if acts[i] == "tanh":  # 1 - a^2 from an `a` off by eps * m_z: cancels when saturated
            d_z = d_z + d_a * 2 * np.abs(np.tanh(z)) * m_z[i]
        a_in = np.abs(x) if i == 0 else m_z[i - 1]
        w = np.abs(params[i][0])
        grads[i] = (a_in.T @ d_z + l2 * w, d_z.sum(axis=0))
        d_a = d_z @ w.T
    return m_out, grads


def relu_margin(problem: Problem) -> float:
    """The smallest |z| / magnitude(z) over the relu units: how far from the kink."""
    params = params64(problem)
    _, cache = forward64(problem, params)
    margin = np.inf
    m = np.abs(problem.x_train.astype(np.float64))
    for (w, b), (_, z, _), act in zip(params, cache, activations(problem)):
        m = m @ np.abs(w) + np.abs(b)
        if act == "relu":
            margin = min(margin, float((np.abs(z) / np.maximum(m, 1e-300)).min()))
    return margin


def outputs_and_gradients(adapter, problem: Problem, dtype: str):
    """Forward outputs on the training set, then one SGD step read back as a gradient."""
    trainer = trainer_of(adapter, problem, "cpu", dtype)
    outputs = adapter.predict(trainer, problem.x_train)
    adapter.train(trainer, 0, 1)
    after = pairs(problem, adapter.state(trainer, 0).params)
    grads = [((w0 - w1) / LR, (b0 - b1) / LR) for (w0, b0), (w1, b1) in zip(params64(problem), after)]
    return outputs, grads


def mismatches(problem: Problem, outputs, grads, ref_outputs, ref_grads) -> list[str]:
    """Every output or gradient array outside the tolerance, with its worst error in ulps
    of its magnitude; empty when all agree."""
    m_out, m_grads = magnitudes(problem)
    named = [("outputs", outputs, ref_outputs, m_out)]
    for i, (pair, ref_pair, m_pair, p0_pair) in enumerate(zip(grads, ref_grads, m_grads, params64(problem))):
        for part, got, ref, m, p0 in zip(("dW", "db"), pair, ref_pair, m_pair, p0_pair):
            named.append((f"layer {i} {part}", got, ref, m + np.abs(p0) / LR))  # + the rounding of p1
    bad = []
    for name, got, ref, m in named:
        if got.shape != ref.shape:
            bad.append(f"{name}: shape {got.shape}, oracle {ref.shape}")
            continue
        err = np.abs(got - ref)
        if not np.all(err <= ULPS * EPS32 * m):
            ulps = float((err / np.maximum(EPS32 * m, 1e-300)).max())
            bad.append(f"{name}: {ulps:.3g} ulps of its magnitude (max |error| {err.max():.3g}, allowed {ULPS})")
    return bad


def adapter_or_skip(name: str):
    if name == "torch":
        pytest.importorskip("torch")
    elif name == "jax":
        pytest.importorskip("jax")
        pytest.importorskip("flax")
        pytest.importorskip("optax")
    adapter = registry.load(name)
    reason = adapter.unavailable(key_for(adapter, "cpu"))
    if reason:
        pytest.skip(reason)
    return adapter


# --- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=CPU_FRAMEWORKS)
def adapter(request):
    return adapter_or_skip(request.param)


@PROPERTY_SETTINGS
@given(problem=problems())
def test_outputs_and_gradients_match_the_oracle(adapter, problem):
    assume(relu_margin(problem) > RELU_MARGIN)
    ref_outputs, ref_grads = outputs_and_gradients(registry.load("numpy"), problem, "float64")
    outputs, grads = outputs_and_gradients(adapter, problem, "float32")
    bad = mismatches(problem, outputs, grads, ref_outputs, ref_grads)
    assert not bad, f"{adapter.NAME} float32 vs the float64 oracle: " + "; ".join(bad)


@PROPERTY_SETTINGS
@given(problem=problems())
def test_magnitudes_bound_the_exact_values(problem):
    """The tolerance is only meaningful if the magnitude is at least the value itself."""
    ref_outputs, ref_grads = outputs_and_gradients(registry.load("numpy"), problem, "float64")
    m_out, m_grads = magnitudes(problem)
    assert np.all(np.abs(ref_outputs) <= m_out * (1 + 1e-9))
    for pair, m_pair in zip(ref_grads, m_grads):
        for ref, m in zip(pair, m_pair):
            assert np.all(np.abs(ref) <= m * (1 + 1e-9) + 1e-12)


def fixed_problem() -> Problem:
    """2 -> 8 tanh -> 3, cross-entropy, 16 examples: nothing saturated, nothing cancels much."""
    rng = np.random.default_rng(7)
    spec = random_spec(2, [(8, "tanh"), (3, "identity")], {"kind": "cross_entropy", "reduction": "mean"})
    params = {
        "dense1.weight": (rng.uniform(-1, 1, (2, 8))).astype(np.float32),
        "dense1.bias": rng.uniform(-0.5, 0.5, 8).astype(np.float32),
        "dense2.weight": (rng.uniform(-0.6, 0.6, (8, 3))).astype(np.float32),
        "dense2.bias": rng.uniform(-0.5, 0.5, 3).astype(np.float32),
    }
    x = rng.uniform(-1, 1, (16, 2)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    return Problem(spec, x, y, None, None, params, None, [(0, 16)])


@pytest.mark.parametrize("relative_error", [1e-4, 1e-3])
def test_the_tolerance_rejects_a_slightly_wrong_gradient(relative_error):
    """A check that cannot fail is a defect: float32 passes, and the same float32 result with
    one gradient entry off by `relative_error` does not."""
    problem = fixed_problem()
    ref_outputs, ref_grads = outputs_and_gradients(registry.load("numpy"), problem, "float64")
    outputs, grads = outputs_and_gradients(registry.load("numpy"), problem, "float32")
    assert not mismatches(problem, outputs, grads, ref_outputs, ref_grads)
    for layer in range(len(grads)):
        for part in range(2):
            wrong = [list(pair) for pair in grads]
            g = wrong[layer][part].copy()
            g.flat[np.argmax(np.abs(g))] *= 1 + relative_error
            wrong[layer][part] = g
            assert mismatches(problem, outputs, wrong, ref_outputs, ref_grads), (layer, part)
    wrong_outputs = outputs.copy()
    wrong_outputs.flat[np.argmax(np.abs(outputs))] *= 1 + relative_error
    assert mismatches(problem, wrong_outputs, grads, ref_outputs, ref_grads)
