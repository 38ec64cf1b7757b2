"""The JAX adapter: the spec's network in flax.linen (adapters/jax_layers.py), a pure loss
function, jax.value_and_grad, optax updates.

Eager mode jits one step and calls it once per step from Python. Fast mode jits a run of
steps: a `lax.fori_loop` with a static trip count (lowered to a scan) over the same update,
the parameters, optimizer state and loss log donated, compiled ahead of time in warm-up
for every (steps, batch size) run the plan asks for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapters import jax_defects, jax_layers, jax_port, jax_probes
from adapters.protocol import State
from harness.core.errors import Unsupported
from harness.core.registry import BF16, FLOAT64, TF32
from harness.reference import network

NAME = "jax"
# XLA reads this when its backend starts: no atomics-based (run-to-run varying) GPU kernels.
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"
FAST_MODE = "jit of a lax.fori_loop over many steps (static trip count: a scan), params, optimizer state and loss log donated, compiled ahead of time"


def _jax(precision: str | None = None):
    """jax, with XLA's deterministic flag set before its first import (XLA reads its flags
    once, when its backend starts), and, given a run's precision, its matmul precision and
    x64 mode set for that run."""
    flags = os.environ.get("XLA_FLAGS", "")
    if DETERMINISTIC_FLAG not in flags.split():
        os.environ["XLA_FLAGS"] = f"{flags} {DETERMINISTIC_FLAG}".strip()
    import jax

    if precision is None:
        return jax
    # float32 dots on Ampere and later default to TF32 on the GPU: ask for full precision,
    # or for TF32 by name when that variant is the point.
    jax.config.update("jax_default_matmul_precision", "tensorfloat32" if precision == TF32 else "highest")
    # The float64 twin needs x64; every other run must not have it, or optax's float32
    # arithmetic (its bias corrections) would silently become float64.
    jax.config.update("jax_enable_x64", precision == FLOAT64)
    return jax


def _platform(device: str) -> str:
    return "gpu" if device == "gpu" else "cpu"


def unavailable(key) -> str | None:
    device = key.device
    try:
        jax = _jax(key.precision)
        import flax  # noqa: F401
        import optax  # noqa: F401
    except ImportError as exc:
        return f"jax, flax or optax is not installed ({exc})"
    try:
        jax.devices(_platform(device))
    except RuntimeError as exc:
        return f"jax finds no {device} device ({exc})"
    return None


def describe(key) -> dict[str, Any]:
    jax = _jax(key.precision)
    import flax
    import jaxlib
    import optax

    dev = jax.devices(_platform(key.device))[0]
    return {
        "library": "jax",
        "version": f"{jax.__version__} (jaxlib {jaxlib.__version__}, flax {flax.__version__}, optax {optax.__version__})",
        "device_name": dev.device_kind,
        "math_mode": {
            "jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision),
            "jax_enable_x64": bool(jax.config.jax_enable_x64),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            **({"flax_dtype": "bfloat16"} if key.precision == BF16 else {}),
        },
        "threads": int(os.environ.get("HARNESS_THREADS") or os.cpu_count() or 0) or None,  # a cap: harness/execute/executors.py
        **({"fast_mode": FAST_MODE} if key.mode == "fast" else {}),
    }


@dataclass
class Trainer:
    problem: Any
    device: str
    dtype: str
    data: dict[str, Any]
    params: Any  # flax's variables: {"params": ..., "batch_stats": ...}
    opt_state: Any
    train_step: Any
    predict_fn: Any
    loss_log: Any
    mode: str = "eager"
    run_of_steps: Any = None  # fast mode: (steps, batch size) -> a jitted loop
    compiled: dict = field(default_factory=dict)  # fast mode: (steps, batch size) -> executable
    key: Any = None  # the run's RunKey (build_again's)
    functions: tuple = ()  # _functions' (tx, step, predict, loop), which build_again reuses


def put(problem, key) -> dict[str, Any]:
    jax = _jax(key.precision)
    dev = jax.devices(_platform(key.device))[0]
    return jax.device_put(problem.host_arrays(key.dtype, np.int32), dev)


def cross_entropy(logits, labels):
    """Per-example softmax cross-entropy with integer labels, as optax's
    `softmax_cross_entropy_with_integer_labels` computes it (logsumexp minus the label's
    logit), with the label's logit picked by a one-hot dot instead of a gather. Adding exact
    zeros changes no bit, so the values agree with optax's; but the gradient is a product,
    not a scatter-add, which XLA's deterministic GPU mode (--xla_gpu_deterministic_ops)
    would run as a serial loop with one iteration per example."""
    jax = _jax()
    import jax.numpy as jnp

    one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(logits * one_hot, axis=-1)


def _rmsprop(optax, lr, opt):
    """torch.optim.RMSprop's math from optax's parts (harness/optimizers/rmsprop.py): eps
    outside the square root, v from 0, the momentum trace before the rate."""
    momentum = [optax.trace(decay=opt.momentum)] if opt.momentum else []
    return optax.chain(
        optax.scale_by_rms(decay=opt.alpha, eps=opt.eps, eps_in_sqrt=False, initial_scale=0.0), *momentum, optax.scale_by_learning_rate(lr)
    )


# How optax expresses each optimizer kind, at rate `lr` (a number or a schedule).
OPTIMIZERS = {
    "adam": lambda optax, lr, o: optax.adam(lr, b1=o.beta1, b2=o.beta2, eps=o.eps),
    "adamw": lambda optax, lr, o: optax.adamw(lr, b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay),
    "sgd": lambda optax, lr, o: optax.sgd(lr, momentum=o.momentum or None, nesterov=o.nesterov),
    "rmsprop": _rmsprop,
}


def transformation(opt):
    """The spec's optimizer as optax builds it: clip_by_global_norm, then
    add_decayed_weights for a coupled decay, chained before the kind's rule (OPTIMIZERS:
    optax.sgd with its trace for momentum, and optax has no dampening; optax.adam; optax.adamw
    with its decoupled decay; RMSprop from optax's parts), at the spec's rate or its schedule
    (optax.exponential_decay with staircase=True, optax.warmup_cosine_decay_schedule), which
    optax evaluates at the update count, from 0. A plain spec gets optax.sgd or optax.adam
    alone, as it always did."""
    import optax

    if opt.kind not in OPTIMIZERS:
        raise Unsupported(f"jax: no optax translation of optimizer {opt.kind!r}")
    rule = OPTIMIZERS[opt.kind](optax, _rate(optax, opt), opt)
    before = []
    if opt.clip_global_norm is not None:
        before.append(optax.clip_by_global_norm(opt.clip_global_norm))
    if opt.weight_decay and opt.coupled_decay:
        before.append(optax.add_decayed_weights(opt.weight_decay))
    return optax.chain(*before, rule) if before else rule


def _rate(optax, opt):
    """The spec's rate, or its schedule as optax builds it."""
    if opt.schedule is not None and opt.schedule.kind == "step":
        return optax.exponential_decay(opt.lr, transition_steps=opt.schedule.every, decay_rate=opt.schedule.gamma, staircase=True)
    if opt.schedule is not None and opt.schedule.kind == "warmup_cosine":
        s = opt.schedule
        return optax.warmup_cosine_decay_schedule(
            init_value=opt.lr * s.init_fraction,
            peak_value=opt.lr,
            warmup_steps=s.warmup_steps,
            decay_steps=s.decay_steps,
            end_value=opt.lr * s.end_fraction,
        )
    return opt.lr


def schedule_rates(opt, steps: int) -> list[float]:
    """The learning rate of updates 0 .. steps - 1 as optax computes it inside the float64
    twin's update: the schedule jitted, at its int32 update count, under x64 (float32 values:
    harness/known_differences.yaml, optax-schedule-float32), x64 on within jax's own context."""
    import optax

    jax = _jax()
    import jax.numpy as jnp

    rate = _rate(optax, opt)
    if not callable(rate):
        return [float(rate)] * steps
    with jax.enable_x64(True):
        at = jax.jit(rate)
        return [float(at(jnp.int32(t))) for t in range(steps)]


def _masks_at(problem, data, t, size: int):
    """Step t's dropout masks, cut to its batch of `size` rows (t may be traced)."""
    jax = _jax()
    found = {}
    for key, value in data.items():
        if key.startswith("mask:"):
            found[key.removeprefix("mask:")] = jax.lax.dynamic_index_in_dim(value, t, keepdims=False)[:size]
    return found


def _network(problem, dtype: str, compute: str | None = None):
    """The network's module, called apply(variables, x, masks, train, mutable=...): the
    spec's layers (adapters/jax_layers.py) or a port's own flax module (adapters/jax_port.py),
    made for a run in `dtype` (its parameters'), computing in `compute` (None: the same)."""
    return jax_port.Network(problem, dtype, compute) if problem.port is not None else jax_layers.module(problem.spec, compute)


def _variables(problem, tensors: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """flax's variables holding tensors by the spec's names (a port's: its torch names)."""
    if problem.port is not None:
        return jax_port.variables(problem, tensors, dtype)
    return jax_layers.variables(problem.spec, tensors, dtype)


def _tensors(problem, tree: dict[str, Any]) -> dict[str, np.ndarray]:
    """The tensors by the spec's names and layout, from flax's variables."""
    if problem.port is not None:
        return jax_port.tensors(problem, tree)
    return jax_layers.tensors(problem.spec, tree)


def _functions(problem, dtype: str, compute: str | None = None):
    """The pure forward, loss and jitted train step of a spec: a flax.linen network
    (adapters/jax_layers.py) and an optax optimizer, its variables carried as
    {"params": ..., "batch_stats": ...}."""
    jax = _jax()
    import jax.numpy as jnp
    import optax

    spec = problem.spec
    net = _network(problem, dtype, compute)
    stats = "batch_stats" in _variables(problem, problem.initial_params, "float32") if problem.port is not None else jax_layers.has_stats(spec)
    l2 = network.l2_scale(spec.loss, len(problem.x_train))
    full_size = len(problem.x_train)

    def forward(variables, x, masks, train: bool):
        if train and stats:
            out, changed = net.apply(variables, x, masks, True, mutable=["batch_stats"])
            return out, changed["batch_stats"]
        return net.apply(variables, x, masks, train), variables.get("batch_stats")

    def loss_fn(params, batch_stats, x, y, masks):
        variables = {"params": params, **({"batch_stats": batch_stats} if stats else {})}
        out, new_stats = forward(variables, x, masks, True)
        out = jax_probes.loss_input(out, dtype, compute)
        if spec.loss.kind == "mse":
            per_example = (out - y) ** 2
        elif spec.loss.label_smoothing:
            targets = optax.smooth_labels(jax.nn.one_hot(y, out.shape[-1], dtype=out.dtype), spec.loss.label_smoothing)
            per_example = optax.softmax_cross_entropy(out, targets)
        else:
            per_example = cross_entropy(out, y)
        value = per_example.mean() if spec.loss.reduction == "mean" else per_example.sum()
        if l2:
            weights = jax_port.penalized(problem, params) if problem.port is not None else jax_layers.kernels(spec, params)
            value = value + l2 * sum(jnp.sum(w * w) for w in weights)
        return value, new_stats

    tx = transformation(spec.optimizer)

    def update(variables, opt_state, x, y, masks):
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, new_stats), grads = grad_fn(variables["params"], variables.get("batch_stats"), x, y, masks)
        updates, opt_state = tx.update(grads, opt_state, variables["params"])
        new = {"params": optax.apply_updates(variables["params"], updates)}
        if stats:
            new["batch_stats"] = new_stats
        return new, opt_state, loss

    def logged(variables, opt_state, log, t, x, y, masks):
        variables, opt_state, loss = update(variables, opt_state, x, y, masks)
        return variables, opt_state, log.at[t].set(loss)

    def full_batch_step(variables, opt_state, log, t, data):
        return logged(variables, opt_state, log, t, data["x"], data["y"], _masks_at(problem, data, t, full_size))

    def minibatch_step(variables, opt_state, log, t, data, epoch, start, size):
        rows = jax.lax.dynamic_slice(data["order"][epoch], (start,), (size,))
        return logged(variables, opt_state, log, t, data["x"][rows], data["y"][rows], _masks_at(problem, data, t, size))

    # The loss log is donated: written in place, not copied every step.
    if problem.batch_order is None:
        step = jax.jit(full_batch_step, donate_argnames="log")
    else:
        step = jax.jit(minibatch_step, static_argnames="size", donate_argnames="log")

    steps_per_epoch = len(problem.bounds)
    starts = np.asarray([start for start, _ in problem.bounds], dtype=np.int32)

    def run_of_steps(length: int, size: int):
        """`length` steps of batch size `size` from step t0, in one compiled loop."""

        def run(variables, opt_state, log, t0, data):
            def body(i, carry):
                variables, opt_state, log = carry
                t = t0 + i
                masks = _masks_at(problem, data, t, size)
                if problem.batch_order is None:
                    return logged(variables, opt_state, log, t, data["x"], data["y"], masks)
                epoch, within = t // steps_per_epoch, t % steps_per_epoch
                rows = jax.lax.dynamic_slice(data["order"][epoch], (jnp.asarray(starts)[within],), (size,))
                return logged(variables, opt_state, log, t, data["x"][rows], data["y"][rows], masks)

            return jax.lax.fori_loop(0, length, body, (variables, opt_state, log))

        return jax.jit(run, donate_argnums=(0, 1, 2))

    def predict(variables, x):
        return forward(variables, x, {}, False)[0]

    return tx, step, jax.jit(predict), run_of_steps


def build(problem, data: dict[str, Any], key) -> Trainer:
    return _built(problem, data, key, _functions(problem, key.dtype, jax_probes.compute_dtype(key)))


def build_again(trainer: Trainer) -> Trainer:
    """A fresh trainer of `trainer`'s problem, data and key, as `build` makes one, with its
    jitted functions: what they compiled is reused (a twin's re-anchored segments,
    harness/run/anchored.py, compile its step once, not once a segment)."""
    return _built(trainer.problem, trainer.data, trainer.key, trainer.functions)


def _built(problem, data: dict[str, Any], key, functions: tuple) -> Trainer:
    device, dtype, mode = key.device, key.dtype, key.mode
    jax = _jax(key.precision)
    dev = jax.devices(_platform(device))[0]
    tx, train_step, predict_fn, run_of_steps = functions
    params = jax.device_put(_variables(problem, problem.initial_params, dtype), dev)
    log = jax.device_put(np.zeros(problem.total_steps, dtype=dtype), dev)
    # Committed to the device like everything else: optax's step count comes out of tx.init
    # uncommitted, and the first step's committed output then misses the jit cache, so the
    # step would compile again inside the timed loop (docs/measurements.md).
    opt_state = jax.device_put(tx.init(params["params"]), dev)
    return Trainer(problem, device, dtype, data, params, opt_state, train_step, predict_fn, log, mode, run_of_steps, key=key, functions=functions)


# optax's names for the spec's optimizer moments (optax.scale_by_adam's mu and nu, optax.trace's trace)
OPTAX_MOMENTS = {"m": "mu", "v": "nu", "momentum": "trace"}


def load_state(trainer: Trainer, state: dict[str, np.ndarray], step: int) -> None:
    """Go on from a training state after `step` updates, as a checkpoint restores one: flax's
    variables, and optax's state with its update counts (the schedule's position too) and
    moments set by name (optax.tree.set)."""
    jax = _jax()
    import jax.numpy as jnp
    import optax

    params, moments = network.split_training_state(state)
    values = {OPTAX_MOMENTS[k]: _variables(trainer.problem, {**params, **m}, trainer.dtype)["params"] for k, m in moments.items()}
    if optax.tree.get_all_with_path(trainer.opt_state, "count"):
        values["count"] = jnp.asarray(step, dtype=jnp.int32)
    dev = jax.devices(_platform(trainer.device))[0]
    trainer.params = jax.device_put(_variables(trainer.problem, params, trainer.dtype), dev)
    trainer.opt_state = jax.device_put(optax.tree.set(trainer.opt_state, **values), dev)


def training_state(trainer: Trainer) -> dict[str, np.ndarray]:
    """The whole training state by the spec's names (the inverse of load_state): every tensor,
    and each optax moment of each trained tensor (`m/dense1.weight`, ...: optax.tree.get by
    name, laid out as flax's params)."""
    import optax

    problem = trainer.problem
    found = _tensors(problem, trainer.params)
    if problem.port is not None:  # a port's trained tensors: those of flax's params
        trained = set(found) - set(_stat_names(problem, trainer.params))
    else:
        trained = set(network.trained_names(problem.spec.model.placed))
    for moment, name in OPTAX_MOMENTS.items():
        held = optax.tree.get_all_with_path(trainer.opt_state, name)
        if len(held) != 1:
            continue
        tree = {**trainer.params, "params": held[0][1]}
        found.update({f"{moment}/{k}": a for k, a in _tensors(problem, tree).items() if k in trained})
    return found


def _stat_names(problem, variables) -> list[str]:
    """A port's tensors that flax keeps outside `params` (batch statistics): those whose
    values change when every leaf outside `params` is marked."""
    import jax

    marked = {k: (v if k == "params" else jax.tree_util.tree_map(lambda a: np.full(np.shape(a), np.nan), v)) for k, v in variables.items()}
    return [k for k, a in _tensors(problem, marked).items() if np.isnan(a).any()]


def _step_arguments(trainer: Trainer, params, opt_state, log, t: int) -> tuple[tuple, dict]:
    if trainer.problem.batch_order is None:
        return (params, opt_state, log, t, trainer.data), {}
    epoch, start, stop = trainer.problem.batch_slice(t)
    return (params, opt_state, log, t, trainer.data, epoch, start), {"size": stop - start}


def _call_step(trainer: Trainer, params, opt_state, log, t: int):
    args, kwargs = _step_arguments(trainer, params, opt_state, log, t)
    return trainer.train_step(*args, **kwargs)


def defects(trainer: Trainer) -> list[dict[str, Any]]:
    """The catalogued library defects a float32 run's step meets on its device, measured
    (adapters/jax_defects.py): those catalogued are XLA:CPU's, so none off the CPU."""
    if trainer.device != "cpu":
        return []
    jax = _jax()
    args, kwargs = _step_arguments(trainer, trainer.params, trainer.opt_state, jax.numpy.zeros_like(trainer.loss_log), 0)
    return jax_defects.measured(trainer.train_step, args, kwargs, jax.devices(_platform(trainer.device))[0])


def warm_up(trainer: Trainer, plan=()) -> None:
    """Compile what training will call, without running it on the trainer's state: eager,
    the step once for every batch size the schedule uses (the step is a pure function,
    run on a scratch log); fast, every (steps, batch size) loop of the plan, ahead of time."""
    jax = _jax()
    if trainer.mode == "fast":
        for start, stop in plan:
            for first, length, size in trainer.problem.runs_of_one_size(start, stop):
                if (length, size) not in trainer.compiled:
                    args = (trainer.params, trainer.opt_state, trainer.loss_log, np.int32(first), trainer.data)
                    trainer.compiled[length, size] = trainer.run_of_steps(length, size).lower(*args).compile()
    else:
        seen = set()
        for t, (start, stop) in enumerate(trainer.problem.bounds):
            if stop - start not in seen:
                seen.add(stop - start)
                scratch = jax.numpy.zeros_like(trainer.loss_log)
                jax.block_until_ready(_call_step(trainer, trainer.params, trainer.opt_state, scratch, t))
    jax.block_until_ready(trainer.predict_fn(trainer.params, trainer.data["x"][:1]))


def train(trainer: Trainer, start: int, stop: int) -> None:
    if trainer.mode == "fast":
        for first, length, size in trainer.problem.runs_of_one_size(start, stop):
            loop = trainer.compiled.get((length, size))
            if loop is None:  # a range the warm-up was not told of: compiled here, and timed
                loop = trainer.compiled[length, size] = trainer.run_of_steps(length, size)
            trainer.params, trainer.opt_state, trainer.loss_log = loop(
                trainer.params, trainer.opt_state, trainer.loss_log, np.int32(first), trainer.data
            )
        return
    for t in range(start, stop):
        trainer.params, trainer.opt_state, trainer.loss_log = _call_step(trainer, trainer.params, trainer.opt_state, trainer.loss_log, t)


def synchronize(trainer: Trainer) -> None:
    _jax().block_until_ready((trainer.params, trainer.opt_state, trainer.loss_log))


def state(trainer: Trainer, upto: int) -> State:
    params = _tensors(trainer.problem, trainer.params)
    return State(np.asarray(trainer.loss_log, dtype=np.float64)[:upto], params)


def layer_outputs(trainer: Trainer, x: np.ndarray, masks: dict) -> dict[str, np.ndarray]:
    """Each layer's output of a training-mode forward pass of x (dropout masks given); the
    trainer's variables are not changed (flax returns the new statistics apart)."""
    jax = _jax()
    dev = jax.devices(_platform(trainer.device))[0]
    inputs = jax.device_put(_inputs(trainer, x), dev)
    if trainer.problem.port is not None:
        return jax_port.Network(trainer.problem, trainer.dtype, jax_probes.compute_dtype(trainer.key)).intermediates(trainer.params, inputs)
    net = jax_layers.module(trainer.problem.spec, jax_probes.compute_dtype(trainer.key))
    masks = {name: jax.device_put(m.astype(trainer.dtype), dev) for name, m in masks.items()}
    _, found = net.apply(trainer.params, inputs, masks, True, mutable=["batch_stats", "intermediates"])
    return {name.removeprefix("out_"): np.asarray(values[0], dtype=np.float64) for name, values in found["intermediates"].items()}


computed_in = jax_probes.computed_in  # where a bf16 run computes in bfloat16 (RecordsComputedIn)


def _inputs(trainer: Trainer, x: np.ndarray) -> np.ndarray:
    """x in the run's dtype, or a text's token ids as int32 (nn.Embed refuses floats)."""
    return x.astype(np.int32 if trainer.problem.spec.model.tokens is not None else trainer.dtype)


def predict(trainer: Trainer, x: np.ndarray) -> np.ndarray:
    jax = _jax()
    inputs = jax.device_put(_inputs(trainer, x), jax.devices(_platform(trainer.device))[0])
    return np.asarray(trainer.predict_fn(trainer.params, inputs), dtype=np.float64)
