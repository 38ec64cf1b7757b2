"""Each layer kind of a spec in flax.linen's own modules, with optax for the updates, as a
careful person porting the model to JAX would write it, and the way between the spec's
named tensors and flax's variables.

Why linen and not nnx: linen's modules are pure functions of a variables pytree, which
jax.jit, lax.fori_loop and optax take as they are (the fast mode carries the variables
through a compiled loop); nnx's mutable objects would be split and merged around every
compiled call. Both hold the same layers (nnx.Conv, nnx.BatchNorm wrap the same math).

- images are NHWC, flax's layout: the input is reshaped to the spec's NCHW, then
  transposed; conv kernels are HWIO (the spec's OIHW transposed); `flatten` transposes back
  to NCHW before it reshapes, so the next dense layer sees the spec's order.
- conv2d padding: "SAME" and "VALID" are flax's own (its SAME is the spec's), explicit
  pairs are passed as they are.
- batch_norm: nn.BatchNorm with momentum 1 - m (flax's convention), the spec's eps, and
  use_fast_variance=False (the spec's variance, mean((x - mean)^2), not E[x^2] - mean^2).
  flax stores the biased running variance: a spec asking for the unbiased one meets the
  library difference catalogued in harness/known_differences.yaml.
- layer_norm: nn.LayerNorm with the spec's eps (flax's default is 1e-6) and
  use_fast_variance=False.
- gelu: nn.gelu(approximate=False); gelu_tanh: nn.gelu (its default, the tanh form).
- dropout: the harness's mask, multiplied in (nn.Dropout draws its own from an RNG).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.layers import ACTIVATED


def _padding(p):
    s = p.section
    if s.padding in ("same", "valid"):
        return s.padding.upper()
    return tuple(tuple(pair) for pair in s.padding)


def _activation(nn, jnp, name: str | None):
    return {
        "relu": nn.relu,
        "tanh": jnp.tanh,
        "gelu": lambda z: nn.gelu(z, approximate=False),
        "gelu_tanh": nn.gelu,
    }.get(name or "identity", lambda z: z)


def module(spec):
    """The spec's network as a flax.linen Module: __call__(x, masks, train)."""
    import flax.linen as nn
    import jax.numpy as jnp

    placed = spec.model.placed

    class Network(nn.Module):
        @nn.compact
        def __call__(self, x, masks, train: bool):
            first = placed[0].in_shape
            if len(first) == 3:
                x = x.reshape((x.shape[0], *first)).transpose(0, 2, 3, 1)
            for p in placed:
                kind, s = p.module.KIND, p.section
                if kind == "dense":
                    x = nn.Dense(s.width, name=p.name)(x)
                elif kind == "conv2d":
                    x = nn.Conv(s.filters, (s.kernel, s.kernel), strides=(s.stride, s.stride), padding=_padding(p), name=p.name)(x)
                elif kind == "max_pool":
                    x = nn.max_pool(x, (s.window, s.window), strides=(s.step, s.step), padding="VALID")
                elif kind == "avg_pool":
                    x = nn.avg_pool(x, (s.window, s.window), strides=(s.step, s.step), padding="VALID")
                elif kind == "flatten":
                    x = x.transpose(0, 3, 1, 2).reshape((x.shape[0], -1)) if x.ndim == 4 else x
                elif kind == "batch_norm":
                    norm = nn.BatchNorm(momentum=1 - s.momentum, epsilon=s.eps, use_fast_variance=False, name=p.name)
                    x = norm(x, use_running_average=not train)
                elif kind == "layer_norm":
                    x = nn.LayerNorm(epsilon=s.eps, use_fast_variance=False, name=p.name)(x)
                elif kind == "dropout":
                    if train:
                        mask = masks[p.name]
                        x = x * (mask.transpose(0, 2, 3, 1) if mask.ndim == 4 else mask)
                else:
                    raise ValueError(f"jax adapter: no translation of layer kind {kind!r}")
                x = _activation(nn, jnp, p.activation)(x)
                # Each layer's output in the spec's layout, kept only where "intermediates"
                # is asked for (layer_outputs): a no-op in training.
                self.sow("intermediates", f"out_{p.name}", x.transpose(0, 3, 1, 2) if x.ndim == 4 else x)
            return x

    return Network()


def has_stats(spec) -> bool:
    return any(p.module.KIND == "batch_norm" for p in spec.model.placed)


# The spec's tensor -> (flax collection, flax name, from the spec's layout, back to it)
_SAME = (lambda a: a, lambda a: a)
_OIHW_HWIO = (lambda a: a.transpose(2, 3, 1, 0), lambda a: a.transpose(3, 2, 0, 1))
SLOTS: dict[tuple[str, str], tuple[str, str, Any]] = {
    ("dense", "weight"): ("params", "kernel", _SAME),
    ("dense", "bias"): ("params", "bias", _SAME),
    ("conv2d", "weight"): ("params", "kernel", _OIHW_HWIO),
    ("conv2d", "bias"): ("params", "bias", _SAME),
    ("batch_norm", "scale"): ("params", "scale", _SAME),
    ("batch_norm", "bias"): ("params", "bias", _SAME),
    ("batch_norm", "running_mean"): ("batch_stats", "mean", _SAME),
    ("batch_norm", "running_var"): ("batch_stats", "var", _SAME),
    ("layer_norm", "scale"): ("params", "scale", _SAME),
    ("layer_norm", "bias"): ("params", "bias", _SAME),
}


def variables(spec, tensors: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """flax's variables ({"params": ..., "batch_stats": ...}) holding the spec's tensors."""
    found: dict[str, dict] = {"params": {}}
    for p in spec.model.placed:
        for local in p.local_names:
            collection, name, (into, _) = SLOTS[p.module.KIND, local]
            found.setdefault(collection, {}).setdefault(p.name, {})[name] = np.ascontiguousarray(into(tensors[f"{p.name}.{local}"])).astype(dtype)
    return found


def tensors(spec, found: dict[str, Any]) -> dict[str, np.ndarray]:
    """The spec's tensors by name and layout, from flax's variables."""
    out = {}
    for p in spec.model.placed:
        for local in p.local_names:
            collection, name, (_, back) = SLOTS[p.module.KIND, local]
            out[f"{p.name}.{local}"] = np.array(back(np.asarray(found[collection][p.name][name])))
    return out


def kernels(spec, params: dict[str, Any]) -> list[Any]:
    """The weights an L2 penalty sums, in the network's order."""
    return [params[p.name]["kernel"] for p in spec.model.placed if p.module.KIND in ACTIVATED]
