"""Every layer kind's hand-written backward pass (harness/layers/) against float64 central
differences, over random shapes, strides, paddings and options (hypothesis), and the
check shown failing on a deliberately wrong backward of each kind."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.layers import KINDS, activations, attention, dense, place
from harness.layers.base import Context

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STEP = 1e-6
# Every kind but the residual, which adds what the network kept at its body's start
# (tests/test_transformers.py checks it through a whole network's gradient).
ALONE = sorted(set(KINDS) - {"residual"})


def _positions(draw, width: int | None = None) -> tuple[int, int]:
    """A text example's (positions, width)."""
    return (draw(st.integers(1, 4)), width or draw(st.integers(1, 5)))


def _text_case(draw, kind: str):
    """(section, shape) of the kinds that act on a text's (positions, width) values."""
    module = KINDS[kind]
    if kind == "embedding":
        return module.Section(kind=kind, width=draw(st.integers(1, 4)), vocabulary=draw(st.integers(2, 6))), (draw(st.integers(1, 4)),)
    if kind == "positional":
        t, width = _positions(draw)
        return module.Section(kind=kind, max_len=t + draw(st.integers(0, 2))), (t, width)
    heads = draw(st.integers(1, 2))
    rope = draw(st.sampled_from([None, "half", "interleaved"]))
    head_width = 2 * draw(st.integers(1, 2)) if rope else draw(st.integers(1, 3))
    section = module.Section(
        kind=kind,
        heads=heads,
        causal=draw(st.booleans()),
        bias=draw(st.booleans()),
        rope=None if rope is None else attention.Rope(layout=rope, base=draw(st.sampled_from([10.0, 10000.0]))),
    )
    return section, _positions(draw, heads * head_width)


@st.composite
def cases(draw, kind: str):
    """(section, input, parameters, dropout mask) for one layer of `kind`."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(2, 3))
    image = (draw(st.integers(1, 3)), draw(st.integers(3, 7)), draw(st.integers(3, 7)))
    module = KINDS[kind]
    if kind in ("embedding", "positional", "attention"):
        section, shape = _text_case(draw, kind)
    elif kind == "dense":
        shape = _positions(draw) if draw(st.booleans()) else (draw(st.integers(1, 5)),)
        section = module.Section(width=draw(st.integers(1, 4)))
    elif kind == "conv2d":
        kernel = draw(st.integers(1, 3))
        padding = draw(st.sampled_from(["valid", "same", "explicit"]))
        if padding == "explicit":
            padding = [[draw(st.integers(0, 2)), draw(st.integers(0, 2))], [draw(st.integers(0, 2)), draw(st.integers(0, 2))]]
        section = module.Section(kind=kind, filters=draw(st.integers(1, 3)), kernel=kernel, stride=draw(st.integers(1, 2)), padding=padding)
        shape = image
    elif kind in ("max_pool", "avg_pool"):
        window = draw(st.integers(1, 3))
        section, shape = module.Section(kind=kind, window=window, stride=draw(st.integers(1, 3))), image
    elif kind == "flatten":
        section, shape = module.Section(kind=kind), image
    elif kind == "batch_norm":
        section = module.Section(kind=kind, momentum=draw(st.floats(0, 1)), eps=draw(st.sampled_from([1e-5, 1e-3, 0.1])))
        shape = image if draw(st.booleans()) else (draw(st.integers(1, 4)),)
    elif kind == "layer_norm":
        shape = (draw(st.integers(1, 4)), draw(st.integers(2, 6))) if draw(st.booleans()) else (draw(st.integers(2, 6)),)
        section = module.Section(kind=kind, eps=draw(st.sampled_from([1e-6, 1e-5, 0.1])))
    else:
        shape = _positions(draw) if draw(st.booleans()) else (draw(st.integers(1, 5)),)
        section = module.Section(kind=kind, rate=draw(st.sampled_from([0.0, 0.25, 0.5])))
    try:
        module.out_shape(section, shape)
    except ValueError:
        shape = (image[0], 7, 7) if len(shape) == 3 else shape
    x = rng.integers(0, section.vocabulary, size=(n, *shape)).astype(float) if kind == "embedding" else rng.normal(size=(n, *shape))
    params = {k: v + rng.normal(scale=0.5, size=np.shape(v)) for k, v in module.init(section, shape, np.random.RandomState(1), Scheme()).items()}
    mask = (rng.random((n, *shape)) >= getattr(section, "rate", 0)) / (1 - getattr(section, "rate", 0))
    return section, x, params, mask


class Scheme:
    weights = "glorot_uniform"
    biases = "torch_linear_default"


def _context(mask) -> Context:
    return Context(train=True, masks={"layer": mask}, layer="layer")


def _objective(module, section, params, x, upstream, mask) -> float:
    out, _ = module.forward(np, section, params, x, _context(mask))
    return float((out * upstream).sum())


def numeric(module, section, params, x, upstream, mask) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """d sum(forward * upstream) by central differences, for the input and every trained tensor."""

    def derivative(array: np.ndarray, f) -> np.ndarray:
        found = np.zeros_like(array)
        for i in np.ndindex(array.shape):
            keep = array[i]
            array[i] = keep + STEP
            up = f()
            array[i] = keep - STEP
            down = f()
            array[i] = keep
            found[i] = (up - down) / (2 * STEP)
        return found

    # token ids have no gradient: an embedding's input is not differentiated
    d_x = None if module.KIND == "embedding" else derivative(x, lambda: _objective(module, section, params, x, upstream, mask))
    trained = [k for k in params if k not in module.BUFFERS]
    return d_x, {k: derivative(params[k], lambda: _objective(module, section, params, x, upstream, mask)) for k in trained}


def analytic(module, section, params, x, upstream, mask, backward=None):
    ctx = _context(mask)
    out, cache = module.forward(np, section, params, x, ctx)
    return (backward or module.backward)(np, section, params, cache, upstream, ctx, True)


def agree(module, section, params, x, mask, backward=None) -> bool:
    out, _ = module.forward(np, section, params, x, _context(mask))
    upstream = np.random.default_rng(0).normal(size=out.shape)
    d_x, grads = analytic(module, section, params, x, upstream, mask, backward)
    want_x, want = numeric(module, section, params, x, upstream, mask)
    close = {"atol": 1e-6, "rtol": 1e-5}
    input_agrees = d_x is want_x is None or (want_x is not None and d_x is not None and np.allclose(d_x, want_x, **close))
    return input_agrees and set(grads) == set(want) and all(np.allclose(grads[k], want[k], **close) for k in want)


@pytest.mark.parametrize("kind", ALONE)
def test_backward_matches_central_differences(kind):
    @SETTINGS
    @given(cases(kind))
    def check(case):
        section, x, params, mask = case
        assert agree(KINDS[kind], section, params, x, mask)

    check()


@pytest.mark.parametrize("kind", ALONE)
def test_init_draws_the_kinds_tensors_in_their_order(kind):
    """TENSORS names what init draws, in its order: the names every adapter and the members'
    orders use, read without drawing."""

    @settings(max_examples=5, deadline=None)
    @given(cases(kind))
    def check(case):
        module = KINDS[kind]
        assert tuple(case[2]) == (module.tensors(case[0]) if hasattr(module, "tensors") else module.TENSORS) and set(module.BUFFERS) <= set(case[2])

    check()


def test_placing_a_network_draws_nothing(monkeypatch):
    """A spec is placed (its names and shapes) before its memory estimate refuses it: a
    width of 10^9 once drew 16 GB of weights, for 90 s, only to be refused."""

    def refuse(*args):
        raise AssertionError("place drew a tensor")

    monkeypatch.setattr(dense, "draw_weight", refuse)
    monkeypatch.setattr(dense, "draw_bias", refuse)
    placed = place([dense.Section(width=10**9), dense.Section(width=2)], (2,))
    assert [p.trained for p in placed] == [["dense1.weight", "dense1.bias"], ["dense2.weight", "dense2.bias"]]


def wrong_backward(module):
    """The kind's backward with one porting-style slip: its largest gradient (the input's,
    for a kind with no parameters) off by 0.1%. Not its first: attention's q_weight gradient
    is near zero where k_weight is (hypothesis found one whose 0.1% was within rounding)."""

    def backward(xp, section, params, cache, d_y, ctx, need_dx):
        d_x, grads = module.backward(xp, section, params, cache, d_y, ctx, need_dx)
        if grads:
            largest = max(grads, key=lambda name: float(np.abs(grads[name]).max()))
            return d_x, {**grads, largest: grads[largest] * 1.001}
        return d_x * 1.001, grads

    return backward


@pytest.mark.parametrize("kind", ALONE)
def test_the_gradient_check_fails_on_a_wrong_backward(kind):
    @settings(max_examples=10, deadline=None)
    @given(cases(kind))
    def check(case):
        section, x, params, mask = case
        module = KINDS[kind]
        out, _ = module.forward(np, section, params, x, _context(mask))
        if not np.any(out):  # all dropped: nothing to get wrong
            return
        if kind == "attention" and x.shape[1] == 1:  # one position: the softmax is 1, q has no gradient to get wrong
            return
        assert not agree(module, section, params, x, mask, wrong_backward(module))

    check()


@pytest.mark.parametrize("name", ["relu", "tanh", "identity", "gelu", "gelu_tanh"])
def test_activation_derivatives_match_central_differences(name):
    z = np.random.default_rng(3).normal(size=200) * 3
    z = z[np.abs(z) > 1e-3]  # relu's kink
    a = activations.activate(np, z, name)
    want = (activations.activate(np, z + STEP, name) - activations.activate(np, z - STEP, name)) / (2 * STEP)
    np.testing.assert_allclose(activations.activation_grad(np, z, a, name), want, rtol=1e-6, atol=1e-8)


def test_the_two_gelus_differ_by_the_measured_amount():
    z = np.linspace(-4, 4, 4001)
    gap = np.abs(activations.activate(np, z, "gelu") - activations.activate(np, z, "gelu_tanh")).max()
    assert 1e-4 < gap < 1e-3  # about 5e-4 per element, as torch's and jax.nn.gelu's defaults differ


def test_the_oracle_sums_pairwise_and_a_member_serially():
    """Batch norm's mean over 64 x 14 x 14 pixels: the oracle's (pairwise, on a contiguous
    axis) within a few ulps of the exact sum; a calibration member's (a running sum in a
    seeded order) further off, as serial implementations are; NumPy's own mean over the
    axes (0, 2, 3) as far off as a running sum."""
    x = np.random.default_rng(0).random((64, 8, 14, 14)) + 0.5
    exact = np.array([math.fsum(x[:, c].ravel()) for c in range(8)]) / (64 * 14 * 14)
    oracle = Context().mean(np, x, (0, 2, 3))
    member = Context(reorder=np.random.default_rng(1)).mean(np, x, (0, 2, 3))

    def off(found):
        return np.abs(found - exact).max() / exact.max()

    assert off(oracle) < 4 * np.finfo(np.float64).eps
    assert off(member) > 4 * off(oracle)
    assert off(x.mean(axis=(0, 2, 3))) > 4 * off(oracle)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape, axis",
    [
        *[((7,), 0), ((3, 5), 1), ((15, 40), 1), ((2, 300), 1)],
        *[((16, 40), 1), ((17, 3), 1), ((16, 2000), 1), ((64, 10, 33), 2), ((300, 24), 0), ((4, 3, 9, 9), 1)],
    ],
)
def test_a_members_running_sum_adds_one_term_after_another(shape, axis, dtype):
    """A calibration member's sum (Context.total with a seeded order) is a serial loop's, term
    after term in the drawn order, bit for bit, whichever way NumPy is asked for it
    (base.running_sum: a cumulative sum under COLUMNS_AT_ONCE = 16 sums at once, the first
    four shapes; one reduction over the outermost axis from there on, the rest), on
    contiguous and strided terms, and on values whose order changes the rounding."""
    rng = np.random.default_rng(sum(shape))
    a = (rng.standard_normal(shape) * rng.choice([1e-4, 1.0, 3e3], shape)).astype(dtype)
    found = Context(reorder=np.random.default_rng(7)).total(np, a, axis)
    order = np.random.default_rng(7).permutation(shape[axis])
    terms = np.moveaxis(a, axis, -1)
    serial = terms[..., order[0]].copy()
    for i in order[1:]:
        serial = serial + terms[..., i]
    assert found.dtype == dtype and found.shape == serial.shape
    assert np.array_equal(np.ascontiguousarray(found).view(np.uint8), np.ascontiguousarray(serial).view(np.uint8))
    cumulative = np.cumsum(np.take(terms, order, axis=-1), axis=-1)[..., -1]
    assert np.array_equal(np.ascontiguousarray(found).view(np.uint8), np.ascontiguousarray(cumulative).view(np.uint8))
