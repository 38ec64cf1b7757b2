"""An MNIST MLP with layer norm and GELU in torch, and its port to flax (issue 52: a port on
real image data)."""

import flax.linen as nn
import jax
import numpy as np
import torch


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(self.act(self.norm(self.fc1(x))))


class FlaxMLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(64, name="fc1")(x)
        x = nn.LayerNorm(epsilon=1e-5, name="norm")(x)  # torch's eps (flax's default is 1e-6)
        x = jax.nn.gelu(x, approximate=False)  # torch's exact GELU (flax's default is tanh)
        return nn.Dense(10, name="fc2")(x)


def torch_model():
    return TorchMLP()


def flax_model():
    return FlaxMLP()


def torch_to_flax(state):
    def dense(name):
        return {"kernel": np.asarray(state[f"{name}.weight"]).T, "bias": np.asarray(state[f"{name}.bias"])}

    norm = {"scale": np.asarray(state["norm.weight"]), "bias": np.asarray(state["norm.bias"])}
    return {"params": {"fc1": dense("fc1"), "norm": norm, "fc2": dense("fc2")}}
