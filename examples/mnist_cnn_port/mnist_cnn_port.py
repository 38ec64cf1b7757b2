"""A small CNN on MNIST in torch, and its port to flax as a user writes it (issue 52: the first
honest CNN port tried on real data was a false alarm; torch's CPU batch norm sums its
statistics one term after the other, XLA pairwise). flax's defaults are kept where they
match torch's math (its fast variance included); padding="SAME" is torch's padding=1 for a
3x3 kernel at stride 1."""

import flax.linen as nn
import numpy as np
import torch


class TorchCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 14 * 14, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class FlaxCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(8, (3, 3), padding="SAME", name="conv")(x)
        # torch's momentum 0.1 is flax's 0.9 (flax keeps momentum * the old average)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name="bn")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        return nn.Dense(10, name="fc")(x.reshape((x.shape[0], -1)))


def torch_model():
    return TorchCNN()


def flax_model():
    return FlaxCNN()


def torch_to_flax(state):
    fc = np.asarray(state["fc.weight"]).reshape(10, 8, 14, 14)  # out, C, H, W: flax flattens H, W, C
    return {
        "params": {
            "conv": {"kernel": np.asarray(state["conv.weight"]).transpose(2, 3, 1, 0), "bias": np.asarray(state["conv.bias"])},
            "bn": {"scale": np.asarray(state["bn.weight"]), "bias": np.asarray(state["bn.bias"])},
            "fc": {"kernel": fc.transpose(2, 3, 1, 0).reshape(8 * 14 * 14, 10), "bias": np.asarray(state["fc.bias"])},
        },
        "batch_stats": {"bn": {"mean": np.asarray(state["bn.running_mean"]), "var": np.asarray(state["bn.running_var"])}},
    }
