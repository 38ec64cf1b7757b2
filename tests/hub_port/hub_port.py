"""A port written as hubs write their models (issue 83), without a hub: blocks that return
tuples with a None, a body that returns a dataclass, submodules kept in lists (torch's
`blocks.0.layer.0`, flax's `blocks_0/layer_0`), a Linear whose weight is tied to another's,
an offset each side broadcasts its own way ((1, 8) in torch, (batch, 8) in flax), and the
computation's dtype taken by every flax module, as HF's Flax modules take it."""

from typing import Any

import flax.linen as nn
import flax.struct
import jax.numpy as jnp
import numpy as np
import torch


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())

    def forward(self, x):
        return x + self.layer(x), None


class TorchBody(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(2, 8)
        self.offset = torch.nn.Embedding(1, 8)
        self.blocks = torch.nn.ModuleList([TorchBlock(), TorchBlock()])

    def forward(self, x):
        h = self.inp(x) + self.offset(torch.zeros(1, dtype=torch.int64, device=x.device))
        for block in self.blocks:
            h = block(h)[0]
        return {"hidden": h, "extra": None}


class TorchHub(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = TorchBody()
        self.mix = torch.nn.Linear(8, 8)
        self.tied = torch.nn.Linear(8, 8)
        self.tied.weight = self.mix.weight  # one tensor, two names in state_dict()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.tied(torch.tanh(self.mix(self.body(x)["hidden"]))))


@flax.struct.dataclass
class BodyOutput:
    extra: Any
    hidden: Any


class FlaxBlock(nn.Module):
    dtype: Any = jnp.float32

    def setup(self):
        self.layer = [nn.Dense(8, dtype=self.dtype)]

    def __call__(self, x):
        return x + jnp.tanh(self.layer[0](x)), None


class FlaxBody(nn.Module):
    dtype: Any = jnp.float32

    def setup(self):
        self.inp = nn.Dense(8, dtype=self.dtype)
        self.offset = nn.Embed(1, 8, dtype=self.dtype)
        self.blocks = [FlaxBlock(dtype=self.dtype) for _ in range(2)]

    def __call__(self, x):
        h = self.inp(x) + self.offset(jnp.zeros(x.shape[0], dtype=jnp.int32))
        for block in self.blocks:
            h = block(h)[0]
        return BodyOutput(extra=None, hidden=h)


class FlaxHub(nn.Module):
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        mix = nn.Dense(8, dtype=self.dtype, name="mix")
        h = jnp.tanh(mix(FlaxBody(dtype=self.dtype, name="body")(x).hidden))
        h = h @ jnp.asarray(mix.variables["params"]["kernel"], self.dtype) + self.param("tied_bias", nn.initializers.zeros, (8,))
        return nn.Dense(2, dtype=self.dtype, name="head")(h)


def torch_model():
    return TorchHub()


def flax_model(dtype=jnp.float32):
    return FlaxHub(dtype=dtype)


def torch_to_flax(state):
    s = {k: np.asarray(v) for k, v in state.items()}

    def dense(name):
        return {"kernel": s[f"{name}.weight"].T, "bias": s[f"{name}.bias"]}

    body = {
        "inp": dense("body.inp"),
        "offset": {"embedding": s["body.offset.weight"]},
        **{f"blocks_{i}": {"layer_0": dense(f"body.blocks.{i}.layer.0")} for i in range(2)},
    }
    return {"params": {"body": body, "mix": dense("mix"), "tied_bias": s["tied.bias"], "head": dense("head")}}
