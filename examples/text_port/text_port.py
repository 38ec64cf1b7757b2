"""A one-block causal transformer in torch (nn.Embedding, nn.MultiheadAttention with its
packed in_proj_weight, a causal mask, pre-norm residual blocks, exact GELU), and its port to
flax (nn.Embed, nn.MultiHeadDotProductAttention, nn.make_causal_mask): token ids in, logits
over the vocabulary at every position out."""

import flax.linen as nn
import jax
import numpy as np
import torch

VOCAB, WIDTH, HEADS, CONTEXT = 256, 32, 4, 32


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.pos = torch.nn.Embedding(CONTEXT, WIDTH)
        self.norm1 = torch.nn.LayerNorm(WIDTH)
        self.attn = torch.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(WIDTH)
        self.fc1 = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(4 * WIDTH, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.embed(ids) + self.pos(torch.arange(t, device=ids.device))
        h = self.norm1(x)
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).triu(1)  # True: not attended
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        x = x + self.fc2(self.act(self.fc1(self.norm2(x))))
        return self.head(self.norm(x))


class FlaxBlock(nn.Module):
    @nn.compact
    def __call__(self, ids, train: bool = False):
        t = ids.shape[1]
        x = nn.Embed(VOCAB, WIDTH, name="embed")(ids) + nn.Embed(CONTEXT, WIDTH, name="pos")(jax.numpy.arange(t))
        h = nn.LayerNorm(epsilon=1e-5, name="norm1")(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, name="attn")(h, h, mask=nn.make_causal_mask(ids))
        h = nn.LayerNorm(epsilon=1e-5, name="norm2")(x)
        x = x + nn.Dense(WIDTH, name="fc2")(jax.nn.gelu(nn.Dense(4 * WIDTH, name="fc1")(h), approximate=False))
        return nn.Dense(VOCAB, name="head")(nn.LayerNorm(epsilon=1e-5, name="norm")(x))


def torch_model():
    return TorchBlock()


def flax_model():
    return FlaxBlock()


def torch_to_flax(state):
    s = {k: np.asarray(v) for k, v in state.items()}

    def dense(name):
        return {"kernel": s[f"{name}.weight"].T, "bias": s[f"{name}.bias"]}

    def norm(name):
        return {"scale": s[f"{name}.weight"], "bias": s[f"{name}.bias"]}

    # torch packs q, k and v into in_proj (3 * width, width); flax keeps each as (width, heads, head_width)
    q, k, v = np.split(s["attn.in_proj_weight"], 3)
    qb, kb, vb = np.split(s["attn.in_proj_bias"], 3)
    per_head = WIDTH // HEADS

    def projection(w, b):
        return {"kernel": w.T.reshape(WIDTH, HEADS, per_head), "bias": b.reshape(HEADS, per_head)}

    attn = {
        "query": projection(q, qb),
        "key": projection(k, kb),
        "value": projection(v, vb),
        "out": {"kernel": s["attn.out_proj.weight"].T.reshape(HEADS, per_head, WIDTH), "bias": s["attn.out_proj.bias"]},
    }
    params = {
        "embed": {"embedding": s["embed.weight"]},
        "pos": {"embedding": s["pos.weight"]},
        "norm1": norm("norm1"),
        "attn": attn,
        "norm2": norm("norm2"),
        "fc1": dense("fc1"),
        "fc2": dense("fc2"),
        "norm": norm("norm"),
        "head": dense("head"),
    }
    return {"params": params}
