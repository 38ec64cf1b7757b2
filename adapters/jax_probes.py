"""Where a JAX run computes in bfloat16: its computation dtype, the outputs its loss takes,
and what it records for the diagnosis (adapters/jax_adapter.py uses and exports them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters import jax_layers
from harness.core.registry import BF16


def compute_dtype(key) -> str | None:
    """A run's computation dtype where it is not its parameters': a bf16 run's bfloat16."""
    return "bfloat16" if key is not None and key.precision == BF16 else None


def loss_input(out, dtype: str, compute: str | None):
    """The network's outputs the loss is taken on: a mixed-precision run's cast to its
    parameters' dtype (float32), as torch's autocast computes its losses and as flax's users
    learnt to (flax#677: bf16 training collapsed until log_softmax was taken in float32);
    any other run's as they are."""
    return out if compute is None else out.astype(dtype)


def computed_in(trainer: Any) -> dict[str, str]:
    """The dtype each layer's output and the loss's input come out in on step 0's batch, on
    the trainer's device (adapters/protocol.py RecordsComputedIn), and the lowest its trained
    parameters and optimizer state are held in (`parameters`, `optimizer state`: optax's
    moments, in a bf16 slip's mu_dtype; a port's alone)."""
    import jax
    import jax.numpy as jnp

    dtypes = [leaf.dtype for leaf in jax.tree.leaves(trainer.params.get("params", {}))]
    state = [leaf.dtype for leaf in jax.tree.leaves(trainer.opt_state) if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.ndim > 0]
    lowest = lambda found: str(min(found, key=lambda d: d.itemsize))  # noqa: E731
    held = {"parameters": lowest(dtypes), "optimizer state": lowest(state or dtypes)} if dtypes else {}
    if trainer.problem.port is not None:
        return held
    problem, compute = trainer.problem, compute_dtype(trainer.key)
    device = next(iter(jax.tree.leaves(trainer.params)[0].devices()))
    host = problem.host_arrays(trainer.dtype, np.int32)
    x, _ = problem.batch(host, 0)
    masks = jax.device_put(problem.step_masks(host, 0), device)
    net = jax_layers.module(problem.spec, compute)
    out, found = net.apply(trainer.params, jax.device_put(x, device), masks, True, mutable=["batch_stats", "intermediates"])
    layers = {name.removeprefix("out_"): str(values[0].dtype) for name, values in found["intermediates"].items()}
    return {**layers, "loss": str(loss_input(out, trainer.dtype, compute).dtype), **held}
