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
import sys
import types

import numpy as np

from adapters import jax_layers, torch_layers
from harness.layers import windows

_COPIES: dict[str, types.ModuleType] = {}


def _copy(_of: types.ModuleType = torch_layers, **overrides) -> types.ModuleType:
    """A fresh module executed from torch_layers' source (or `_of`'s), `overrides`
    replacing its globals (its network looks them up in the copy)."""
    origin = importlib.util.find_spec(_of.__name__).origin
    name = f"layer_bug_{_of.__name__.rsplit('.', 1)[-1]}_{len(_COPIES)}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, origin))
    # flax's modules (dataclasses) look their module up by name when they are made
    _COPIES[name] = sys.modules[name] = module
    module.__spec__.loader.exec_module(module)
    for name, value in overrides.items():
        assert hasattr(module, name), f"{_of.__name__} has no {name} to replace"
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


def _other_layout(rope):
    """The other layout's rotation: interleaved pairs for half ones, and back."""
    return type(rope)(layout="half" if rope.layout == "interleaved" else "interleaved", base=rope.base)


def _layouts_swapped(torch, a, rope):
    return torch_layers.rotary(torch, a, _other_layout(rope))


def _positions_from_one(torch, t, device):
    return torch.arange(1, t + 1, device=device)


# name -> (the torch_layers copy, the kind of the layer whose output it changes first)
TEXT_BUGS = {
    "torch_attention_scale": (_copy(attend=_unscaled_attention), "attention"),
    "torch_causal_mask_off_by_one": (_copy(attend=_mask_off_by_one), "attention"),
    "torch_rope_layouts_swapped": (_copy(rotary=_layouts_swapped), "attention"),
    "torch_positions_from_one": (_copy(positions=_positions_from_one), "positional"),
}


def _momentum_unflipped(layer):
    """Every batch norm's momentum m given as 1 - m, so that flax.linen.BatchNorm receives
    torch's m where its convention wants 1 - m."""
    if layer.get("kind") == "batch_norm":
        layer["momentum"] = 1 - layer["momentum"]


def _respelled(spec, change) -> object:
    """The spec with `change(layer)` applied to each layer (a residual's body too)."""
    doc = spec.model_dump()

    def walk(layers):
        for layer in layers:
            change(layer)
            walk(layer.get("layers") or [])

    walk(doc["model"]["layers"])
    return type(spec).model_validate(doc)


def _jax_layers_respelled(change) -> types.SimpleNamespace:
    """jax_layers whose module is built from the spec respelled by `change`: the port's
    flax code written with another value than the spec's."""
    return types.SimpleNamespace(**{**vars(jax_layers), "module": lambda spec, dtype=None: jax_layers.module(_respelled(spec, change), dtype)})


# name -> (the jax_layers stand-in, the layer kinds whose presence makes it a math difference)
JAX_LAYER_BUGS = {
    "jax_bn_momentum_unflipped": (_jax_layers_respelled(_momentum_unflipped), ("batch_norm",)),
}


# --- a transformer's port to JAX (adapters/jax_layers.py copies) ----------------------------


def _jax_scaled_twice(nn, jnp, q, k, v, causal):
    """q scaled by 1/sqrt(d) by hand, as torch code written out does, then given to
    nn.dot_product_attention, which scales it again."""
    return jax_layers.attend(nn, jnp, q / np.sqrt(q.shape[-1]), k, v, causal)


def _jax_mask_off_by_one(nn, jnp, q, k, v, causal):
    """Each query sees the next token too."""
    t = q.shape[1]
    mask = jnp.tril(jnp.ones((t, t), dtype=bool), k=1)[None, None] if causal else None
    return nn.dot_product_attention(q, k, v, mask=mask)


def _jax_layouts_swapped(jnp, a, rope):
    return jax_layers.rotary(jnp, a, _other_layout(rope))


def _jax_positions_from_one(jnp, t):
    return jnp.arange(1, t + 1)


def _flax_gelu_default(nn, jnp, name):
    """nn.gelu as flax users write it: its default is the tanh form (approximate=True)."""
    return nn.gelu if name == "gelu" else jax_layers._activation(nn, jnp, name)


def _flax_layer_norm_default(layer):
    if layer.get("kind") == "layer_norm":
        layer["eps"] = 1e-6  # nn.LayerNorm() as written without its epsilon: flax's default


# name -> (the jax_layers copy, the kind of the layer whose output it changes first)
JAX_TEXT_BUGS = {
    "jax_attention_scaled_twice": (_copy(jax_layers, attend=_jax_scaled_twice), "attention"),
    "jax_causal_mask_off_by_one": (_copy(jax_layers, attend=_jax_mask_off_by_one), "attention"),
    "jax_rope_layouts_swapped": (_copy(jax_layers, rotary=_jax_layouts_swapped), "attention"),
    "jax_positions_from_one": (_copy(jax_layers, positions=_jax_positions_from_one), "positional"),
    "jax_gelu_default": (_copy(jax_layers, _activation=_flax_gelu_default), "gelu"),
    "jax_layer_norm_eps_default": (_jax_layers_respelled(_flax_layer_norm_default), "layer_norm"),
}


def _layers(doc: dict) -> list[dict]:
    found = []
    for layer in doc["model"]["layers"]:
        found.extend([layer, *_layers({"model": layer})] if "layers" in layer else [layer])
    return found


def _attention(doc: dict, want) -> bool:
    return any(layer.get("kind") == "attention" and want(layer) for layer in _layers(doc))


def _rope_turns_two_pairs(doc: dict) -> bool:
    """Whether a RoPE layer turns more than one pair of a head's features: on a head of
    width 2 both layouts turn its one pair, the same math (its swapped layouts are no bug)."""
    from pathlib import Path

    from harness.spec.load import validate_document

    spec, _ = validate_document(Path("<generated>"), doc)
    return any(p.section.kind == "attention" and p.section.rope is not None and p.in_shape[-1] // p.section.heads > 2 for p in spec.model.placed)


def _positions_past_context(doc: dict) -> bool:
    return any(layer.get("kind") == "positional" and layer["max_len"] > doc["data"]["context"] for layer in _layers(doc))


# name -> whether the bug changes a text spec's math (its document): each transformer
# porting bug, torch's and JAX's, where its layer is there to carry it
TEXT_BUG_APPLIES = {
    "torch_attention_scale": lambda doc: _attention(doc, lambda a: True),
    "jax_attention_scaled_twice": lambda doc: _attention(doc, lambda a: True),
    "torch_causal_mask_off_by_one": lambda doc: _attention(doc, lambda a: a.get("causal", True)),
    "jax_causal_mask_off_by_one": lambda doc: _attention(doc, lambda a: a.get("causal", True)),
    "torch_rope_layouts_swapped": _rope_turns_two_pairs,
    "jax_rope_layouts_swapped": _rope_turns_two_pairs,
    "torch_positions_from_one": _positions_past_context,
    "jax_positions_from_one": _positions_past_context,
    "torch_norm_eps": lambda doc: any(layer.get("kind") == "layer_norm" for layer in _layers(doc)),
    "jax_layer_norm_eps_default": lambda doc: any(layer.get("kind") == "layer_norm" and layer["eps"] != 1e-6 for layer in _layers(doc)),
    "torch_other_gelu": lambda doc: any(layer.get("activation") in ("gelu", "gelu_tanh") for layer in _layers(doc)),
    "jax_gelu_default": lambda doc: any(layer.get("activation") == "gelu" for layer in _layers(doc)),
}
