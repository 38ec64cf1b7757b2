"""A user's torch module (a port, harness/inputs/port.py) as the torch adapter's network:
the same trainer, optimizer, loss and data feeding as a spec of layers, only the module is
the user's. Its tensors are named and laid out as its state_dict() has them (its floating
tensors), which is the port's layout everywhere in the harness."""

from __future__ import annotations

import contextlib
import inspect
import math

import numpy as np

from harness.inputs import port
from harness.layers.activations import GELU_TANH_CUBIC, SQRT_2_OVER_PI, TANH_ULPS
from harness.reference.network import move_bytes, moves


def network(torch, problem, params: dict[str, np.ndarray], device: str, dtype):
    """The user's module holding `params` (by state_dict name), wrapped to take the
    adapter's call `model(x, masks, outputs=None)`: x flat as the data has it (an image
    made NCHW), masks ignored (a port has no harness dropout), and with `outputs`, every
    named submodule's tensor output by module name (forward hooks) and the whole module's
    output as `output` (a module path written as flax writes it: "block/conv" for torch's
    "block.conv")."""
    shape = problem.spec.model.in_shape

    class Port(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.step = 0  # the training step of the next training pass (a member's jitter)
            self.rounds = None  # a member's rounding once more (_jitter), for its loss's lse
            self.round_loss = None  # ... on this pass's jittered step (torch_layers.objective)
            self.rounding = None  # a member's TorchFunctionMode rounding the activations otherwise (_jitter)
            self.fast = _flax_variance(torch, problem, variances)  # flax's norms' variance, where the reference computes it
            self.variances = variances  # each training batch norm's batch variance, as its forward took it (_store_biased_variance)
            self.no_dropout = _no_dropout(torch) if problem.port_dropout else None  # every dropout off (port.torch_dropout)

        def plain(self, x):
            """The user's module on x, nothing around it: what torch's fast mode compiles
            (adapters/torch_fast.py; a port without dropout, not a member)."""
            return self.inner(x.reshape((x.shape[0], *shape)))

        def forward(self, x, masks, outputs=None):
            x = x.reshape((x.shape[0], *shape))
            if outputs is None:
                # a member rounds otherwise on its jittered steps, and in every prediction
                # (evaluation mode), as the array-module members' predict does
                jittered = self.rounds is not None and (not self.training or problem.jittered(self.step))
                self.round_loss = self.rounds if jittered and self.training else None
                try:
                    mode = self.rounding if jittered else self.fast
                    with self.no_dropout or contextlib.nullcontext(), mode or contextlib.nullcontext():
                        return port.call(problem.port, "the torch module's forward", self.inner, x)
                finally:
                    self.step += self.training
            hooks = [m.register_forward_hook(_keeper(outputs, name.replace(".", "/"))) for name, m in self.inner.named_modules() if name]
            try:
                with self.no_dropout or contextlib.nullcontext():
                    out = port.call(problem.port, "the torch module's forward", self.inner, x)
            finally:
                for hook in hooks:
                    hook.remove()
            outputs["output"] = out
            return out

    inner = port.torch_module(problem.port, problem.spec.init.seed).to(device=device, dtype=dtype)
    state = inner.state_dict()
    missing = sorted(set(params) - set(state))
    if missing:
        raise port.PortError(f"{problem.port}: torch_model() has no tensor {missing[0]}")
    with torch.no_grad():
        for name, value in params.items():
            if name in state:
                state[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    # each training pass's batch variance, left by _batch_norm_summed for the hooks storing
    # flax's running variance to take (none kept where no hook takes them)
    variances: dict | None = {} if problem.port_running_var == "biased" else None
    if variances is not None:
        _store_biased_variance(torch, inner, problem.port, variances)
    model = Port(inner).train()
    if problem.jitter_seed is not None:
        _jitter(torch, model, problem)
    return model


def moves_like(torch, rng, like, ulps: float = 1.0):
    """A member's relative moves for a tensor like `like` (its shape, dtype and device), `ulps`
    units in the last place at most: the random bytes and levels the array-module members
    draw theirs from (harness.reference.network move_bytes, moves)."""
    raw = torch.from_numpy(move_bytes(rng, tuple(like.shape))).to(like.device)
    return moves(raw.to(like.dtype), torch.finfo(like.dtype).eps * ulps)


def _jitter(torch, model, problem) -> None:
    """A calibration member's other roundings (harness/inputs/members.py reordered), without
    touching the user's code: over the member's jittered steps, every leaf module's output
    in a training pass, and the gradient that comes back through it, moved at random
    (seeded) by at most two units in its last place, as the array-module code's members
    round every intermediate array once more (harness.reference.network.jitter_function);
    its activations (_activations_rounded) and its loss's lse (torch_layers.objective) too;
    and in evaluation mode, every prediction, as the array-module members' predict rounds
    (a port's initial outputs were otherwise its members' bitwise: a tanh MLP's float64
    twin failed them at 1.02x, 2026-11-26)."""
    rng = np.random.default_rng(problem.jitter_seed)

    class Jitter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, forward_u, backward_u):
            ctx.save_for_backward(backward_u)
            return x + x * forward_u

        @staticmethod
        def backward(ctx, grad):
            (backward_u,) = ctx.saved_tensors
            return grad + grad * backward_u, None, None

    def moved(value, ulps: float = 1.0):
        return Jitter.apply(value, moves_like(torch, rng, value, ulps), moves_like(torch, rng, value, ulps))

    def rounded(module, inputs, output):
        if (module.training and not problem.jittered(model.step)) or not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return None
        return moved(output)

    class Tanh(torch.autograd.Function):
        """tanh's value moved by TANH_ULPS, and its derivative 1 - a * a taken from that moved
        value a, as the array-module members take theirs (harness/layers/activations.py
        activation_grad) and XLA its own, from its output: near saturation 1 - a * a cancels,
        and a tanh MLP of width 1's float64 twin was 7.5x the spread of members whose
        derivative came from torch's own tanh (port seed 20261405, draw 88)."""

        @staticmethod
        def forward(ctx, z, forward_u, backward_u):
            a = torch.tanh(z)
            a = a + a * forward_u
            ctx.save_for_backward(a, backward_u)
            return a

        @staticmethod
        def backward(ctx, grad):
            a, backward_u = ctx.saved_tensors
            grad = grad + grad * backward_u
            return grad * (1 - a * a), None, None

    def tanh(z):
        return Tanh.apply(z, moves_like(torch, rng, z, TANH_ULPS), moves_like(torch, rng, z, TANH_ULPS))

    model.rounds = moved  # the loss's lse too (torch_layers.cross_entropy_rounded)

    for part in model.inner.modules():
        if not list(part.children()):
            part.register_forward_hook(rounded)
    layer_norm = _layer_norm_fast(torch, moved) if problem.port_layer_norm_fast else None
    batch_norm = _batch_norm_summed(torch, rng, fast=problem.port_fast_variance, moved=moved, variances=model.variances)
    model.rounding = _activations_rounded(torch, moved, tanh, batch_norm, layer_norm)


def _activations_rounded(torch, moved, tanh, batch_norm, layer_norm=None):
    """A TorchFunctionMode under which a member's forward rounds its activations as the
    array-module members round theirs (harness/layers/activations.py), however the user
    wrote them (a module or a function): tanh's values TANH_ULPS otherwise (XLA's tanh lands
    up to 4 ulps from the exact value, torch's 1), its derivative from the moved value
    (`tanh`), and a GELU as 0.5 z (1 + t) with t, its tanh (so) or its erf, rounded
    otherwise before the sum, where it cancels for negative z (two libraries' GELUs differ
    there by thousands of ulps of the result). The same function in exact arithmetic; its
    derivative is autograd's of that formula. (A tanh MLP port's
    initial outputs in float64: XLA's at 1.02x the spread of members that left tanh as
    torch rounds it, 2026-11-26.) A batch norm in training takes its sums as `batch_norm`
    (_batch_norm_summed) takes them; with `layer_norm` (_layer_norm_fast), a layer norm
    computes its variance so."""
    functional = torch.nn.functional
    tanhs = {torch.tanh, torch.Tensor.tanh, functional.tanh}

    class Rounded(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in tanhs:
                return tanh(args[0] if args else kwargs["input"])
            if func is functional.gelu:
                z = args[0]
                approximate = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
                if approximate == "tanh":
                    t = tanh(SQRT_2_OVER_PI * (z + GELU_TANH_CUBIC * z * z * z))
                else:
                    t = moved(torch.erf(z / math.sqrt(2)))
                return 0.5 * z * (1 + t)
            return _norm_or(torch, batch_norm, layer_norm, func, args, kwargs)

    return Rounded()


def _norm_or(torch, batch_norm, layer_norm, func, args, kwargs):
    """func(*args, **kwargs), but for torch.nn.functional.batch_norm in training
    `batch_norm`, and for torch.nn.functional.layer_norm `layer_norm` (each where given)."""
    if func is torch.nn.functional.batch_norm and batch_norm is not None:
        bound = _BATCH_NORM.bind(*args, **kwargs)
        bound.apply_defaults()
        if bound.arguments["training"]:
            return batch_norm(**bound.arguments)
    if func is torch.nn.functional.layer_norm and layer_norm is not None:
        bound = _LAYER_NORM.bind(*args, **kwargs)
        bound.apply_defaults()
        return layer_norm(**bound.arguments)
    return func(*args, **kwargs)


def _no_dropout(torch):
    """A TorchFunctionMode in which every dropout (port.dropout_functions: nn.Dropout's and a
    forward's own calls) gives its input back, as at p = 0: a port runs with dropout off in
    both frameworks (adapters/jax_port.py, flax's Dropout deterministic), since each would
    draw its own masks."""
    from torch.overrides import TorchFunctionMode

    functions = port.dropout_functions(torch)
    attention = torch.nn.functional.scaled_dot_product_attention

    class NoDropout(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in functions:
                return args[0] if args else kwargs["input"]
            if func is attention:  # its own dropout_p (HF's sdpa attention passes the config's)
                args, kwargs = port.attention_without_dropout(args, kwargs)
            return func(*args, **kwargs)

    return NoDropout()


def _flax_variance(torch, problem, variances=None):
    """A TorchFunctionMode under which the norms compute their variance as flax's do by
    default, E[x^2] - E[x]^2 (use_fast_variance), with torch's own sums: a training pass's
    batch norms where the problem's port_fast_variance, and every layer norm where its
    port_layer_norm_fast; the reference and members computing flax's behaviour on a port
    whose flax module does (harness/known_differences.yaml flax-batch-norm-fast-variance,
    flax-layer-norm-fast-variance), over the whole run. None where neither."""
    if not (problem.port_fast_variance or problem.port_layer_norm_fast):
        return None
    batch_norm = _batch_norm_summed(torch, None, fast=True, variances=variances) if problem.port_fast_variance else None
    layer_norm = _layer_norm_fast(torch, None) if problem.port_layer_norm_fast else None

    class Fast(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return _norm_or(torch, batch_norm, layer_norm, func, args, kwargs or {})

    return Fast()


_LAYER_NORM = inspect.Signature(
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default in (
            ("input", inspect.Parameter.empty),
            ("normalized_shape", inspect.Parameter.empty),
            ("weight", None),
            ("bias", None),
            ("eps", 1e-5),
        )
    ]
)  # torch.nn.functional.layer_norm's


def _again(moved):
    """A member's rounding once more (`moved`, _jitter), or none (the reference's)."""
    return (lambda value: value) if moved is None else moved


def _fast_variance(torch, mean, mean_of_squares, again):
    """The variance as flax's norms take it by default (flax/linen/normalization.py
    _compute_stats, use_fast_variance): max(0, E[x^2] - E[x]^2), E[x]^2 rounded `again`."""
    return torch.clamp(mean_of_squares - again(mean * mean), min=0)


def _layer_norm_fast(torch, moved):
    """torch.nn.functional.layer_norm with the variance over each example's features taken
    as flax's LayerNorm takes it by default (flax/linen/normalization.py _compute_stats and
    _normalize): max(0, E[x^2] - E[x]^2), then (x - E[x]) * (rsqrt(var + eps) * scale) +
    bias. Over few features whose mean is large beside their spread the difference of two
    squares cancels, in float64 too: a width-2 layer norm's float64 twin was 3.8x to 31x
    the spread of members taking torch's E[(x - E[x])^2] (port seed 20261402, draws
    143-145). With `moved` (a member's rounding once more, _jitter), each of its
    intermediate arrays is rounded otherwise, as XLA's fusion rounds it: the cancellation
    magnifies the rounding of the squares and their means alike, which reordering two
    terms does not move."""
    again = _again(moved)

    def layer_norm(input, normalized_shape, weight, bias, eps):
        dims = tuple(range(-len(tuple(normalized_shape)), 0))
        mean = again(input.mean(dim=dims, keepdim=True))
        var = _fast_variance(torch, mean, again(again(input * input).mean(dim=dims, keepdim=True)), again)
        mul = torch.rsqrt(again(var + eps))
        if weight is not None:
            mul = mul * weight
        out = again(input - mean) * mul
        return out + bias if bias is not None else out

    return layer_norm


# XLA's CPU reductions add one term after another over arrays of up to 4,096 values (a
# float64 mean over one channel of 40 x 7 x 6 values: up to 12 ulps from the exact value;
# over 4,200 values or more: within 3, as pairwise sums do), measured on jax 0.10.2
# (docs/findings.md); a member's batch norm sums so up to twice that size.
SEQUENTIAL_VALUES = 8192
# In float32 only up to the switch itself: there XLA's float32 mean is pairwise-accurate from
# about 4,096 values on ((64, 8, 8, 1) 1.0 ulp, (21, 8, 10, 4) 1.3, where one term after
# another lands 14), and members summing so would be wider than the run they calibrate: flax's
# fast variance over 21 x 8 x 10 x 4 values, 3.87x the pairwise members' spread, passed within
# theirs (FAST_VARIANCE_DRAW, tests/test_port.py). Below it XLA lands up to one term after
# another's ((12, 13, 10, 1) 10-13 ulps, sequential 11-14; (97, 7, 6, 1) 5.7, sequential 21).
SEQUENTIAL_VALUES_FLOAT32 = 4096

_BATCH_NORM = inspect.Signature(
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default in (
            ("input", inspect.Parameter.empty),
            ("running_mean", inspect.Parameter.empty),
            ("running_var", inspect.Parameter.empty),
            ("weight", None),
            ("bias", None),
            ("training", False),
            ("momentum", 0.1),
            ("eps", 1e-5),
        )
    ]
)  # torch.nn.functional.batch_norm's


def _batch_norm_summed(torch, rng, fast: bool = False, moved=None, variances=None):
    """torch.nn.functional.batch_norm in training, its long sums (the batch's mean and
    variance forward; the scale's, the bias's and the input's gradients backward, each over
    the batch and the pixels) taken pairwise over the terms in a seeded order. torch's own
    CPU kernel adds them one after the other, whose rounding does not move when the examples
    are permuted: float64 batch norm over 128 x 28 x 28 values was 950 to 1,000 ulps from
    the exact value in torch and in members permuting its examples alike, and 1 ulp in XLA
    and NumPy, which sum pairwise; an honest CNN port on MNIST had flax's float64 twin 1.05x
    to 1.69x the spread of such members (issue 52). Members summing as those libraries do
    span them. The same function in exact arithmetic; the running statistics updated as
    torch updates them (the unbiased variance). `fast`: the batch's variance as
    max(0, E[x^2] - E[x]^2) (flax's use_fast_variance), with `moved` (a member's) its
    squares and means rounded otherwise, as XLA's fusion may: over a channel whose mean is
    large beside its spread the difference cancels, in float64 too (port seed 20261405,
    draw 99), and reordering the sums does not move what it magnifies. No `rng`: the terms
    in their order.

    Over a small batch (SEQUENTIAL_VALUES values or fewer in the batch norm's input), a
    float64 member adds each channel's terms one after another in its seeded order
    (torch.cumsum), as XLA does there: its float64 mean over 40 x 7 x 6 values of one channel
    lands up to 12 ulps from the exact value, where pairwise sums land within 2, and flax's
    twin of such a port failed math parity at 1.41x the pairwise members' spread (port seed
    20261409, draws 39-44; docs/findings.md). A float32 member, up to
    SEQUENTIAL_VALUES_FLOAT32, sums as float32 sums one term after another
    (_one_after_another; torch's CPU cumsum accumulates float32 in double), as XLA's float32
    mean does: 13 ulps from the exact value over 12 x 13 x 10
    values of one channel, where pairwise sums land within 2, and flax's float32 loss curve
    of such a port, its variance E[x^2] - E[x]^2 cancelling, failed at 1.02x the spread of
    members summing pairwise (port seed 20261502, draw 471).

    `variances` (a dict): each pass's batch variance, as computed here, by the id of the
    running variance it updates, for _store_biased_variance to store."""
    again = _again(moved)

    def ordered(a):  # index_select: the same terms as a[:, order], a quarter of its time on a CNN's (C, M)
        return a if rng is None else torch.index_select(a, 1, torch.from_numpy(rng.permutation(a.shape[1])).to(a.device))

    class Summed(torch.autograd.Function):
        """(C, M) -> (C,): each row summed pairwise (torch.sum), or one term after another
        (`sequential`), its terms in a seeded order."""

        @staticmethod
        def forward(ctx, a, sequential=False):
            ctx.width = a.shape[1]
            terms = ordered(a)
            if not sequential:
                return terms.sum(dim=1)
            return torch.cumsum(terms, dim=1)[:, -1] if terms.dtype == torch.float64 else _one_after_another(torch, terms)

        @staticmethod
        def backward(ctx, grad):
            return grad[:, None].expand(-1, ctx.width), None

    class Broadcast(torch.autograd.Function):
        """A per-channel vector broadcast over x's shape; its gradient summed back as Summed sums."""

        @staticmethod
        def forward(ctx, v, like):
            return v.reshape(1, -1, *([1] * (like.ndim - 2))).expand(like.shape).clone()

        @staticmethod
        def backward(ctx, grad):
            return per_channel(grad), None

    def per_channel(a):
        sequential = rng is not None and a.numel() <= (SEQUENTIAL_VALUES if a.dtype == torch.float64 else SEQUENTIAL_VALUES_FLOAT32)
        return Summed.apply(a.transpose(0, 1).reshape(a.shape[1], -1), sequential)

    def batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps):
        count = input.numel() // input.shape[1]
        mean = per_channel(input) / count
        centred = input - Broadcast.apply(mean, input)
        if fast:
            var = _fast_variance(torch, mean, again(again(per_channel(again(input * input))) / count), again)
        else:
            var = per_channel(centred * centred) / count
        out = centred * Broadcast.apply(1 / torch.sqrt(var + eps), input)
        if weight is not None:
            out = out * Broadcast.apply(weight, input)
        if bias is not None:
            out = out + Broadcast.apply(bias, input)
        with torch.no_grad():
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
            if running_var is not None:
                unbiased = var.detach() * (count / (count - 1)) if count > 1 else var.detach()
                running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
                if variances is not None:
                    variances[id(running_var)] = var.detach()
        return out

    return batch_norm


def _one_after_another(torch, terms):
    """Each row of `terms` (float32) summed as float32 sums one term after another round: the
    exact partial sums (torch.cumsum in float64), and at each term the rounding of adding it
    in float32 to its partial sum rounded to float32, the errors added up exactly. torch's CPU
    cumsum of float32 accumulates in double, so it cannot sum so itself; a loop of float32
    additions lands where this does (within a few ulps over 360 to 4,000 terms, the same
    worst cases; tests/test_port.py)."""
    wide = terms.double()
    partial = torch.cumsum(wide, dim=1)
    before = torch.nn.functional.pad(partial[:, :-1], (1, 0)).float()
    errors = ((before + terms).double() - (before.double() + wide)).sum(dim=1)
    return (partial[:, -1] + errors).to(terms.dtype)


def _store_biased_variance(torch, model, path, variances: dict) -> None:
    """The reference computing flax's batch norm formula (harness/known_differences.yaml
    flax-batch-norm-biased-running-var; harness/inputs/library.py): after each training
    forward pass of each batch norm, its running variance is the one flax stores,
    (1 - momentum) * before + momentum * the batch's biased variance, where torch stored the
    unbiased one. The user's code is not touched: hooks on its modules.

    The batch's variance is the one the pass normalized with, as flax stores the variance it
    normalized with (flax/linen/normalization.py BatchNorm): where _batch_norm_summed took
    it (a member's, or flax's E[x^2] - E[x]^2), the one it left in `variances`; otherwise
    torch's. Over a channel whose mean is large beside its spread E[x^2] - E[x]^2 cancels:
    a port whose ReLU left 291 of a one-channel batch norm's 360 values equal had flax's
    float64 twin 1.6x the spread of members storing torch's two-pass variance (8.1x with
    their sums pairwise), in bn1.running_var; its float32 run was 30x the float32
    tolerance there (port seed 20261411, draw 162)."""
    for name, part in model.named_modules():
        if not isinstance(part, torch.nn.modules.batchnorm._BatchNorm) or not part.track_running_stats:
            continue
        if part.momentum is None:
            raise port.PortError(f"{path}: batch norm {name!r} keeps a cumulative average (momentum=None): no library formula is computed for it")
        before: dict = {}

        def keep(module, inputs, before=before):
            if module.training:
                before["var"] = module.running_var.detach().clone()
                variances.clear()

        def store(module, inputs, output, before=before):
            if module.training and "var" in before:
                with torch.no_grad():
                    biased = variances.pop(id(module.running_var), None)
                    if biased is None:
                        x = inputs[0]
                        biased = x.detach().var(dim=[d for d in range(x.ndim) if d != 1], unbiased=False)
                    # a new tensor, not written in place: autograd holds the old one for the backward pass
                    module.running_var = (1 - module.momentum) * before.pop("var") + module.momentum * biased

        part.register_forward_pre_hook(keep)
        part.register_forward_hook(store)


def _keeper(outputs: dict, name: str):
    """A forward hook keeping a module's floating output by name: its first array (port.first_array)."""

    def keep(module, inputs, output):
        output = port.first_array(output)
        if hasattr(output, "is_floating_point") and output.is_floating_point():
            outputs[name] = output

    return keep


def tensors(model) -> dict[str, np.ndarray]:
    """Every floating tensor of the user's module by its state_dict name, a tied one once
    (port.untied), as NumPy (its own dtype)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in port.untied(model.inner.state_dict()).items()}


def trained(model) -> list[tuple[str, object]]:
    """The trained tensors (named_parameters), in the optimizer's order."""
    return list(model.inner.named_parameters())
