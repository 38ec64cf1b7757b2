"""A small CNN with batch norm and max pooling in torch, and its port to flax."""

import flax.linen as nn
import numpy as np
import torch


class TorchCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 6, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(6)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(6 * 4 * 4, 3)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class FlaxCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(6, (3, 3), padding=((1, 1), (1, 1)), name="conv")(x)
        # torch's momentum 0.1 is flax's 0.9 (flax keeps momentum * the old average)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name="bn")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        return nn.Dense(3, name="fc")(x.reshape((x.shape[0], -1)))  # H, W, C order


def torch_model():
    return TorchCNN()


def flax_model():
    return FlaxCNN()


def torch_to_flax(state):
    fc = np.asarray(state["fc.weight"]).reshape(3, 6, 4, 4)  # out, C, H, W
    return {
        "params": {
            "conv": {"kernel": np.asarray(state["conv.weight"]).transpose(2, 3, 1, 0), "bias": np.asarray(state["conv.bias"])},
            "bn": {"scale": np.asarray(state["bn.weight"]), "bias": np.asarray(state["bn.bias"])},
            "fc": {"kernel": fc.transpose(2, 3, 1, 0).reshape(6 * 4 * 4, 3), "bias": np.asarray(state["fc.bias"])},
        },
        "batch_stats": {"bn": {"mean": np.asarray(state["bn.running_mean"]), "var": np.asarray(state["bn.running_var"])}},
    }
