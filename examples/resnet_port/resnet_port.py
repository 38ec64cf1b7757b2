"""A small residual CNN on MNIST in torch, and its port to flax as a user writes it: a stem
conv, two basic blocks (3x3 convs with batch norm, the second block halving the size with a
stride-2 conv and a 1x1 projection on its shortcut), global average pooling and a dense
head. The cost issue's realistic port (issue 85): trained with AdamW, a warmup-cosine
schedule and gradient clipping. torch's padding=1 on a 3x3 stride-2 conv is flax's
((1, 1), (1, 1)), not "SAME" (which pads (0, 1) on an even size)."""

import flax.linen as nn
import numpy as np
import torch


class Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.proj = torch.nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if stride != 1 or cin != cout else None

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (self.proj(x) if self.proj is not None else x))


class TorchResNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.block1 = Block(8, 8, 1)
        self.block2 = Block(8, 16, 2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.block2(self.block1(x))
        return self.fc(x.mean(dim=(2, 3)))


def _bn(name):
    # torch's momentum 0.1 is flax's 0.9 (flax keeps momentum * the old average)
    return nn.BatchNorm(momentum=0.9, epsilon=1e-5, name=name)


class FlaxBlock(nn.Module):
    cout: int
    stride: int

    @nn.compact
    def __call__(self, x, train: bool):
        pad = ((1, 1), (1, 1))
        s = (self.stride, self.stride)
        out = nn.Conv(self.cout, (3, 3), strides=s, padding=pad, use_bias=False, name="conv1")(x)
        out = nn.relu(_bn("bn1")(out, use_running_average=not train))
        out = nn.Conv(self.cout, (3, 3), padding=pad, use_bias=False, name="conv2")(out)
        out = _bn("bn2")(out, use_running_average=not train)
        if self.stride != 1 or x.shape[-1] != self.cout:
            x = nn.Conv(self.cout, (1, 1), strides=s, use_bias=False, name="proj")(x)
        return nn.relu(out + x)


class FlaxResNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, name="stem")(x)
        x = nn.relu(_bn("bn")(x, use_running_average=not train))
        x = FlaxBlock(8, 1, name="block1")(x, train)
        x = FlaxBlock(16, 2, name="block2")(x, train)
        return nn.Dense(10, name="fc")(x.mean(axis=(1, 2)))


def torch_model():
    return TorchResNet()


def flax_model():
    return FlaxResNet()


def torch_to_flax(state):
    s = {k: np.asarray(v) for k, v in state.items()}
    params, stats = {}, {}

    def conv(name):
        return {"kernel": s[f"{name}.weight"].transpose(2, 3, 1, 0)}

    def bn(name):
        return {"scale": s[f"{name}.weight"], "bias": s[f"{name}.bias"]}, {"mean": s[f"{name}.running_mean"], "var": s[f"{name}.running_var"]}

    params["stem"] = conv("stem")
    params["bn"], stats["bn"] = bn("bn")
    for block in ("block1", "block2"):
        params[block], stats[block] = {}, {}
        for part in ("conv1", "conv2", "proj"):
            if f"{block}.{part}.weight" in s:
                params[block][part] = conv(f"{block}.{part}")
        for part in ("bn1", "bn2"):
            params[block][part], stats[block][part] = bn(f"{block}.{part}")
    params["fc"] = {"kernel": s["fc.weight"].T, "bias": s["fc.bias"]}
    return {"params": params, "batch_stats": stats}
