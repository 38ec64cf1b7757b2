"""The generated family written as ports (issue 42): each drawn spec's network written as a
user writes a port, a torch module and the flax module ported from it, with the converter
between them (port_source), and run through `model: {python: ...}`. An honest port must show
no failing check; a port with one classic slip written into it (SLIPS) must fail, diagnosed
`implementation`, with the module the slip is in (or the first one after it) named.

Both modules name each layer as the spec does (`self.dense1`, `name="dense1"`), so torch's
forward hooks and flax's captured intermediates meet by module path; activations, pooling,
padding and flatten are functions, as ports usually write them. The weights are the
harness's initial tensors of the spec (torch_model loads them), so that the drawn rates
train the networks they were drawn for.

A port takes what a spec of layers takes but dropout (each framework's own masks): such
draws are drawn again, as are those of a batch norm storing the biased variance (torch's
stores the unbiased). An L2 penalty sums the Linear and convolution weights, as the spec's
sums its dense and conv layers'; label smoothing is the loss's. Every optimizer and recipe is
kept as drawn: torch's reference and members compute the catalogued behaviours of optax
(its float32 Adam bias corrections and schedule, no dampening) and clip as optax does where
they stand for it (harness/calibrate/roles.py PORT_SCHEME)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

HEAD = '''"""A generated port: a spec's network as a user's torch module and flax port."""

import functools
import json
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

from harness.layers import initial_tensors
from harness.spec.model import Spec

SPEC = Spec.model_validate(json.loads({doc!r}))
TORCH_NAMES = {{"scale": "weight", "bias": "bias", "weight": "weight", "running_mean": "running_mean", "running_var": "running_var"}}
PREFIX = {prefix}  # each layer of the spec: its module's path in the torch module
{classes}

def torch_model():
    model = TorchPort()
    state = model.state_dict()
    with torch.no_grad():
        for name, value in initial_tensors(SPEC.model.placed, SPEC.init).items():
            layer, local = name.split(".")
            value = value.T if isinstance(model.get_submodule(PREFIX[layer]), torch.nn.Linear) and local == "weight" else value
            state[f"{{PREFIX[layer]}}.{{TORCH_NAMES[local]}}"].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return model


def flax_model({dtype_arg}):
    return FlaxPort({dtype_pass})


def torch_to_flax(state):
    s = {{k: np.asarray(v) for k, v in state.items()}}
    return {{
        "params": {{
{params}
        }},{stats}
    }}
'''

FLAT = """

class TorchPort(torch.nn.Module):
    def __init__(self):
        super().__init__()
{torch_init}

    def forward(self, x):
{torch_forward}
        return x


class FlaxPort(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
{flax_call}
        return x

"""

# A hub's style (issue 83; HF's models): the layers kept in a list (torch's `layers.0.layer`,
# flax's `layers_0/layer`), each in a block returning a tuple with a None, every flax module
# computing in the dtype flax_model is given, and a Linear whose weight is another's (tied),
# which flax's side reads from the other's variables, as HF's Flax GPT-2 reads its embedding.
HUB = """

class TorchBlock(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x), None


class TorchPort(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([
{torch_init}
        ])
{torch_tied}

    def forward(self, x):
{torch_forward}
        return x


class FlaxBlock(nn.Module):
    make: Any  # the layer's module, all but its name

    @nn.compact
    def __call__(self, x, train: bool = False):
        layer = self.make(name="layer")
        return (layer(x, use_running_average=not train) if isinstance(layer, nn.BatchNorm) else layer(x)), None


class FlaxPort(nn.Module):
    dtype: Any = jnp.float32

    def setup(self):
        self.layers = [
{flax_init}
        ]
{flax_tied}

    def __call__(self, x, train: bool = False):
{flax_call}
        return x

"""

TORCH_ACTIVATION = {"relu": "torch.relu(x)", "tanh": "torch.tanh(x)", "gelu": "F.gelu(x)", "gelu_tanh": 'F.gelu(x, approximate="tanh")'}
FLAX_ACTIVATION = {"relu": "nn.relu(x)", "tanh": "jnp.tanh(x)", "gelu": "nn.gelu(x, approximate=False)", "gelu_tanh": "nn.gelu(x)"}
# The classic slips of a port (tests/test_port.py SLIPS shows each on the examples)
# on the spec's own draws: flax's layer-norm and batch-norm eps defaults (1e-6, 1e-5) left
# where torch's differ, GELU's other approximation (flax's default is tanh, torch's exact),
# torch's batch-norm momentum passed to flax as it is, the flatten order left unconverted,
# and flax's padding="SAME" for torch's symmetric padding (SAME pads the end first)
SLIPS = ("layer_norm_eps", "batch_norm_eps", "gelu_approximation", "batch_norm_momentum", "flatten_order", "conv_padding")
# A hub-style port's own (issue 83): the tie dropped in flax (the converter places torch's one
# tensor twice, so flax trains two), and one flax module pinned to float32 whatever dtype
# flax_model is given. Each stops before training, naming the tensor or the module.
HUB_SLIPS = ("tie_dropped", "dtype_pinned")


@dataclass(frozen=True)
class Slip:
    """A slip written into a port, and what its failing check must name."""

    kind: str
    layer: str  # the layer it is written in
    named: str  # what the diagnosis names: "module NAME" or "NAME.running_mean"


def port_source(doc: dict, slip: str | None = None, hub: bool = False) -> tuple[str, Slip | None]:
    """The port of spec `doc` as a user writes it, with `slip` (one of SLIPS, or HUB_SLIPS
    for a hub's style) written into its first layer where it changes the math; in a hub's
    style (HUB) where `hub`. The source, and the slip written (None where no layer of the
    spec can take it)."""
    from harness.layers import windows
    from harness.spec.model import Spec

    placed = Spec.model_validate(doc).model.placed
    init, forward, call, params, stats, flax_init, torch_tied, flax_tied = [], [], [], [], [], [], [], []
    written: Slip | None = None
    flattened = None  # the (C, H, W) a flatten took, for the dense layer after it
    named = [p.name for p in placed if p.module.KIND in ("dense", "conv2d", "batch_norm", "layer_norm")]
    prefix = {n: f"layers.{i}.layer" if hub else n for i, n in enumerate(named)}  # each layer's torch path
    square: dict[tuple[int, int], str] = {}  # a plain dense layer's (in, out): the first such layer (a hub's tie)

    def module_named(name: str) -> str:
        return f"module layers/{named.index(name)}" if hub else f"module {name}"

    def after(name: str) -> str:
        later = named[named.index(name) + 1 :] if name in named else []
        return module_named(later[0]) if later else "module output"

    def slipped(kind: str, p, when: bool) -> bool:
        nonlocal written
        if slip != kind or written is not None or not when:
            return False
        names = {"batch_norm_momentum": f"{prefix[p.name]}.running_mean", "gelu_approximation": after(p.name)}
        written = Slip(kind, p.name, names.get(kind, module_named(p.name)))
        return True

    def module(p, torch_module: str, flax_module: str, args: list[str], norm: bool = False) -> None:
        n = p.name
        if not hub:
            init.append(f"self.{n} = {torch_module}")
            forward.append(f"x = self.{n}(x)")
            arguments = ", ".join(["use_running_average=not train"] * norm + [*args, f'name="{n}"'])
            call.append(f"x = {flax_module}({arguments})(x)")
            return
        i = named.index(n)
        init.append(f"    TorchBlock({torch_module}),")
        forward.append(f"x = self.layers[{i}](x)[0]")
        dtype = "jnp.float32" if slipped("dtype_pinned", p, True) else "self.dtype"
        flax_init.append(f"    FlaxBlock(functools.partial({', '.join([flax_module, *args, f'dtype={dtype}'])})),")
        call.append(f"x = self.layers[{i}](x, train)[0]")

    def placed_params(n: str, body: str) -> str:
        return f'"layers_{named.index(n)}": {{"layer": {body}}},' if hub else f'"{n}": {body},'

    for p in placed:
        kind, s, n, shape = p.module.KIND, p.section, p.name, p.in_shape
        t = prefix.get(n)
        if kind == "dense":
            kernel = f's["{t}.weight"].T'
            if flattened is not None and flattened[1] * flattened[2] > 1 and flattened[0] > 1:
                c, h, w = flattened
                if not slipped("flatten_order", p, True):
                    kernel = f's["{t}.weight"].reshape({s.width}, {c}, {h}, {w}).transpose(2, 3, 1, 0).reshape({c * h * w}, {s.width})'
            flattened = None
            first = square.setdefault((shape[-1], s.width), n) if hub and kernel.endswith(".T") else n
            if first != n and not torch_tied:  # one tie a port: this Linear's weight is `first`'s
                j, i = named.index(n), named.index(first)
                torch_tied.append(f"self.layers[{j}].layer.weight = self.layers[{i}].layer.weight")
                if not slipped("tie_dropped", p, True):
                    init.append(f"    TorchBlock(torch.nn.Linear({shape[-1]}, {s.width})),")
                    forward.append(f"x = self.layers[{j}](x)[0]")
                    flax_init.append(f"    FlaxBlock(functools.partial(nn.Dense, {s.width}, dtype=self.dtype)),  # tied: not called")
                    flax_tied.append(f'self.tied_bias = self.param("tied_bias", nn.initializers.zeros, ({s.width},))')
                    kernel_i = f'self.layers[{i}].variables["params"]["layer"]["kernel"]'
                    call.append(f"x = x @ jnp.asarray({kernel_i}, self.dtype) + jnp.asarray(self.tied_bias, self.dtype)")
                    params.append(f'"tied_bias": s["{t}.bias"],')
                else:
                    written = Slip("tie_dropped", n, f"{prefix[first]}.weight")
                    module(p, f"torch.nn.Linear({shape[-1]}, {s.width})", "nn.Dense", [f"{s.width}"])
                    params.append(placed_params(n, f'{{"kernel": {kernel}, "bias": s["{t}.bias"]}}'))
            else:
                module(p, f"torch.nn.Linear({shape[-1]}, {s.width})", "nn.Dense", [f"{s.width}"])
                params.append(placed_params(n, f'{{"kernel": {kernel}, "bias": s["{t}.bias"]}}'))
        elif kind == "conv2d":
            (top, bottom), (left, right) = windows.pads(s.padding, shape[1], shape[2], s.kernel, s.stride)
            if (top, bottom, left, right) != (0, 0, 0, 0):
                forward.append(f"x = F.pad(x, ({left}, {right}, {top}, {bottom}))")
            pads = f"(({top}, {bottom}), ({left}, {right}))"
            torch_pads, same = ((top, bottom), (left, right)), windows.pads("same", shape[1], shape[2], s.kernel, s.stride)
            if top == bottom and left == right and same != torch_pads and _out(same, shape, s) == _out(torch_pads, shape, s):
                pads = '"SAME"' if slipped("conv_padding", p, True) else pads
            args = [f"{s.filters}", f"({s.kernel}, {s.kernel})", f"strides=({s.stride}, {s.stride})", f"padding={pads}"]
            module(p, f"torch.nn.Conv2d({shape[0]}, {s.filters}, {s.kernel}, stride={s.stride})", "nn.Conv", args)
            params.append(placed_params(n, f'{{"kernel": s["{t}.weight"].transpose(2, 3, 1, 0), "bias": s["{t}.bias"]}}'))
        elif kind == "batch_norm":
            norm = "BatchNorm2d" if len(shape) == 3 else "BatchNorm1d"
            momentum = s.momentum if slipped("batch_norm_momentum", p, s.momentum != 0.5) else round(1 - s.momentum, 12)
            eps = [] if slipped("batch_norm_eps", p, s.eps != 1e-5) else [f"epsilon={s.eps!r}"]
            torch_norm = f"torch.nn.{norm}({shape[0]}, eps={s.eps!r}, momentum={s.momentum!r})"
            module(p, torch_norm, "nn.BatchNorm", [f"momentum={momentum!r}", *eps], norm=True)
            params.append(placed_params(n, f'{{"scale": s["{t}.weight"], "bias": s["{t}.bias"]}}'))
            stats.append(placed_params(n, f'{{"mean": s["{t}.running_mean"], "var": s["{t}.running_var"]}}'))
        elif kind == "layer_norm":
            eps = [] if slipped("layer_norm_eps", p, s.eps != 1e-6) else [f"epsilon={s.eps!r}"]
            module(p, f"torch.nn.LayerNorm({shape[-1]}, eps={s.eps!r})", "nn.LayerNorm", eps)
            params.append(placed_params(n, f'{{"scale": s["{t}.weight"], "bias": s["{t}.bias"]}}'))
        elif kind in ("max_pool", "avg_pool"):
            forward.append(f"x = F.{kind}2d(x, {s.window}, {s.step})")
            call.append(f"x = nn.{kind}(x, ({s.window}, {s.window}), strides=({s.step}, {s.step}))")
        elif kind == "flatten":
            flattened = tuple(shape) if len(shape) == 3 else None
            forward.append("x = torch.flatten(x, 1)")
            call.append("x = x.reshape((x.shape[0], -1))")
        else:
            raise ValueError(f"no port of layer kind {kind!r}")
        if p.activation not in (None, "identity"):
            forward.append(f"x = {TORCH_ACTIVATION[p.activation]}")
            other = {"gelu": FLAX_ACTIVATION["gelu_tanh"], "gelu_tanh": FLAX_ACTIVATION["gelu"]}.get(p.activation)
            call.append(f"x = {other if slipped('gelu_approximation', p, other is not None) else FLAX_ACTIVATION[p.activation]}")

    def lines(found: list[str], indent: int) -> str:
        return "\n".join(" " * indent + line for line in found) or " " * indent + "pass"

    kept = f'\n        "batch_stats": {{\n{lines(stats, 12)}\n        }},' if stats else ""
    if hub:
        classes = HUB.format(
            torch_init=lines(init, 12),
            torch_tied=lines(torch_tied, 8) if torch_tied else "",
            torch_forward=lines(forward, 8),
            flax_init=lines(flax_init, 12),
            flax_tied=lines(flax_tied, 8) if flax_tied else "",
            flax_call=lines(call, 8),
        )
    else:
        classes = FLAT.format(torch_init=lines(init, 8), torch_forward=lines(forward, 8), flax_call=lines(call, 8))
    source = HEAD.format(
        doc=json.dumps(doc),
        prefix=json.dumps(prefix),
        classes=classes,
        dtype_arg="dtype=jnp.float32" if hub else "",
        dtype_pass="dtype=dtype" if hub else "",
        params=lines(params, 12),
        stats=kept,
    )
    return source, written


def _out(pads, shape, conv) -> tuple[int, int]:
    """A convolution's output height and width under `pads`."""
    return tuple((size + sum(pair) - conv.kernel) // conv.stride + 1 for size, pair in zip(shape[1:], pads))


def portable(doc: dict) -> bool:
    """Whether a drawn spec can be a port: a text's transformer (tests/text_ports.py, its
    dropout turned off by the harness), or a network without dropout and without a batch
    norm storing the biased variance."""
    layers = doc["model"]["layers"]
    return doc["data"]["kind"] == "text" or not any(layer.get("kind") == "dropout" or layer.get("running_var") == "biased" for layer in layers)


def port_of(doc: dict, folder: Path, slip: str | None = None, hub: bool = False) -> tuple[Path, Slip | None]:
    """The spec `doc` written as a port in `folder` (its network in port.py, with `slip`
    where a layer takes it, in a hub's style where `hub`; the spec naming it with the seed
    alone): the spec's path, and the slip written."""
    if doc["data"]["kind"] == "text":
        from tests.text_ports import text_port_source

        source, written = text_port_source(doc, slip, hub)
    else:
        source, written = port_source(doc, slip, hub)
    (folder / "port.py").write_text(source)
    model = {k: v for k, v in doc["model"].items() if k != "layers"}
    port = {**doc, "name": "generated_port", "model": {**model, "python": "port.py"}, "init": {"seed": doc["init"]["seed"]}}
    path = folder / "generated_port.yaml"
    path.write_text(yaml.safe_dump(port, sort_keys=False))
    return path, written


def drawn(count: int, seed: int | None = None, kinds: tuple[str, ...] | None = None) -> list[dict]:
    """`count` drawn specs a port can take (tests/family.py spec_documents of `kinds`, its
    own by default, kept where portable): derandomized (the slow test's), or from a
    hypothesis seed (tools/port_family.py)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st

    from tests import family

    docs: list[dict] = []

    @settings(
        max_examples=count, deadline=None, derandomize=seed is None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(st.data())
    def draw(data):
        for _ in range(100):
            doc = data.draw(family.spec_documents(kinds or family.KINDS), label="spec")
            if portable(doc):
                docs.append(doc)
                return

    (draw if seed is None else seeded(seed)(draw))()
    return docs


def tool_arguments(argv: list[str]) -> tuple[int, int, int, int, Path, tuple[str, ...] | None, tuple[str, ...], bool, bool]:
    """tools/port_family.py's and tools/forward_family.py's arguments, N SEED A B OUT
    [slips] [text | image] [hub]: those five, the kinds drawn (None: the family's own;
    `image`: its image networks alone, where the batch norms are), their slips (with the hub
    style's own where `hub`), whether `slips` was given, and whether the ports are written
    in a hub's style (port_source, text_port_source `hub`). Keeps XLA's executables on disk beside OUT, before anything
    imports jax: the ports' runs compile the same programs again and again (2026-11-28: a
    text port's 25.6 s of compiling, 2.0 s with them kept); the same program gives the
    same executable, so no bit changes. The tool's own cache, as __pycache__ is."""
    import os

    from tests import text_ports

    n, seed, first, stop, out = int(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), Path(argv[4])
    kept = {
        "JAX_COMPILATION_CACHE_DIR": str(out.with_suffix(".jax-cache")),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    for name, value in kept.items():
        os.environ.setdefault(name, value)
    kinds, slips = (("text",), text_ports.TEXT_SLIPS) if "text" in argv[5:] else (("image",) if "image" in argv[5:] else None, SLIPS)
    hub = "hub" in argv[5:]
    slips = (*slips, *(HUB_SLIPS if kinds != ("text",) else ("tie_dropped",))) if hub else slips
    return n, seed, first, stop, out, kinds, slips, "slips" in argv[5:], hub


def to_write(
    out: Path, count: int, seed: int, first: int, stop: int, slips: tuple[str | None, ...], kinds: tuple[str, ...] | None = None, hub: bool = False
):
    """The ports of draws [first, stop) of `drawn(count, seed)`, each with each of `slips`
    (None: honest) its layers take, written under OUT's folder, those OUT's JSON lines hold
    passed over (tools/port_family.py, tools/forward_family.py): (i, slip, doc, path,
    written) each, and a row to fill with what the draw is."""
    docs = drawn(count, seed, kinds)
    done = set()
    if out.exists():
        done = {(row["i"], row.get("slip")) for row in map(json.loads, out.read_text().splitlines()) if row}
    for i in range(first, min(stop, len(docs))):
        for slip in slips:
            if (i, slip) in done:
                continue
            folder = out.parent / f"{out.stem}-ports" / f"{seed}-{i}" / (slip or "honest")
            folder.mkdir(parents=True, exist_ok=True)
            path, written = port_of(docs[i], folder, slip, hub)
            if slip and written is None:
                continue
            kinds = [layer.get("kind") or next(iter(layer)) for layer in docs[i]["model"]["layers"]]
            tied = "tied" in path.with_name("port.py").read_text()
            yield i, slip, docs[i], path, written, {"i": i, "seed": seed, "layers": kinds, "slip": slip, "hub": hub, "tied": tied}
