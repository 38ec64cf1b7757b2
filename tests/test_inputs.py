"""Initial weights and batch order: drawn once, seeded, deterministic, as the specs say."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.paths import SPECS_DIR
from harness.inputs.problem import batch_order, initial_params
from harness.spec.load import load_spec


def spec(name: str):
    return load_spec(SPECS_DIR / f"{name}.yaml").spec


@pytest.mark.parametrize("name", ["peaks_mlp", "moons_net", "mnist_mlp"])
def test_initial_params_are_deterministic_float32(name):
    first, second = initial_params(spec(name)), initial_params(spec(name))
    assert first and list(first) == list(second)
    for tensor, a in first.items():
        assert a.dtype == np.float32
        assert np.array_equal(a, second[tensor])


def test_moons_init_is_the_theano_code():
    params = initial_params(spec("moons_net"))
    assert list(params) == ["dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias"]
    w1, b1, w2, b2 = params.values()
    np.random.seed(0)
    assert np.array_equal(w1, (np.random.randn(2, 1000) / np.sqrt(2)).astype(np.float32))
    assert np.array_equal(w2, (np.random.randn(1000, 2) / np.sqrt(1000)).astype(np.float32))
    assert not b1.any() and not b2.any()


def test_glorot_and_torch_default_ranges():
    peaks = initial_params(spec("peaks_mlp"))
    assert list(peaks) == [f"dense{i}.{t}" for i in (1, 2, 3) for t in ("weight", "bias")]
    for i, fans in enumerate([(2, 20), (20, 5), (5, 1)], start=1):
        w, b = peaks[f"dense{i}.weight"], peaks[f"dense{i}.bias"]
        assert w.shape == fans and np.abs(w).max() <= np.sqrt(6 / sum(fans)) and not b.any()
    mnist = initial_params(spec("mnist_mlp"))
    w, b = mnist["dense1.weight"], mnist["dense1.bias"]
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
    assert not np.array_equal(initial_params(base)["dense1.weight"], initial_params(other)["dense1.weight"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_members_jitter_moves_values_by_at_most_two_ulps(dtype):
    """The calibration members' extra rounding (network.jitter_function): seeded, at most two
    units in the last place, the sign kept, zero kept, and it does move values."""
    from harness.reference import network

    a = np.random.default_rng(0).normal(0, 10, 100_000).astype(dtype)
    a[:10] = 0
    one, two = network.jitter_function(np, 7)(a), network.jitter_function(np, 7)(a)
    np.testing.assert_array_equal(one, two)
    assert one.dtype == a.dtype
    assert np.all(np.abs(one - a) <= 2 * np.spacing(np.abs(a))) and np.all(np.sign(one) == np.sign(a))
    assert np.all(one[:10] == 0)
    assert 0.1 < np.mean(one != a) < 0.9


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1 << 20, 1_234_569, 3 * (1 << 20) + 1])
def test_a_members_jitter_in_blocks_gives_the_whole_arrays_bits(dtype, size, monkeypatch):
    """A large array's moves taken a block at a time (network._moved_in_blocks, from
    BLOCKED_BYTES) are the whole-array passes' bits: the same draws, the same operations on
    each element, on sizes that end inside a block, zeros, signs, subnormals, inf and nan
    included, for both ulps a member uses; and the next draw after it is the same."""
    from harness.reference import network

    moved_in_blocks = network._moved_in_blocks
    a = np.random.default_rng(4).normal(0, 10, size).astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    a[:6] = [0.0, -0.0, tiny, -tiny, np.inf, np.nan]
    shaped = a.reshape(-1, 7) if size % 7 == 0 else a
    assert shaped.nbytes >= network.BLOCKED_BYTES
    blocks = []
    monkeypatch.setattr(network, "_moved_in_blocks", lambda *args: blocks.append(1) or moved_in_blocks(*args))
    for ulps in (1.0, 4.0):
        eps = float(np.finfo(dtype).eps) * ulps
        with np.errstate(invalid="ignore"):  # inf moved down by inf*u: nan, on either path
            whole = network.moves(network.move_bytes(np.random.default_rng(11), shaped.shape).astype(dtype), eps)
            whole *= shaped
            whole += shaped
            got = network.jitter_function(np, 11)(shaped, ulps)
        assert got.dtype == shaped.dtype and got.shape == shaped.shape and not np.shares_memory(got, shaped)
        np.testing.assert_array_equal(got.view(np.uint8), whole.view(np.uint8))  # bits, nan's included
    small = np.arange(1, 11, dtype=dtype)
    jitter = network.jitter_function(np, 2)
    with np.errstate(invalid="ignore"):
        jitter(a)
    after = jitter(small)
    rng = np.random.default_rng(2)
    network.move_bytes(rng, a.shape)
    want = network.moves(network.move_bytes(rng, small.shape).astype(dtype), float(np.finfo(dtype).eps))
    want *= small
    want += small
    np.testing.assert_array_equal(after, want)  # the blocked call drew as many bytes as one pass
    assert len(blocks) == 3  # each large array took the blocked path, the small one did not


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_members_moves_land_as_a_continuous_draws_would(dtype):
    """A member's u is one random byte per element (network.MOVE_LEVELS levels in [-eps,
    eps]), not a float64 uniform draw: the chance of each move, -2 to 2 ulps, is within half
    a percent of a continuous u's (measured: 0.2% at most; 16 levels move them by 2-3%)."""
    from harness.reference import network

    a = np.random.default_rng(1).normal(0, 10, 400_000).astype(dtype)
    eps = np.finfo(dtype).eps

    def chances(moved):
        ulps = np.round((moved.astype(np.float64) - a) / np.spacing(np.abs(a))).astype(int)
        return np.bincount(ulps + 2, minlength=5) / len(a)

    continuous = a + a * np.random.default_rng(2).uniform(-eps, eps, a.shape).astype(dtype)
    np.testing.assert_allclose(chances(network.jitter_function(np, 3)(a)), chances(continuous), atol=0.005)


@pytest.mark.parametrize("name", ["moons_net", "cnn_norm_mnist"])
def test_a_members_unit_orders_are_known_without_making_the_member(name):
    """The driver puts a member's outcome back in plain units from members.unit_orders,
    which must be the orders reordered() drew (a CNN's channels, an MLP's hidden units)."""
    from harness import smoke
    from harness.inputs import members

    spec = load_spec(SPECS_DIR / f"{name}.yaml", "quick").spec
    made = members.reordered(smoke.smoke_problem(spec), seed=5).unit_orders
    known = members.unit_orders(spec, 5)
    assert len(known) == len(made) > 0
    for (order, moves), (want, want_moves) in zip(known, made, strict=True):
        assert np.array_equal(order, want) and moves == want_moves
