"""Each layer kind of a spec in torch.nn's own modules, as a careful person porting the
model would write it, and the way back from the modules' tensors to the spec's names and
layouts.

- dense: nn.Linear, its weight stored (out, in): the spec's (in, out) transposed.
- conv2d: nn.Conv2d (OIHW, the spec's layout). Symmetric padding is Conv2d's own
  `padding`; an asymmetric one (JAX's "same" with an even total, at stride 2 say) is
  nn.ZeroPad2d before it, which is how torch ports of JAX models pad.
- max_pool, avg_pool, flatten: nn.MaxPool2d, nn.AvgPool2d, nn.Flatten (NCHW: the spec's order).
- batch_norm: nn.BatchNorm1d / nn.BatchNorm2d with the spec's momentum (torch's convention)
  and eps. torch always stores the unbiased running variance.
- layer_norm: nn.LayerNorm over the features.
- dropout: the harness's mask, multiplied in (no framework draws another's masks).
- activations: nn.ReLU, nn.Tanh, nn.GELU() (exact), nn.GELU(approximate="tanh").
- embedding: nn.Embedding (its weight (vocabulary, width), the spec's layout), fed the
  token ids as int64.
- positional: an nn.Embedding of the positions 0 .. context - 1, added (GPT-2's wpe).
- attention: four nn.Linear (q, k, v, out), the heads split as (batch, heads, positions,
  head width), F.scaled_dot_product_attention(is_causal=...) with its default scale
  1/sqrt(head width); RoPE as porting users write it: `half` as GPT-NeoX and Hugging Face's
  Llama (rotate_half: a * cos + cat(-second, first) * sin), `interleaved` as Meta's Llama
  (pairs as complex numbers times e^(i theta)); the angles in float64, rounded once.
- residual: the body's blocks, then x + body(x), as a porter writes a pre-norm block.
- dense and layer_norm on a text's (positions, width) act on the last axis, as nn.Linear
  and nn.LayerNorm do; the loss flattens (batch, positions, classes) to rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.inputs.port import penalized_kinds
from harness.layers import residual_tree, windows

# torch's name for each of the spec's tensor names, per kind
TORCH_NAMES = {"scale": "weight", "bias": "bias", "weight": "weight", "running_mean": "running_mean", "running_var": "running_var"}


def _activation(nn, name: str):
    return {
        "relu": nn.ReLU,
        "tanh": nn.Tanh,
        "gelu": nn.GELU,
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    }.get(name)


def _conv(nn, p):
    s = p.section
    (top, bottom), (left, right) = windows.pads(s.padding, p.in_shape[1], p.in_shape[2], s.kernel, s.stride)
    conv = nn.Conv2d(p.in_shape[0], s.filters, s.kernel, stride=s.stride)
    if top == bottom and left == right:
        conv.padding = (top, left)
        return [conv], conv
    return [nn.ZeroPad2d((left, right, top, bottom)), conv], conv


def _core(torch, p) -> tuple[list[Any], Any]:
    """The modules of one layer, and the one that holds its tensors (or None)."""
    nn, kind, s = torch.nn, p.module.KIND, p.section
    if kind == "dense":
        linear = nn.Linear(p.in_shape[-1], s.width)
        return [linear], linear
    if kind == "conv2d":
        return _conv(nn, p)
    if kind == "max_pool":
        return [nn.MaxPool2d(s.window, s.step)], None
    if kind == "avg_pool":
        return [nn.AvgPool2d(s.window, s.step)], None
    if kind == "flatten":
        return [nn.Flatten()], None
    if kind == "batch_norm":
        norm = (nn.BatchNorm2d if len(p.in_shape) == 3 else nn.BatchNorm1d)(p.in_shape[0], eps=s.eps, momentum=s.momentum)
        return [norm], norm
    if kind == "layer_norm":
        norm = nn.LayerNorm(p.in_shape[-1], eps=s.eps)
        return [norm], norm
    if kind in ("dropout", "residual"):
        return [], None
    if kind == "embedding":
        table = nn.Embedding(s.vocabulary, s.width)
        return [table], table
    if kind in ("positional", "attention"):
        found = transformer_modules(torch)[kind](p)
        return [found], found
    raise ValueError(f"torch adapter: no translation of layer kind {kind!r}")


def rotary(torch, a, rope):
    """RoPE on a (batch, heads, positions, head width) as porting users write it, once per
    layout; the angles t * base^(-2i/d) in float64, their cos and sin rounded to a's dtype."""
    t, d = a.shape[-2], a.shape[-1]
    inverse = rope.base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=a.device) / d)
    theta = torch.outer(torch.arange(t, dtype=torch.float64, device=a.device), inverse)
    if rope.layout == "half":  # GPT-NeoX, Hugging Face's Llama: rotate_half
        cos, sin = (torch.cat([c, c], dim=-1).to(a.dtype) for c in (theta.cos(), theta.sin()))
        first, second = a[..., : d // 2], a[..., d // 2 :]
        return a * cos + torch.cat([-second, first], dim=-1) * sin
    # Meta's Llama: each pair a complex number, turned by e^(i theta); a bfloat16 a in float32,
    # the result back in a's dtype (its apply_rotary_emb: xq.float(), then .type_as(xq))
    if a.dtype not in (torch.float32, torch.float64):
        return rotary(torch, a.float(), rope).to(a.dtype)
    turns = torch.polar(torch.ones_like(theta), theta).to(torch.complex64 if a.dtype == torch.float32 else torch.complex128)
    pairs = torch.view_as_complex(a.reshape(*a.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * turns).flatten(-2)


def attend(f, q, k, v, causal: bool):
    """The heads' attention: torch's own, its scale 1/sqrt(head width) by default (a named
    function, as apply_mask, that the injected bugs of tests/layer_bugs.py replace)."""
    return f.scaled_dot_product_attention(q, k, v, is_causal=causal)


def positions(torch, t: int, device):
    """The positions of an example's tokens, 0 .. t - 1."""
    return torch.arange(t, device=device)


def transformer_modules(torch):
    """The text layers' modules: each takes the placed layer."""
    nn, f = torch.nn, torch.nn.functional

    class Positional(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.table = nn.Embedding(p.section.max_len, p.in_shape[1])

        def forward(self, x):
            return x + self.table(positions(torch, x.shape[1], x.device))

    class SelfAttention(nn.Module):
        def __init__(self, p):
            super().__init__()
            s, width = p.section, p.in_shape[1]
            self.q, self.k, self.v, self.out = (nn.Linear(width, width, bias=s.bias) for _ in range(4))
            self.heads, self.causal, self.rope = s.heads, s.causal, s.rope
            self.attend = None  # the heads' attention, where not `attend`'s (a bf16 member's: torch_bf16.as_xla)

        def forward(self, x):
            b, t, width = x.shape
            q, k, v = (lin(x).view(b, t, self.heads, -1).transpose(1, 2) for lin in (self.q, self.k, self.v))
            if self.rope is not None:
                q, k = rotary(torch, q, self.rope), rotary(torch, k, self.rope)
            o = (self.attend or attend)(f, q, k, v, self.causal)
            return self.out(o.transpose(1, 2).reshape(b, t, width))

    return {"positional": Positional, "attention": SelfAttention}


def apply_mask(x, mask):
    """A dropout layer's output: the harness's mask (0 or 1 / (1 - rate)) multiplied in."""
    return x * mask


def network(torch, spec, params: dict[str, np.ndarray], device: str, dtype):
    """The spec's network as an nn.Module holding the harness's initial tensors."""
    nn = torch.nn

    class Network(nn.Module):
        """The layers in order; forward(x, masks) multiplies each dropout layer's output by
        its mask of this step (masks: layer name -> tensor; empty in evaluation)."""

        def __init__(self):
            super().__init__()
            placed = spec.model.placed
            first = placed[0].in_shape
            self.unflatten = nn.Unflatten(1, tuple(first)) if len(first) == 3 else nn.Identity()
            self.tree = residual_tree(placed)
            self.blocks = nn.ModuleDict()
            self.holders = {}
            self.dropouts = [p.name for p in placed if p.module.KIND == "dropout"]
            for p in placed:
                modules, holder = _core(torch, p)
                act = _activation(nn, p.activation) if p.activation else None
                if act is not None:
                    modules.append(act())
                self.blocks[p.name] = nn.Sequential(*modules)
                self.holders[p.name] = holder

        def forward(self, x, masks, outputs=None):
            """`outputs`, when given, receives each layer's output by name."""
            return self.run(self.tree, self.unflatten(x), masks, outputs)

        def run(self, tree, x, masks, outputs):
            for item in tree:
                if isinstance(item, tuple):  # a residual
                    name, body = item
                    x = x + self.run(body, x, masks, outputs)
                else:
                    name = item
                    x = self.blocks[name](x)
                    if name in masks and self.training:
                        x = apply_mask(x, masks[name])
                if outputs is not None:
                    outputs[name] = x
            return x

    model = Network().to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, holder, local, transposed in _tensor_slots(model, spec):
            value = params[f"{name}.{local}"]
            value = value.T if transposed else value
            holder.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return model


def layer_outputs(model, x, masks) -> dict[str, np.ndarray]:
    """Each block's output in a training-mode forward pass (NCHW: the spec's layout)."""
    found = {}
    model.train()
    model(x, masks, found)
    return {name: value.cpu().double().numpy() for name, value in found.items()}


def _tensor_slots(model, spec):
    """Each tensor's layer name, the torch tensor that holds it, its own name, and whether
    torch stores it transposed (nn.Linear's weight is (out, in))."""
    for p in spec.model.placed:
        holder, kind = model.holders[p.name], p.module.KIND
        for local in p.local_names:
            if kind == "attention":  # q_weight: holder.q.weight
                projection, own = local.split("_")
                yield p.name, getattr(getattr(holder, projection), own), local, own == "weight"
            elif kind == "positional":
                yield p.name, holder.table.weight, local, False
            else:
                yield p.name, getattr(holder, TORCH_NAMES[local]), local, kind == "dense" and local == "weight"


def tensors(model, spec) -> dict[str, np.ndarray]:
    """Every tensor by the spec's name, in the spec's layout, as NumPy."""
    found = {}
    for name, holder, local, transposed in _tensor_slots(model, spec):
        value = holder.detach().cpu().numpy()
        found[f"{name}.{local}"] = (value.T if transposed else value).copy()
    return found


def cross_entropy_rounded(torch, outputs, targets, reduction: str, smoothing: float, rounded):
    """The cross-entropy as z - lse, lse = max + log(sum(exp(z - max))) moved by `rounded`
    (once more, at random, at its own size): as jax.nn.logsumexp and optax round it, where
    the label's logit is the largest and the loss nears 0, lse - z cancels and its rounding
    is a few ulps of the logit, not of the loss (harness.reference.network.log_softmax, the
    array-module members' rounding of the same). torch's own rounds 1 + sum of the others'
    exp, the loss's precision there; a member rounding its logits alone left the loss and
    its gradient bitwise torch's over whole runs (a port of Adam at 0.03, 2026-11-26)."""
    top = outputs.detach().max(dim=1, keepdim=True).values
    logp = outputs - rounded(top + torch.log(torch.exp(outputs - top).sum(dim=1, keepdim=True)))
    if smoothing:
        classes = outputs.shape[1]
        wanted = torch.nn.functional.one_hot(targets, classes).to(outputs.dtype) * (1 - smoothing) + smoothing / classes
        per_example = -(wanted * logp).sum(dim=1)
    else:
        per_example = -logp.gather(1, targets[:, None])[:, 0]
    return per_example.mean() if reduction == "mean" else per_example.sum()


def objective(torch, kind: str, reduction: str, scale: float | None, model, outputs, targets, smoothing: float = 0.0):
    """The spec's loss of `outputs` (torch.nn.functional's mse_loss or cross_entropy, with
    label smoothing), plus `scale` times the sum of the Linear and convolution weights'
    squares (a port's modules too: harness/inputs/port.py penalized). A port's calibration
    member on its jittered steps (`model.round_loss`, adapters/torch_port.py) takes the
    cross-entropy as z - lse with lse rounded once more at its own size (cross_entropy_rounded)."""
    f = torch.nn.functional
    if outputs.ndim == 3:  # a text's (batch, positions, classes): every position a row
        outputs, targets = outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1)
    rounded = getattr(model, "round_loss", None)
    if kind == "mse":
        value = f.mse_loss(outputs, targets, reduction=reduction)
    elif rounded is not None:
        value = cross_entropy_rounded(torch, outputs, targets, reduction, smoothing, rounded)
    else:
        value = f.cross_entropy(outputs, targets, reduction=reduction, label_smoothing=smoothing)
    if scale:
        weights = [m.weight for m in model.modules() if isinstance(m, penalized_kinds(torch))]
        value = value + scale * sum(w.pow(2).sum() for w in weights)
    return value
