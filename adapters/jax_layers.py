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
- embedding: nn.Embed (its table (vocabulary, width), the spec's layout), fed int32 ids.
- positional: an nn.Embed of the positions 0 .. context - 1, added.
- attention: four nn.Dense (q, k, v, out; kernels (in, out), the spec's layout), heads
  split as (batch, positions, heads, head width), flax's layout, nn.dot_product_attention
  with nn.make_causal_mask when causal (flax fills masked scores with the dtype's finfo.min,
  not -inf, and scales q by 1/sqrt(head width) before the product); RoPE as JAX ports
  write it: `half` with rotate_half, `interleaved` as complex numbers (EasyLM's Llama); the
  angles in float64, rounded once.
- residual: the body's layers, then x + body(x).
- dense and layer_norm on a text's (positions, width) act on the last axis (flax's own);
  the loss is per position, then the mean over all (jax_adapter's loss takes any shape).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.layers import ACTIVATED, residual_tree


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


def rotary(jnp, a, rope):
    """RoPE on (batch, positions, heads, head width) as JAX ports write it, once per
    layout; the angles t * base^(-2i/d) in float64 (NumPy), cos and sin rounded to a's dtype."""
    t, d = a.shape[1], a.shape[-1]
    theta = np.outer(np.arange(t, dtype=np.float64), rope.base ** (-np.arange(0, d, 2, dtype=np.float64) / d))[:, None, :]
    if rope.layout == "half":  # rotate_half
        cos, sin = (jnp.asarray(np.concatenate([c, c], axis=-1).astype(a.dtype)) for c in (np.cos(theta), np.sin(theta)))
        first, second = a[..., : d // 2], a[..., d // 2 :]
        return a * cos + jnp.concatenate([-second, first], axis=-1) * sin
    # each pair a complex number, turned by e^(i theta) (EasyLM's apply_rotary_emb); a bfloat16
    # a in float32, the result back in a's dtype, as EasyLM writes it
    if a.dtype not in (jnp.float32, jnp.float64):
        return rotary(jnp, a.astype(jnp.float32), rope).astype(a.dtype)
    import jax

    turns = jax.lax.complex(jnp.asarray(np.cos(theta).astype(a.dtype)), jnp.asarray(np.sin(theta).astype(a.dtype)))
    pairs = a.reshape(*a.shape[:-1], d // 2, 2)
    turned = jax.lax.complex(pairs[..., 0], pairs[..., 1]) * turns
    return jnp.stack([jnp.real(turned), jnp.imag(turned)], axis=-1).reshape(a.shape)


def attend(nn, jnp, q, k, v, causal: bool):
    """Softmax attention of (batch, positions, heads, head width): flax's own, its causal
    mask made by flax (its scale 1/sqrt(head width) applied to q inside)."""
    mask = nn.make_causal_mask(jnp.ones(q.shape[:2])) if causal else None
    return nn.dot_product_attention(q, k, v, mask=mask)


def positions(jnp, t: int):
    """The positions a learned positional table is looked up at: 0 .. t - 1."""
    return jnp.arange(t)


def _attention_module(nn, jnp):
    class SelfAttention(nn.Module):
        heads: int
        causal: bool
        rope: Any
        bias: bool
        dtype: Any = None  # the computation's (a bf16 run's bfloat16), None: the inputs'

        @nn.compact
        def __call__(self, x):
            b, t, width = x.shape
            q, k, v = (nn.Dense(width, use_bias=self.bias, dtype=self.dtype, name=w)(x).reshape(b, t, self.heads, -1) for w in ("q", "k", "v"))
            if self.rope is not None:
                q, k = rotary(jnp, q, self.rope), rotary(jnp, k, self.rope)
            o = attend(nn, jnp, q, k, v, self.causal)
            return nn.Dense(width, use_bias=self.bias, dtype=self.dtype, name="out")(o.reshape(b, t, width))

    return SelfAttention


def module(spec, dtype: str | None = None):
    """The spec's network as a flax.linen Module: __call__(x, masks, train). `dtype` is the
    computation dtype of the modules torch's autocast computes in it (a bf16 run's
    "bfloat16", parameters kept float32; None: the parameters', flax's default), as a careful
    port of an autocast run writes flax's mixed precision: dense, conv and attention's
    products in `dtype`; the embedding tables looked up in float32 (autocast leaves
    embedding alone); norms in their input's dtype (autocast on the CPU leaves layer_norm and
    batch_norm alone); the sums of a residual and a dropout's mask promoted as torch promotes
    them. The loss on float32 logits is jax_adapter's."""
    import flax.linen as nn
    import jax.numpy as jnp

    placed = spec.model.placed
    tree = residual_tree(placed)
    by_name = {p.name: p for p in placed}
    attention = _attention_module(nn, jnp)

    class Network(nn.Module):
        @nn.compact
        def __call__(self, x, masks, train: bool):
            first = placed[0].in_shape
            if len(first) == 3:
                x = x.reshape((x.shape[0], *first)).transpose(0, 2, 3, 1)

            def run(items, x):
                """The layers of `items` (a residual: its name and its body's items)."""
                for item in items:
                    if isinstance(item, tuple):  # a residual
                        name, body = item
                        x = x + run(body, x)
                        self.sow("intermediates", f"out_{name}", x)
                    else:
                        x = self.layer(by_name[item], x, masks, train)
                return x

            return run(tree, x)

        def layer(self, p, x, masks, train: bool):
            kind, s = p.module.KIND, p.section
            own = None if dtype is None else x.dtype  # a norm's: its input's, under mixed precision
            if kind == "embedding":
                x = nn.Embed(s.vocabulary, s.width, name=p.name)(x)
            elif kind == "positional":
                x = x + nn.Embed(s.max_len, p.in_shape[1], name=p.name)(positions(jnp, x.shape[1]))
            elif kind == "attention":
                x = attention(s.heads, s.causal, s.rope, s.bias, dtype, name=p.name)(x)
            elif kind == "dense":
                x = nn.Dense(s.width, dtype=dtype, name=p.name)(x)
            elif kind == "conv2d":
                x = nn.Conv(s.filters, (s.kernel, s.kernel), strides=(s.stride, s.stride), padding=_padding(p), dtype=dtype, name=p.name)(x)
            elif kind == "max_pool":
                x = nn.max_pool(x, (s.window, s.window), strides=(s.step, s.step), padding="VALID")
            elif kind == "avg_pool":
                x = nn.avg_pool(x, (s.window, s.window), strides=(s.step, s.step), padding="VALID")
            elif kind == "flatten":
                x = x.transpose(0, 3, 1, 2).reshape((x.shape[0], -1)) if x.ndim == 4 else x
            elif kind == "batch_norm":
                norm = nn.BatchNorm(momentum=1 - s.momentum, epsilon=s.eps, use_fast_variance=False, dtype=own, name=p.name)
                x = norm(x, use_running_average=not train)
            elif kind == "layer_norm":
                x = nn.LayerNorm(epsilon=s.eps, use_fast_variance=False, dtype=own, name=p.name)(x)
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
    ("embedding", "weight"): ("params", "embedding", _SAME),
    ("positional", "weight"): ("params", "embedding", _SAME),
    # attention's q_weight is its Dense "q"'s kernel: ("params", "q/kernel")
    **{
        ("attention", f"{w}_{own}"): ("params", f"{w}/{'kernel' if own == 'weight' else 'bias'}", _SAME)
        for w in ("q", "k", "v", "out")
        for own in ("weight", "bias")
    },
}


def variables(spec, tensors: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """flax's variables ({"params": ..., "batch_stats": ...}) holding the spec's tensors."""
    found: dict[str, dict] = {"params": {}}
    for p in spec.model.placed:
        for local in p.local_names:
            collection, path, (into, _) = SLOTS[p.module.KIND, local]
            *parents, name = path.split("/")
            holder = found.setdefault(collection, {}).setdefault(p.name, {})
            for parent in parents:
                holder = holder.setdefault(parent, {})
            holder[name] = np.ascontiguousarray(into(tensors[f"{p.name}.{local}"])).astype(dtype)
    return found


def tensors(spec, found: dict[str, Any]) -> dict[str, np.ndarray]:
    """The spec's tensors by name and layout, from flax's variables."""
    out = {}
    for p in spec.model.placed:
        for local in p.local_names:
            collection, path, (_, back) = SLOTS[p.module.KIND, local]
            value = found[collection][p.name]
            for key in path.split("/"):
                value = value[key]
            out[f"{p.name}.{local}"] = np.array(back(np.asarray(value)))
    return out


def kernels(spec, params: dict[str, Any]) -> list[Any]:
    """The weights an L2 penalty sums, in the network's order."""
    return [params[p.name]["kernel"] for p in spec.model.placed if p.module.KIND in ACTIVATED]
