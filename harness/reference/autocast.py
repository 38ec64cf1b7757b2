"""The array-module code in bf16 (issue 86): the network of harness/reference/network.py in
float32, its values rounded to bfloat16 where torch's autocast on the CPU computes them in
bfloat16, and nowhere else. Measured on torch 2.13's CPU autocast (tests/test_autocast.py):

- dense, conv2d and attention (autocast's lower-precision list: linear, conv,
  scaled_dot_product_attention) take their input, weights and biases rounded to bfloat16 and
  give a bfloat16 output, their products summed in float32 and rounded once; inside
  attention, each projection, RoPE's cos, sin and turned values, the exponentials going into
  the product with v and the fused kernel's output are bfloat16, its scores and their sum
  float32 (harness/layers/attention.py fused);
- embedding gives float32 (its float32 table; autocast leaves it alone), and so does a
  positional layer (its float32 table added: a bfloat16 value plus a float32 one is float32);
- every other layer of an MLP or a conv net (activations, pools, flatten, batch and layer
  norm, a residual of two bfloat16 values) gives its output in its input's dtype: on a
  bfloat16 input, computed in float32 and rounded once, its own parameters float32;
- a dropout layer in training multiplies in the step's float32 mask, as the harness's
  adapters do (no framework draws another's masks), and a bfloat16 value times a float32
  one is float32; in evaluation it passes its input on;
- the loss (cross_entropy, mse_loss: autocast's float32 list) on the logits in float32, its
  gradient rounded to bfloat16 going back into them;
- going back, every gradient of a bfloat16 value is bfloat16, and a dense or conv layer's
  weight and bias gradients are bfloat16 values (products of bfloat16 operands) held in
  float32; the optimizer, its state and the parameters are float32.

Where the values are not torch's bit for bit (attention's fused kernel sums in its own
blocks), they are its to bfloat16's rounding: the run is judged on the bf16 envelope like
any other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Array = Any

# autocast's lower-precision list: their products in bfloat16
LOWERED = ("dense", "conv2d", "attention")
# an output in the input's dtype (a residual's when both its inputs are bfloat16)
KEPT = ("max_pool", "avg_pool", "flatten", "dropout", "batch_norm", "layer_norm", "residual")
MASKED = "dropout"  # in training, its output float32 (its float32 mask multiplied in)
FLOAT32 = ("embedding", "positional")  # an output in float32 whatever the input


def rounding(xp) -> Callable[[Array], Array]:
    """A float32 array rounded to the nearest bfloat16 (ties to even), back in float32: with
    ml_dtypes' bfloat16 on NumPy; on CuPy, which has no bfloat16, by the same rounding of
    the float32 bits (`bits_rounding`, tested equal to ml_dtypes')."""
    if xp is np:
        import ml_dtypes

        bf16 = ml_dtypes.bfloat16

        def low(a: Array) -> Array:
            with np.errstate(invalid="ignore"):  # a diverged run's NaN stays NaN, unremarked
                return np.asarray(a).astype(bf16).astype(np.float32)

        return low
    return bits_rounding(xp)


def bits_rounding(xp) -> Callable[[Array], Array]:
    """Round to nearest even on the upper 16 bits of each float32 (NaN kept NaN)."""

    def low(a: Array) -> Array:
        a = xp.asarray(a, dtype=xp.float32)
        bits = a.view(xp.uint32)
        up = (bits >> 16) & xp.uint32(1)
        rounded = ((bits + xp.uint32(0x7FFF) + up) & xp.uint32(0xFFFF0000)).view(xp.float32)
        return xp.where(xp.isnan(a), a, rounded)

    return low


@dataclass
class Autocast:
    """One pass's bf16 rounding (network.Context.autocast): what it rounds with, and, written
    going forward, whether each layer's input and output are bfloat16 (by layer name) and
    whether each residual's kept input is."""

    low: Callable[[Array], Array]
    input_low: dict[str, bool] = field(default_factory=dict)
    output_low: dict[str, bool] = field(default_factory=dict)
    skips: dict[str, bool] = field(default_factory=dict)
    last: bool = False  # whether the latest layer's output is bfloat16 (at the end, the network's)

    def enter(self, p, local: dict, a: Array, train: bool) -> tuple[dict, Array]:
        """A layer's parameters and input as it computes with them (in training or not), its
        input the latest layer's output; records whether its input and output are bfloat16."""
        kind, low = p.section.kind, self.last
        if kind in LOWERED:
            self.input_low[p.name] = self.output_low[p.name] = self.last = True
            return self.params(p, local), (a if low else self.low(a))
        if kind in FLOAT32:
            out = False
        elif kind in KEPT:
            out = low and self.skips.get(p.name, True) if kind == "residual" else low and not (train and kind == MASKED)
        else:  # a layer kind added to harness/layers/ and not placed here (tests/test_autocast.py)
            raise ValueError(f"the array-module code's bf16 run does not place layer kind {kind!r} (harness/reference/autocast.py)")
        self.input_low[p.name], self.output_low[p.name], self.last = low, out, out
        return local, a

    def params(self, p, local: dict) -> dict:
        """A lowered layer's parameters in bfloat16 (autocast's cast of each float32 one)."""
        return {k: self.low(v) for k, v in local.items()} if p.section.kind in LOWERED else local

    def out(self, p, a: Array) -> Array:
        """A layer's output (or its activation's) in its dtype."""
        return self.low(a) if self.output_low[p.name] else a

    def back(self, p, d_x: Array | None, grads: dict) -> tuple[Array | None, dict]:
        """A layer's input gradient in its input's dtype, and a lowered layer's parameter
        gradients as bfloat16 values."""
        if p.section.kind in LOWERED:
            grads = {k: self.low(g) for k, g in grads.items()}
        if d_x is not None and self.input_low[p.name]:
            d_x = self.low(d_x)
        return d_x, grads

    def computed_in(self) -> dict[str, str]:
        """Each layer's output dtype and the loss's, as a bf16 run records them."""
        found = {name: "bfloat16" if low else "float32" for name, low in self.output_low.items()}
        return {**found, "loss": "float32"}
