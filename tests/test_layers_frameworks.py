"""Each layer kind's translation into torch.nn and flax.linen computes the spec's math:
float64 runs of small networks of every kind against the oracle, step by step; and the
evidence of the catalogued library differences (harness/known_differences.yaml)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.registry import FLOAT64, RunKey
from harness.inputs.problem import Problem, in_memory
from harness.spec.model import Spec

STEPS = 3


def image_spec(layers: list[dict], shape=(2, 8, 8), optimizer=None) -> Spec:
    return Spec.model_validate(
        {
            "name": "layers_case",
            "title": "one layer kind in a small network",
            "article": "tests",
            # small seeded images of the model's shape (the arrays themselves are small_problem's)
            "data": {"kind": "image_patterns", "n_samples": 24, "shape": list(shape), "classes": 3, "noise": 0.0, "seed": 0},
            "model": {"input_shape": list(shape), "layers": [*layers, {"kind": "flatten"}, {"width": 3}]}
            if layers[-1].get("kind") != "dense" and "width" not in layers[-1]
            else {"input_shape": list(shape), "layers": [*layers, {"width": 3}]},
            "init": {"weights": "glorot_uniform", "biases": "torch_linear_default", "seed": 3},
            "loss": {"kind": "cross_entropy", "reduction": "mean"},
            "optimizer": optimizer or {"kind": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
            "training": {"epochs": 1, "batch_size": 8, "shuffle": True, "shuffle_seed": 5, "last_batch": "keep"},
            "logging": {"loss_every": 1, "print_every": 1},
            "checks": {"params_after_steps": {"step": 1}},
            "timing": {"repeats": 1},
        }
    )


def small_problem(spec: Spec, n: int = 24) -> Problem:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(n, spec.model.in_features)).astype(np.float32)
    y = rng.integers(0, spec.model.n_outputs, size=n)
    return in_memory(spec, x, y)


def run(framework: str, problem: Problem):
    from harness.core import registry

    adapter = registry.load(framework)
    key = RunKey(framework, "cpu", precision=FLOAT64)
    data = adapter.put(problem, key)
    trainer = adapter.build(problem, data, key)
    adapter.train(trainer, 0, STEPS)
    return adapter.state(trainer, STEPS), adapter.predict(trainer, problem.x_train)


CASES = {
    "dense_gelu": [{"kind": "flatten"}, {"width": 6, "activation": "gelu"}],
    "dense_gelu_tanh": [{"kind": "flatten"}, {"width": 6, "activation": "gelu_tanh"}],
    "conv_valid": [{"kind": "conv2d", "filters": 3, "kernel": 3, "activation": "relu"}],
    "conv_same_stride2": [{"kind": "conv2d", "filters": 3, "kernel": 3, "stride": 2, "padding": "same", "activation": "tanh"}],
    "conv_explicit": [{"kind": "conv2d", "filters": 2, "kernel": 2, "padding": [[1, 0], [0, 2]], "activation": "gelu"}],
    "max_pool": [{"kind": "conv2d", "filters": 2, "kernel": 3, "padding": "same"}, {"kind": "max_pool", "window": 3, "stride": 2}],
    "avg_pool": [{"kind": "conv2d", "filters": 2, "kernel": 3, "padding": "same"}, {"kind": "avg_pool", "window": 2}],
    "layer_norm": [{"kind": "flatten"}, {"width": 5, "activation": "relu"}, {"kind": "layer_norm", "eps": 1e-5}],
    "dropout": [{"kind": "flatten"}, {"width": 6, "activation": "relu"}, {"kind": "dropout", "rate": 0.5}],
    "dropout_image": [{"kind": "conv2d", "filters": 2, "kernel": 3}, {"kind": "dropout", "rate": 0.3}],
}


def distance(state, reference) -> float:
    """The largest relative distance of any tensor or logged loss from the reference's."""
    worst = float(np.abs(state.losses - reference.losses).max() / np.abs(reference.losses).max())
    for name, want in reference.params.items():
        worst = max(worst, float(np.abs(state.params[name] - want).max() / max(np.abs(want).max(), 1e-300)))
    return worst


@pytest.fixture(scope="module")
def frameworks():
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    return ("torch", "jax")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_translation_computes_the_specs_math_in_float64(case, frameworks):
    problem = small_problem(image_spec(CASES[case]))
    reference, ref_out = run("numpy", problem)
    for framework in frameworks:
        state, out = run(framework, problem)
        assert list(state.params) == list(reference.params)
        assert distance(state, reference) < 1e-9, f"{framework}: {case}"
        np.testing.assert_allclose(out, ref_out, rtol=1e-9, atol=1e-12)


# SGD: a bias before a batch norm has an exact gradient of zero, and Adam would scale its
# float64 rounding noise (1e-18) up to lr * noise / eps.
SGD = {"kind": "sgd", "lr": 0.1}
NORMS = {
    "image": [{"kind": "conv2d", "filters": 2, "kernel": 3}, {"kind": "batch_norm", "momentum": 0.1, "running_var": "unbiased"}],
    "vector": [{"kind": "flatten"}, {"width": 5, "activation": "tanh"}, {"kind": "batch_norm", "momentum": 0.3, "eps": 1e-3}],
}


@pytest.mark.parametrize("where", sorted(NORMS))
def test_flax_stores_the_biased_running_variance_torch_the_unbiased(where, frameworks):
    """Evidence of flax-batch-norm-biased-running-var: with the spec asking for the
    unbiased variance, torch agrees with the oracle and flax does not (its running
    variance is n / (n - 1) times too small); asking for the biased one, flax agrees and
    torch does not. Everything else (training, the running mean) agrees either way."""
    layers = NORMS[where]
    unbiased = small_problem(image_spec(layers, optimizer=SGD))
    biased = small_problem(image_spec([*layers[:-1], {**layers[-1], "running_var": "biased"}], optimizer=SGD))
    oracle_unbiased, _ = run("numpy", unbiased)
    oracle_biased, _ = run("numpy", biased)
    torch_state, _ = run("torch", unbiased)
    flax_state, _ = run("jax", unbiased)
    assert distance(torch_state, oracle_unbiased) < 1e-9
    assert distance(flax_state, oracle_unbiased) > 1e-6
    assert distance(flax_state, oracle_biased) < 1e-9
    assert distance(run("torch", biased)[0], oracle_biased) > 1e-6
    without = {k: v for k, v in flax_state.params.items() if not k.endswith("running_var")}
    assert all(np.allclose(v, oracle_unbiased.params[k], rtol=1e-9, atol=1e-12) for k, v in without.items())


def test_jax_same_padding_is_not_a_symmetric_pad_at_stride_2(frameworks):
    """The porting bug the spec's `same` names: at stride 2 with an even total, JAX pads
    the odd pixel at the bottom and right; a torch port that pads k // 2 on both sides
    computes other outputs."""
    same = small_problem(image_spec(CASES["conv_same_stride2"]))
    symmetric = small_problem(image_spec([{**CASES["conv_same_stride2"][0], "padding": [[1, 1], [1, 1]]}]))
    assert same.spec.model.placed[0].out_shape == symmetric.spec.model.placed[0].out_shape  # 8 -> 4 either way
    _, out_same = run("numpy", same)
    _, out_symmetric = run("numpy", symmetric)
    assert np.abs(out_same - out_symmetric).max() > 1e-3
