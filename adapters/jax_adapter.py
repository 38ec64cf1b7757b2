"""The JAX adapter: a pure loss function, jax.value_and_grad, optax updates.

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

from adapters.protocol import State
from harness.core.registry import FLOAT64, TF32
from harness.reference import xp_mlp

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
        import optax  # noqa: F401
    except ImportError as exc:
        return f"jax or optax is not installed ({exc})"
    try:
        jax.devices(_platform(device))
    except RuntimeError as exc:
        return f"jax finds no {device} device ({exc})"
    return None


def describe(key) -> dict[str, Any]:
    jax = _jax(key.precision)
    import jaxlib
    import optax

    dev = jax.devices(_platform(key.device))[0]
    return {
        "library": "jax",
        "version": f"{jax.__version__} (jaxlib {jaxlib.__version__}, optax {optax.__version__})",
        "device_name": dev.device_kind,
        "math_mode": {
            "jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision),
            "jax_enable_x64": bool(jax.config.jax_enable_x64),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        },
        "threads": os.cpu_count(),
        **({"fast_mode": FAST_MODE} if key.mode == "fast" else {}),
    }


@dataclass
class Trainer:
    problem: Any
    device: str
    dtype: str
    data: dict[str, Any]
    params: Any
    opt_state: Any
    train_step: Any
    predict_fn: Any
    loss_log: Any
    mode: str = "eager"
    run_of_steps: Any = None  # fast mode: (steps, batch size) -> a jitted loop
    compiled: dict = field(default_factory=dict)  # fast mode: (steps, batch size) -> executable


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


def _functions(problem):
    """The pure forward, loss and jitted train step of a spec."""
    jax = _jax()
    import jax.numpy as jnp
    import optax

    spec = problem.spec
    acts = {"relu": jax.nn.relu, "tanh": jnp.tanh, "identity": lambda z: z}
    activations = [acts[layer.activation] for layer in spec.model.layers]
    l2 = xp_mlp.l2_scale(spec.loss, len(problem.x_train))

    def forward(params, x):
        for (w, b), act in zip(params, activations):
            x = act(x @ w + b)
        return x

    def loss_fn(params, x, y):
        out = forward(params, x)
        if spec.loss.kind == "mse":
            per_example = (out - y) ** 2
        else:
            per_example = cross_entropy(out, y)
        value = per_example.mean() if spec.loss.reduction == "mean" else per_example.sum()
        if l2:
            value = value + l2 * sum(jnp.sum(w * w) for w, _ in params)
        return value

    opt = spec.optimizer
    if opt.kind == "adam":
        tx = optax.adam(opt.lr, b1=opt.beta1, b2=opt.beta2, eps=opt.eps)
    else:
        tx = optax.sgd(opt.lr)

    def update(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def logged(params, opt_state, log, t, x, y):
        params, opt_state, loss = update(params, opt_state, x, y)
        return params, opt_state, log.at[t].set(loss)

    def full_batch_step(params, opt_state, log, t, data):
        return logged(params, opt_state, log, t, data["x"], data["y"])

    def minibatch_step(params, opt_state, log, t, data, epoch, start, size):
        rows = jax.lax.dynamic_slice(data["order"][epoch], (start,), (size,))
        return logged(params, opt_state, log, t, data["x"][rows], data["y"][rows])

    # The loss log is donated: written in place, not copied every step.
    if problem.batch_order is None:
        step = jax.jit(full_batch_step, donate_argnames="log")
    else:
        step = jax.jit(minibatch_step, static_argnames="size", donate_argnames="log")

    steps_per_epoch = len(problem.bounds)
    starts = np.asarray([start for start, _ in problem.bounds], dtype=np.int32)

    def run_of_steps(length: int, size: int):
        """`length` steps of batch size `size` from step t0, in one compiled loop."""

        def run(params, opt_state, log, t0, data):
            def body(i, carry):
                params, opt_state, log = carry
                t = t0 + i
                if problem.batch_order is None:
                    return logged(params, opt_state, log, t, data["x"], data["y"])
                epoch, within = t // steps_per_epoch, t % steps_per_epoch
                rows = jax.lax.dynamic_slice(data["order"][epoch], (jnp.asarray(starts)[within],), (size,))
                return logged(params, opt_state, log, t, data["x"][rows], data["y"][rows])

            return jax.lax.fori_loop(0, length, body, (params, opt_state, log))

        return jax.jit(run, donate_argnums=(0, 1, 2))

    return tx, step, jax.jit(forward), run_of_steps


def build(problem, data: dict[str, Any], key) -> Trainer:
    device, dtype, mode = key.device, key.dtype, key.mode
    jax = _jax(key.precision)
    dev = jax.devices(_platform(device))[0]
    tx, train_step, predict_fn, run_of_steps = _functions(problem)
    params = jax.device_put([(w.astype(dtype), b.astype(dtype)) for w, b in problem.initial_params], dev)
    log = jax.device_put(np.zeros(problem.total_steps, dtype=dtype), dev)
    # Committed to the device like everything else: optax's step count comes out of tx.init
    # uncommitted, and the first step's committed output then missed the jit cache, so the
    # step compiled again inside the timed loop (0.36 s: 3 ms per step on 100-step runs).
    opt_state = jax.device_put(tx.init(params), dev)
    return Trainer(problem, device, dtype, data, params, opt_state, train_step, predict_fn, log, mode, run_of_steps)


def _call_step(trainer: Trainer, params, opt_state, log, t: int):
    if trainer.problem.batch_order is None:
        return trainer.train_step(params, opt_state, log, t, trainer.data)
    epoch, start, stop = trainer.problem.batch_slice(t)
    return trainer.train_step(params, opt_state, log, t, trainer.data, epoch, start, size=stop - start)


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
    params = [(np.asarray(w).copy(), np.asarray(b).copy()) for w, b in trainer.params]
    return State(np.asarray(trainer.loss_log, dtype=np.float64)[:upto], params)


def predict(trainer: Trainer, x: np.ndarray) -> np.ndarray:
    jax = _jax()
    inputs = jax.device_put(x.astype(trainer.dtype), jax.devices(_platform(trainer.device))[0])
    return np.asarray(trainer.predict_fn(trainer.params, inputs), dtype=np.float64)
