"""Hugging Face transformers' own GPT-2, its PyTorch model and its Flax module, checked as a
port: a tiny configuration built from `GPT2Config` (no weights downloaded), the language
model's head tied to the token embedding as GPT-2 ties it, `gelu_new`, HF's own module
names on each side, the position ids each side makes naturally, and the run's precision
passed to the flax module through `dtype`. Needs `transformers` 4.x (the last releases with
Flax models): `pip install -e '.[hub]'`."""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2.modeling_flax_gpt2 import FlaxGPT2LMHeadModule

# 256 byte tokens, a context of 32, two blocks of width 32 with 4 heads. The harness turns
# GPT-2's nn.Dropout modules off on both sides; the attention's dropout is a rate HF's Flax
# code passes to a function, which it cannot see, so it is 0 here on both sides.
CONFIG = {"vocab_size": 256, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4, "attn_pdrop": 0.0}
TORCH_CONFIG = GPT2Config(**CONFIG)
FLAX_CONFIG = GPT2Config(**CONFIG)


class TorchGPT2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt2 = GPT2LMHeadModel(TORCH_CONFIG)

    def forward(self, ids):
        return self.gpt2(input_ids=ids).logits


class FlaxGPT2(nn.Module):
    dtype: jnp.dtype = jnp.float32  # the harness passes each run's: float32, or float64 for the twin

    @nn.compact
    def __call__(self, ids, train: bool = False):
        positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
        gpt2 = FlaxGPT2LMHeadModule(FLAX_CONFIG, dtype=self.dtype, name="gpt2")
        return gpt2(ids, jnp.ones_like(ids), positions, deterministic=not train).logits


def torch_model():
    return TorchGPT2()


def flax_model(dtype=jnp.float32):
    return FlaxGPT2(dtype=dtype)


def torch_to_flax(state):
    s = {k.removeprefix("gpt2.transformer."): np.asarray(v) for k, v in state.items()}

    def norm(name):
        return {"scale": s[f"{name}.weight"], "bias": s[f"{name}.bias"]}

    def conv1d(name):  # HF's Conv1D keeps (in, out); its Flax twin a kernel of (out, in)
        return {"kernel": s[f"{name}.weight"].T, "bias": s[f"{name}.bias"]}

    def block(i):
        h = f"h.{i}"
        return {
            "ln_1": norm(f"{h}.ln_1"),
            "attn": {"c_attn": conv1d(f"{h}.attn.c_attn"), "c_proj": conv1d(f"{h}.attn.c_proj")},
            "ln_2": norm(f"{h}.ln_2"),
            "mlp": {"c_fc": conv1d(f"{h}.mlp.c_fc"), "c_proj": conv1d(f"{h}.mlp.c_proj")},
        }

    transformer = {
        "wte": {"embedding": s["wte.weight"]},  # lm_head.weight is this tensor (tied): flax reads it from here
        "wpe": {"embedding": s["wpe.weight"]},
        "h": {str(i): block(i) for i in range(CONFIG["n_layer"])},
        "ln_f": norm("ln_f"),
    }
    return {"params": {"gpt2": {"transformer": transformer}}}
