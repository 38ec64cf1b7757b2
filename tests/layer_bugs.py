"""Injected bugs of the kinds people make when porting a network between torch and JAX,
each a copy of adapters/torch_layers.py with one function replaced (tests/test_injected_bugs.py
registers the copies as adapters): padding split the other way, a norm's eps changed, batch
norm's momentum convention flipped, the other GELU, and a dropout mask without its scale.
TEXT_BUGS are a transformer port's (issue 41): attention's scale, the causal mask off by one,
RoPE's layouts swapped, the positions off by one; tests/test_transformers.py shows each
found in its layer (not yet in the generated family).
Each names the layer kind whose tensors it should be found in. JAX_LAYER_BUGS are the same
for adapters/jax_layers.py: flax's batch norm given the spec's (torch's) momentum as is,
where flax's convention takes 1 - momentum."""

from __future__ import annotations

import importlib.util
import types

from adapters import jax_layers, torch_layers
from harness.layers import windows


def _copy(**overrides) -> types.ModuleType:
    """A fresh module executed from torch_layers' source, `overrides` replacing its globals
    (its network looks them up in the copy)."""
    origin = importlib.util.find_spec(torch_layers.__name__).origin
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("layer_bug_torch_layers", origin))
    module.__spec__.loader.exec_module(module)
    for name, value in overrides.items():
        assert hasattr(module, name), f"torch_layers has no {name} to replace"
        setattr(module, name, value)
    return module


def _swapped_pads(padding, height, width, kernel, stride):
    (top, bottom), (left, right) = windows.pads(padding, height, width, kernel, stride)
    return (bottom, top), (right, left)


def _padding_swapped():
    """The odd pixel of a 'same' padding (or an explicit one) at the top and left, torch's
    ZeroPad2d given (top, bottom) the other way round."""
    return _copy(windows=types.SimpleNamespace(pads=_swapped_pads))


def _with(change):
    def core(torch, p):
        modules, holder = torch_layers._core(torch, p)
        if holder is not None:
            change(holder, p)
        return modules, holder

    return _copy(_core=core)


def _eps_tenfold(holder, p):
    if p.module.KIND in ("batch_norm", "layer_norm"):
        holder.eps = p.section.eps * 10  # flax's default 1e-6 against torch's 1e-5, the other way


def _momentum_flipped(holder, p):
    if p.module.KIND == "batch_norm":
        holder.momentum = 1 - p.section.momentum  # flax's convention passed to torch


def _biased_forward(self, x):
    """nn.BatchNorm's training pass, storing the biased batch variance (flax's) in
    running_var where torch stores the unbiased one; evaluation as torch's own."""
    import torch
    import torch.nn.functional as F

    if not self.training:
        return type(self).forward(self, x)
    dims = [0, *range(2, x.dim())]
    out = F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
    with torch.no_grad():
        m = self.momentum
        self.running_mean.mul_(1 - m).add_(m * x.mean(dim=dims))
        self.running_var.mul_(1 - m).add_(m * x.var(dim=dims, unbiased=False))
    return out


def _stores_biased_var(holder, p):
    if p.module.KIND == "batch_norm":
        holder.forward = types.MethodType(_biased_forward, holder)


def _other_gelu(nn, name):
    swapped = {"gelu": "gelu_tanh", "gelu_tanh": "gelu"}.get(name, name)
    return torch_layers._activation(nn, swapped)


def _unscaled(x, mask):
    return x * (mask > 0)


# name -> (the torch_layers copy, the layer kinds whose presence makes it a math difference)
LAYER_BUGS = {
    "torch_padding_swapped": (_padding_swapped(), ("conv2d",)),
    "torch_norm_eps": (_with(_eps_tenfold), ("batch_norm", "layer_norm")),
    "torch_bn_momentum_flipped": (_with(_momentum_flipped), ("batch_norm",)),
    "torch_bn_biased_var": (_with(_stores_biased_var), ("batch_norm",)),
    "torch_other_gelu": (_copy(_activation=_other_gelu), ("gelu", "gelu_tanh")),
    "torch_dropout_unscaled": (_copy(apply_mask=_unscaled), ("dropout",)),
}


def _unscaled_attention(f, q, k, v, causal):
    """1/d for 1/sqrt(d): the scale taken as the head width's inverse."""
    return f.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / q.shape[-1])


def _mask_off_by_one(f, q, k, v, causal):
    """Each query sees the next token too: the triangle's diagonal one too high."""
    import torch

    t = q.shape[-2]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril(diagonal=1) if causal else None
    return f.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _layouts_swapped(torch, a, rope):
    """The other layout's rotation: interleaved pairs for half ones, and back."""
    other = type(rope)(layout="half" if rope.layout == "interleaved" else "interleaved", base=rope.base)
    return torch_layers.rotary(torch, a, other)


def _positions_from_one(torch, t, device):
    return torch.arange(1, t + 1, device=device)


# name -> (the torch_layers copy, the kind of the layer whose output it changes first)
TEXT_BUGS = {
    "torch_attention_scale": (_copy(attend=_unscaled_attention), "attention"),
    "torch_causal_mask_off_by_one": (_copy(attend=_mask_off_by_one), "attention"),
    "torch_rope_layouts_swapped": (_copy(rotary=_layouts_swapped), "attention"),
    "torch_positions_from_one": (_copy(positions=_positions_from_one), "positional"),
}


def _momentum_unflipped_module(spec):
    """jax_layers.module of the spec with every batch norm's momentum m given as 1 - m, so
    that flax.linen.BatchNorm receives torch's m where its convention wants 1 - m."""
    doc = spec.model_dump()
    for layer in doc["model"]["layers"]:
        if layer.get("kind") == "batch_norm":
            layer["momentum"] = 1 - layer["momentum"]
    return jax_layers.module(type(spec).model_validate(doc))


# name -> (the jax_layers stand-in, the layer kinds whose presence makes it a math difference)
JAX_LAYER_BUGS = {
    "jax_bn_momentum_unflipped": (types.SimpleNamespace(**{**vars(jax_layers), "module": _momentum_unflipped_module}), ("batch_norm",)),
}
