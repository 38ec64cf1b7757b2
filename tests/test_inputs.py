"""Initial weights and batch order: drawn once, seeded, deterministic, as the specs say."""

from __future__ import annotations

import numpy as np
import pytest

from harness.inputs import batch_order, initial_params
from harness.spec import SPECS_DIR, load_spec


def spec(name: str):
    return load_spec(SPECS_DIR / f"{name}.yaml").spec


@pytest.mark.parametrize("name", ["peaks_mlp", "moons_net", "mnist_mlp"])
def test_initial_params_are_deterministic_float32(name):
    first, second = initial_params(spec(name)), initial_params(spec(name))
    for (w1, b1), (w2, b2) in zip(first, second):
        assert w1.dtype == b1.dtype == np.float32
        assert np.array_equal(w1, w2) and np.array_equal(b1, b2)


def test_moons_init_is_the_theano_code():
    (w1, b1), (w2, b2) = initial_params(spec("moons_net"))
    np.random.seed(0)
    assert np.array_equal(w1, (np.random.randn(2, 1000) / np.sqrt(2)).astype(np.float32))
    assert np.array_equal(w2, (np.random.randn(1000, 2) / np.sqrt(1000)).astype(np.float32))
    assert not b1.any() and not b2.any()


def test_glorot_and_torch_default_ranges():
    for (w, b), fans in zip(initial_params(spec("peaks_mlp")), [(2, 20), (20, 5), (5, 1)]):
        assert w.shape == fans and np.abs(w).max() <= np.sqrt(6 / sum(fans)) and not b.any()
    (w, b), _ = initial_params(spec("mnist_mlp"))
    bound = 1 / np.sqrt(784)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound and b.any()
    assert abs(w.std() - bound / np.sqrt(3)) < 0.01 * bound  # uniform on [-bound, bound]


def test_batch_order_is_one_seeded_permutation_per_epoch():
    mnist = spec("mnist_mlp")
    order = batch_order(mnist, 1000)
    assert order.shape == (10, 1000)
    assert all(np.array_equal(np.sort(row), np.arange(1000)) for row in order)
    assert not np.array_equal(order[0], order[1])
    assert np.array_equal(order, batch_order(mnist, 1000))
    assert batch_order(spec("peaks_mlp"), 40000) is None  # full batch, no shuffling


def test_a_different_seed_changes_the_draws():
    base = spec("peaks_mlp")
    other = base.model_copy(update={"init": base.init.model_copy(update={"seed": 2})})
    assert not np.array_equal(initial_params(base)[0][0], initial_params(other)[0][0])
