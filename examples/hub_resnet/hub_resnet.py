"""Hugging Face transformers' own ResNet, its PyTorch model and its Flax module, checked as a
port: a tiny configuration built from `ResNetConfig` (no weights downloaded), basic blocks
with batch norm and stride-2 shortcuts, HF's own module names on each side (torch's
`layer.0` is flax's `layer/layer_0`), and the run's precision passed to the flax module
through `dtype`. Needs `transformers` 4.x (the last releases with Flax models):
`pip install -e '.[hub]'`."""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import torch
from transformers import ResNetConfig, ResNetForImageClassification
from transformers.models.resnet.modeling_flax_resnet import FlaxResNetForImageClassificationModule

# one-channel 28 x 28 digits, a stem of 8 channels, two stages of one basic block (8, then
# 16 channels at stride 2), ten classes
CONFIG = {"num_channels": 1, "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic", "num_labels": 10}
TORCH_CONFIG = ResNetConfig(**CONFIG)
FLAX_CONFIG = ResNetConfig(**CONFIG)


class TorchResNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.resnet = ResNetForImageClassification(TORCH_CONFIG)

    def forward(self, images):
        return self.resnet(pixel_values=images).logits


class FlaxResNet(nn.Module):
    dtype: jnp.dtype = jnp.float32  # the harness passes each run's: float32, or float64 for the twin

    @nn.compact
    def __call__(self, images, train: bool = False):  # images NHWC, as HF's Flax module takes them
        resnet = FlaxResNetForImageClassificationModule(FLAX_CONFIG, dtype=self.dtype, name="resnet")
        return resnet(images, deterministic=not train).logits  # batch statistics while training


def torch_model():
    return TorchResNet()


def flax_model(dtype=jnp.float32):
    return FlaxResNet(dtype=dtype)


STATS = {"running_mean": "mean", "running_var": "var"}
PARAMS = {"weight": "scale", "bias": "bias"}


def torch_to_flax(state):
    """Each torch tensor to its place: a convolution's (out, in, kh, kw) as flax's (kh, kw, in,
    out), the classifier's (out, in) transposed, batch norm's weight as `scale` and its running
    statistics into `batch_stats`; torch's `layer.k` is flax's `layer/layer_k`."""
    variables = {"params": {}, "batch_stats": {}}
    for name, value in state.items():
        value = np.asarray(value)
        *path, leaf = name.split(".")
        path = [f"layer_{part}" if path[i - 1] == "layer" and part.isdigit() else part for i, part in enumerate(path)]
        if path[-1] == "normalization":
            collection, leaf = ("batch_stats", STATS[leaf]) if leaf in STATS else ("params", PARAMS[leaf])
        elif leaf == "weight":
            collection, leaf, value = "params", "kernel", value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
        else:
            collection = "params"
        at = variables[collection]
        for part in path:
            at = at.setdefault(part, {})
        at[leaf] = value
    return variables
