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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.layers import windows

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


def _core(nn, p) -> tuple[list[Any], Any]:
    """The modules of one layer, and the one that holds its tensors (or None)."""
    kind, s = p.module.KIND, p.section
    if kind == "dense":
        linear = nn.Linear(p.in_shape[0], s.width)
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
        norm = nn.LayerNorm(p.in_shape[0], eps=s.eps)
        return [norm], norm
    if kind == "dropout":
        return [], None
    raise ValueError(f"torch adapter: no translation of layer kind {kind!r}")


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
            self.blocks = nn.ModuleDict()
            self.holders = {}
            self.dropouts = [p.name for p in placed if p.module.KIND == "dropout"]
            for p in placed:
                modules, holder = _core(nn, p)
                act = _activation(nn, p.activation) if p.activation else None
                if act is not None:
                    modules.append(act())
                self.blocks[p.name] = nn.Sequential(*modules)
                self.holders[p.name] = holder

        def forward(self, x, masks, outputs=None):
            """`outputs`, when given, receives each layer's output by name."""
            x = self.unflatten(x)
            for name, block in self.blocks.items():
                x = block(x)
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
            getattr(holder, TORCH_NAMES[local]).copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return model


def layer_outputs(model, x, masks) -> dict[str, np.ndarray]:
    """Each block's output in a training-mode forward pass (NCHW: the spec's layout)."""
    found = {}
    model.train()
    model(x, masks, found)
    return {name: value.cpu().double().numpy() for name, value in found.items()}


def _tensor_slots(model, spec):
    """Each tensor's layer name, holding module and own name, and whether torch stores it
    transposed (nn.Linear's weight is (out, in))."""
    for p in spec.model.placed:
        for local in p.local_names:
            yield p.name, model.holders[p.name], local, p.module.KIND == "dense" and local == "weight"


def tensors(model, spec) -> dict[str, np.ndarray]:
    """Every tensor by the spec's name, in the spec's layout, as NumPy."""
    found = {}
    for name, holder, local, transposed in _tensor_slots(model, spec):
        value = getattr(holder, TORCH_NAMES[local]).detach().cpu().numpy()
        found[f"{name}.{local}"] = (value.T if transposed else value).copy()
    return found


def objective(torch, kind: str, reduction: str, scale: float | None, model, outputs, targets, smoothing: float = 0.0):
    """The spec's loss of `outputs` (torch.nn.functional's mse_loss or cross_entropy, with
    label smoothing), plus `scale` times the sum of the Linear and Conv2d weights' squares."""
    f = torch.nn.functional
    if kind == "mse":
        value = f.mse_loss(outputs, targets, reduction=reduction)
    else:
        value = f.cross_entropy(outputs, targets, reduction=reduction, label_smoothing=smoothing)
    if scale:
        weights = [m.weight for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
        value = value + scale * sum(w.pow(2).sum() for w in weights)
    return value
