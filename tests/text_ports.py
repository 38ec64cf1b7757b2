"""The generated family's transformers written as ports (issue 52): each drawn text spec's
network (tests/family.py text_documents) written as a user writes it, a torch module and the
flax module ported from it, with the converter between them, and run through
`model: {python: ...}` on the same text's bytes.

The attention is written either way each library offers, drawn apart for torch and flax:
torch's `nn.MultiheadAttention` (its packed `in_proj_weight`, a boolean causal mask) or
four `nn.Linear`s with `F.scaled_dot_product_attention`; flax's
`nn.MultiHeadDotProductAttention` (kernels of (width, heads, head width)) or four
`nn.Dense`s with `nn.dot_product_attention` and `nn.make_causal_mask`. RoPE needs the
second form on both sides: each side turns q and k itself, from the same float64 tables
(numpy) rounded once to the run's dtype. Dropout is written as each library's module (the
harness turns it off in both). The weights are the harness's initial tensors of the spec.

A text port's classic slips (TEXT_SLIPS), each written into the first attention or layer
that takes it: q and k swapped unpacking torch's in_proj_weight, the causal mask forgotten
in flax, the heads split in the wrong order, RoPE's other layout, flax's layer-norm eps
default, GELU's other form."""

from __future__ import annotations

import json

from tests.port_family import FLAX_ACTIVATION, TORCH_ACTIVATION, Slip

TEXT_SLIPS = ("qkv_order", "causal_mask", "head_split", "rope_layout", "layer_norm_eps", "gelu_approximation")

HEAD = '''"""A generated text port: a spec's transformer as a user's torch module and flax port."""

import json

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

from harness.layers import initial_tensors
from harness.spec.model import Spec

SPEC = Spec.model_validate(json.loads({doc!r}))
# each of the harness's initial tensors: torch's key, whether it is transposed, and which
# third of a packed in_proj it fills (None: all of it)
LOAD = {load}


def rope_tables(t, head_width, base):
    """cos and sin of each position's angle for each pair of a head's features (float64)."""
    inverse = base ** (-np.arange(0, head_width, 2, dtype=np.float64) / head_width)
    theta = np.outer(np.arange(t, dtype=np.float64), inverse)
    return np.cos(theta), np.sin(theta)


def torch_rotate(a, layout, base):
    """a (batch, heads, t, head width) with RoPE's turn."""
    cos, sin = (torch.from_numpy(c).to(a) for c in rope_tables(a.shape[2], a.shape[3], base))
    if layout == "half":
        first, second = a.chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    first, second = a[..., 0::2], a[..., 1::2]
    return torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1).flatten(-2)


def flax_rotate(a, layout, base):
    """a (batch, t, heads, head width) with RoPE's turn."""
    cos, sin = (jnp.asarray(c[:, None, :], dtype=a.dtype) for c in rope_tables(a.shape[1], a.shape[3], base))
    if layout == "half":
        first, second = jnp.split(a, 2, axis=-1)
        return jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
    first, second = a[..., 0::2], a[..., 1::2]
    return jnp.stack([first * cos - second * sin, first * sin + second * cos], axis=-1).reshape(a.shape)


class TorchAttention(torch.nn.Module):
    def __init__(self, width, heads, bias, causal, rope=None):
        super().__init__()
        self.heads, self.causal, self.rope = heads, causal, rope
        self.q, self.k, self.v, self.out = (torch.nn.Linear(width, width, bias=bias) for _ in range(4))

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = (f(x).reshape(b, t, self.heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        if self.rope:
            q, k = torch_rotate(q, *self.rope), torch_rotate(k, *self.rope)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(o.transpose(1, 2).reshape(b, t, w))


class FlaxAttention(nn.Module):
    width: int
    heads: int
    bias: bool
    causal: bool
    rope: tuple | None = None
    heads_first: bool = True

    @nn.compact
    def __call__(self, x, mask):
        b, t, _ = x.shape

        def split(name):
            y = nn.Dense(self.width, use_bias=self.bias, name=name)(x)
            return y.reshape(b, t, self.heads, -1) if self.heads_first else y.reshape(b, t, -1, self.heads).swapaxes(-1, -2)

        q, k, v = split("q"), split("k"), split("v")
        if self.rope:
            q, k = flax_rotate(q, *self.rope), flax_rotate(k, *self.rope)
        o = nn.dot_product_attention(q, k, v, mask=mask if self.causal else None)
        return nn.Dense(self.width, use_bias=self.bias, name="out")(o.reshape(b, t, self.width))


class TorchPort(torch.nn.Module):
    def __init__(self):
        super().__init__()
{torch_init}

    def forward(self, ids):
        x = ids
{torch_forward}
        return x


class FlaxPort(nn.Module):
    @nn.compact
    def __call__(self, ids, train: bool = False):
        mask = nn.make_causal_mask(ids)
        x = ids
{flax_call}
        return x


def torch_model():
    model = TorchPort()
    state = model.state_dict()
    with torch.no_grad():
        for name, value in initial_tensors(SPEC.model.placed, SPEC.init).items():
            key, transposed, part = LOAD[name]
            value = torch.from_numpy(np.ascontiguousarray(value.T if transposed else value))
            target = state[key] if part is None else state[key][part * len(value) : (part + 1) * len(value)]
            target.copy_(value)
    return model


def flax_model():
    return FlaxPort()


def torch_to_flax(state):
    s = {{k: np.asarray(v) for k, v in state.items()}}
    params = {{}}
{convert}
    return {{"params": params}}
'''


def _walk(layers: list[dict], placed):
    """The doc's layers with their placed names: (layer, placed, body) each, body the
    residual's own walk (the harness places a residual's body flat before it)."""
    for layer in layers:
        if layer["kind"] == "residual":
            body = list(_walk(layer["layers"], placed))
            yield layer, next(placed), body
        else:
            yield layer, next(placed), None


def styles(doc: dict) -> tuple[str, str]:
    """How torch and flax write the attention: ("mha", "mhdpa") for their attention
    modules, ("sdpa", "dpa") for projections and the attention function; drawn from the
    init seed, RoPE needing the second."""
    seed, rope = doc["init"]["seed"], any("rope" in layer for layer in _flat(doc["model"]["layers"]))
    return ("sdpa" if rope or seed % 2 else "mha"), ("dpa" if rope or (seed // 2) % 2 else "mhdpa")


def _flat(layers: list[dict]) -> list[dict]:
    return [inner for layer in layers for inner in (_flat(layer["layers"]) if layer["kind"] == "residual" else [layer])]


def text_port_source(doc: dict, slip: str | None = None, hub: bool = False) -> tuple[str, Slip | None]:
    """The port of text spec `doc` as a user writes it, with `slip` (one of TEXT_SLIPS, or
    "tie_dropped" where `hub`) written into the first attention or layer where it changes
    the math; the source, and the slip written (None where none takes it). In a hub's style
    (`hub`, issue 83), the head's weight is the token embedding's where their shapes allow,
    as GPT-2's is: torch's `head.weight = embed.weight`, flax's head the embedding's
    `attend` (HF's Flax GPT-2 reads the embedding's table); with the slip, flax's head keeps
    a kernel of its own, so the converter places torch's one tensor twice."""
    from harness.spec.model import Spec

    placed = Spec.model_validate(doc).model.placed
    torch_style, flax_style = styles(doc)
    init, forward, call, convert, load = [], [], [], [], {}
    written: Slip | None = None
    modules = [p.name for p in placed if p.module.KIND != "residual"]  # what torch's hooks and flax's intermediates name
    tables = [p.name for p in placed if p.module.KIND == "embedding"]
    last = doc["model"]["layers"][-1]
    head = modules[-1] if hub and tables and last["kind"] == "dense" and last["width"] == 256 else None

    def slipped(kind: str, name: str, when: bool, named: str | None = None) -> bool:
        nonlocal written
        if slip != kind or written is not None or not when:
            return False
        written = Slip(kind, name, named or f"module {name}")
        return True

    def after(name: str) -> str:
        later = modules[modules.index(name) + 1 :]
        return f"module {later[0]}" if later else "module output"

    def dense(n: str, width_in: int, width: int):
        load[f"{n}.weight"], load[f"{n}.bias"] = (f"{n}.weight", True, None), (f"{n}.bias", False, None)
        return f"torch.nn.Linear({width_in}, {width})"

    def attention(layer: dict, n: str, width: int):
        heads, bias, causal, rope = layer["heads"], layer.get("bias", True), layer.get("causal", True), layer.get("rope")
        head_width = width // heads
        for w in ("q", "k", "v", "out"):
            packed = torch_style == "mha" and w != "out"
            key = f"{n}.in_proj" if packed else f"{n}.out_proj" if torch_style == "mha" else f"{n}.{w}"
            part = "qkv".index(w) if packed else None
            load[f"{n}.{w}_weight"] = (f"{key}_weight" if packed else f"{key}.weight", True, part)
            if bias:
                load[f"{n}.{w}_bias"] = (f"{key}_bias" if packed else f"{key}.bias", False, part)
        turn = (rope["layout"], float(rope.get("base", 10000.0))) if rope else None
        if torch_style == "mha":
            init.append(f"self.{n} = torch.nn.MultiheadAttention({width}, {heads}, bias={bias}, batch_first=True)")
            mask = "attn_mask=torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1), " if causal else ""
            forward.append(f"x = self.{n}(x, x, x, {mask}need_weights=False)[0]")
            order = "k, q, v" if slipped("qkv_order", n, True) else "q, k, v"
            convert.append(f'{order} = np.split(s["{n}.in_proj_weight"], 3)')
            convert.append(f'qb, kb, vb = np.split(s["{n}.in_proj_bias"], 3)' if bias else "qb = kb = vb = None")
            out_bias = f's["{n}.out_proj.bias"]' if bias else "None"
            convert.append(f'o, ob = s["{n}.out_proj.weight"], {out_bias}')
        else:
            init.append(f"self.{n} = TorchAttention({width}, {heads}, {bias}, {causal}, {turn!r})")
            forward.append(f"x = self.{n}(x)")
            for w, short in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o")):
                its_bias = f's["{n}.{w}.bias"]' if bias else "None"
                convert.append(f'{short}, {short}b = s["{n}.{w}.weight"], {its_bias}')
        split = heads > 1 and head_width > 1
        if flax_style == "mhdpa":
            masked = ", mask=mask" if causal and not slipped("causal_mask", n, True) else ""
            call.append(f'x = nn.MultiHeadDotProductAttention(num_heads={heads}, use_bias={bias}, name="{n}")(x, x{masked})')
            if slipped("head_split", n, split):
                heads_of = f"w.T.reshape({width}, {head_width}, {heads}).transpose(0, 2, 1)"
            else:
                heads_of = f"w.T.reshape({width}, {heads}, {head_width})"
            bias_of = f'**({{"bias": b.reshape({heads}, {head_width})}} if b is not None else {{}})'
            convert.append(f'def projection(w, b):\n    return {{"kernel": {heads_of}, {bias_of}}}')
            convert.append(
                f'params["{n}"] = {{"query": projection(q, qb), "key": projection(k, kb), "value": projection(v, vb), '
                f'"out": {{"kernel": o.T.reshape({heads}, {head_width}, {width}), **({{"bias": ob}} if ob is not None else {{}})}}}}'
            )
        else:
            causal_here = causal and not slipped("causal_mask", n, causal)
            heads_first = not slipped("head_split", n, split)
            if turn and slipped("rope_layout", n, head_width > 2):
                turn = ({"half": "interleaved", "interleaved": "half"}[turn[0]], turn[1])
            call.append(f'x = FlaxAttention({width}, {heads}, {bias}, {causal_here}, {turn!r}, heads_first={heads_first}, name="{n}")(x, mask)')
            convert.append(
                f'params["{n}"] = {{w: {{"kernel": m.T, **({{"bias": b}} if b is not None else {{}})}} '
                f'for w, m, b in (("q", q, qb), ("k", k, kb), ("v", v, vb), ("out", o, ob))}}'
            )

    def layers(walked, width: int | None):
        for layer, p, body in walked:
            kind, n = layer["kind"], p.name
            if kind in ("embedding", "positional"):  # a table: of the tokens' ids, or of the positions
                width = widths[n] = layer.get("width", width)
                rows, ids, plus = (256, "x", "") if kind == "embedding" else (layer["max_len"], "{}.arange(x.shape[1]{})", "x + ")
                init.append(f"self.{n} = torch.nn.Embedding({rows}, {width})")
                forward.append(f"x = {plus}self.{n}({ids.format('torch', ', device=x.device')})")
                call.append(f'{n} = nn.Embed({rows}, {width}, name="{n}")')
                call.append(f"x = {plus}{n}({ids.format('jnp', '')})")
                load[f"{n}.weight"] = (f"{n}.weight", False, None)
                convert.append(f'params["{n}"] = {{"embedding": s["{n}.weight"]}}')
            elif kind == "layer_norm":
                eps = layer.get("eps", 1e-5)
                init.append(f"self.{n} = torch.nn.LayerNorm({width}, eps={eps!r})")
                forward.append(f"x = self.{n}(x)")
                given = "" if slipped("layer_norm_eps", n, eps != 1e-6) else f"epsilon={eps!r}, "
                call.append(f'x = nn.LayerNorm({given}name="{n}")(x)')
                load[f"{n}.scale"], load[f"{n}.bias"] = (f"{n}.weight", False, None), (f"{n}.bias", False, None)
                convert.append(f'params["{n}"] = {{"scale": s["{n}.weight"], "bias": s["{n}.bias"]}}')
            elif kind == "dense":
                init.append(f"self.{n} = {dense(n, width, layer['width'])}")
                tied = n == head and width == widths[tables[0]]
                if tied:
                    init.append(f"self.{n}.weight = self.{tables[0]}.weight  # tied, as GPT-2's head")
                width = layer["width"]
                forward.append(f"x = self.{n}(x)")
                if tied and not slipped("tie_dropped", n, True, f"{tables[0]}.weight"):
                    call.append(f'x = {tables[0]}.attend(x) + self.param("{n}_bias", nn.initializers.zeros, ({width},))')
                    convert.append(f'params["{n}_bias"] = s["{n}.bias"]')
                else:
                    call.append(f'x = nn.Dense({width}, name="{n}")(x)')
                    convert.append(f'params["{n}"] = {{"kernel": s["{n}.weight"].T, "bias": s["{n}.bias"]}}')
                activation = layer.get("activation", "identity")
                if activation != "identity":
                    forward.append(f"x = {TORCH_ACTIVATION[activation]}")
                    other = {"gelu": FLAX_ACTIVATION["gelu_tanh"], "gelu_tanh": FLAX_ACTIVATION["gelu"]}.get(activation)
                    call.append(f"x = {other if slipped('gelu_approximation', n, other is not None, after(n)) else FLAX_ACTIVATION[activation]}")
            elif kind == "dropout":
                init.append(f"self.{n} = torch.nn.Dropout({layer['rate']!r})")
                forward.append(f"x = self.{n}(x)")
                call.append(f'x = nn.Dropout({layer["rate"]!r}, deterministic=not train, name="{n}")(x)')
            elif kind == "attention":
                attention(layer, n, width)
            elif kind == "residual":
                forward.append(f"{n} = x")
                call.append(f"{n} = x")
                width = layers(body, width)
                forward.append(f"x = {n} + x")
                call.append(f"x = {n} + x")
            else:
                raise ValueError(f"no text port of layer kind {kind!r}")
        return width

    widths: dict[str, int] = {}  # each table's width
    layers(_walk(doc["model"]["layers"], iter(placed)), None)

    def lines(found: list[str], indent: int) -> str:
        return "\n".join(" " * indent + line for piece in found for line in piece.split("\n"))

    source = HEAD.format(
        doc=json.dumps(doc),
        load=repr(load),
        torch_init=lines(init, 8),
        torch_forward=lines(forward, 8),
        flax_call=lines(call, 8),
        convert=lines(convert, 4),
    )
    return source, written
