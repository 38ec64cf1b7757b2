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

import json

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

from harness.layers import initial_tensors
from harness.spec.model import Spec

SPEC = Spec.model_validate(json.loads({doc!r}))
TORCH_NAMES = {{"scale": "weight", "bias": "bias", "weight": "weight", "running_mean": "running_mean", "running_var": "running_var"}}


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


def torch_model():
    model = TorchPort()
    state = model.state_dict()
    with torch.no_grad():
        for name, value in initial_tensors(SPEC.model.placed, SPEC.init).items():
            layer, local = name.split(".")
            value = value.T if isinstance(getattr(model, layer), torch.nn.Linear) and local == "weight" else value
            state[f"{{layer}}.{{TORCH_NAMES[local]}}"].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return model


def flax_model():
    return FlaxPort()


def torch_to_flax(state):
    s = {{k: np.asarray(v) for k, v in state.items()}}
    return {{
        "params": {{
{params}
        }},{stats}
    }}
'''

TORCH_ACTIVATION = {"relu": "torch.relu(x)", "tanh": "torch.tanh(x)", "gelu": "F.gelu(x)", "gelu_tanh": 'F.gelu(x, approximate="tanh")'}
FLAX_ACTIVATION = {"relu": "nn.relu(x)", "tanh": "jnp.tanh(x)", "gelu": "nn.gelu(x, approximate=False)", "gelu_tanh": "nn.gelu(x)"}
# The classic slips of a port (tests/test_port.py SLIPS shows each on the examples)
# on the spec's own draws: flax's layer-norm and batch-norm eps defaults (1e-6, 1e-5) left
# where torch's differ, GELU's other approximation (flax's default is tanh, torch's exact),
# torch's batch-norm momentum passed to flax as it is, the flatten order left unconverted,
# and flax's padding="SAME" for torch's symmetric padding (SAME pads the end first)
SLIPS = ("layer_norm_eps", "batch_norm_eps", "gelu_approximation", "batch_norm_momentum", "flatten_order", "conv_padding")


@dataclass(frozen=True)
class Slip:
    """A slip written into a port, and what its failing check must name."""

    kind: str
    layer: str  # the layer it is written in
    named: str  # what the diagnosis names: "module NAME" or "NAME.running_mean"


def port_source(doc: dict, slip: str | None = None) -> tuple[str, Slip | None]:
    """The port of spec `doc` as a user writes it, with `slip` (one of SLIPS) written into
    its first layer where it changes the math; the source, and the slip written (None where
    no layer of the spec can take it)."""
    from harness.layers import windows
    from harness.spec.model import Spec

    placed = Spec.model_validate(doc).model.placed
    init, forward, call, params, stats = [], [], [], [], []
    written: Slip | None = None
    flattened = None  # the (C, H, W) a flatten took, for the dense layer after it
    named = [p.name for p in placed if p.module.KIND in ("dense", "conv2d", "batch_norm", "layer_norm")]

    def after(name: str) -> str:
        later = named[named.index(name) + 1 :] if name in named else []
        return f"module {later[0]}" if later else "module output"

    def slipped(kind: str, p, when: bool) -> bool:
        nonlocal written
        if slip != kind or written is not None or not when:
            return False
        names = {"batch_norm_momentum": f"{p.name}.running_mean", "gelu_approximation": after(p.name)}
        written = Slip(kind, p.name, names.get(kind, f"module {p.name}"))
        return True

    for p in placed:
        kind, s, n, shape = p.module.KIND, p.section, p.name, p.in_shape
        if kind == "dense":
            init.append(f"self.{n} = torch.nn.Linear({shape[-1]}, {s.width})")
            forward.append(f"x = self.{n}(x)")
            call.append(f'x = nn.Dense({s.width}, name="{n}")(x)')
            kernel = f's["{n}.weight"].T'
            if flattened is not None and flattened[1] * flattened[2] > 1 and flattened[0] > 1:
                c, h, w = flattened
                if not slipped("flatten_order", p, True):
                    kernel = f's["{n}.weight"].reshape({s.width}, {c}, {h}, {w}).transpose(2, 3, 1, 0).reshape({c * h * w}, {s.width})'
            flattened = None
            params.append(f'"{n}": {{"kernel": {kernel}, "bias": s["{n}.bias"]}},')
        elif kind == "conv2d":
            (top, bottom), (left, right) = windows.pads(s.padding, shape[1], shape[2], s.kernel, s.stride)
            init.append(f"self.{n} = torch.nn.Conv2d({shape[0]}, {s.filters}, {s.kernel}, stride={s.stride})")
            if (top, bottom, left, right) != (0, 0, 0, 0):
                forward.append(f"x = F.pad(x, ({left}, {right}, {top}, {bottom}))")
            forward.append(f"x = self.{n}(x)")
            pads = f"(({top}, {bottom}), ({left}, {right}))"
            torch_pads, same = ((top, bottom), (left, right)), windows.pads("same", shape[1], shape[2], s.kernel, s.stride)
            if top == bottom and left == right and same != torch_pads and _out(same, shape, s) == _out(torch_pads, shape, s):
                pads = '"SAME"' if slipped("conv_padding", p, True) else pads
            call.append(f'x = nn.Conv({s.filters}, ({s.kernel}, {s.kernel}), strides=({s.stride}, {s.stride}), padding={pads}, name="{n}")(x)')
            params.append(f'"{n}": {{"kernel": s["{n}.weight"].transpose(2, 3, 1, 0), "bias": s["{n}.bias"]}},')
        elif kind == "batch_norm":
            norm = "BatchNorm2d" if len(shape) == 3 else "BatchNorm1d"
            init.append(f"self.{n} = torch.nn.{norm}({shape[0]}, eps={s.eps!r}, momentum={s.momentum!r})")
            forward.append(f"x = self.{n}(x)")
            momentum = s.momentum if slipped("batch_norm_momentum", p, s.momentum != 0.5) else round(1 - s.momentum, 12)
            eps = "" if slipped("batch_norm_eps", p, s.eps != 1e-5) else f", epsilon={s.eps!r}"
            call.append(f'x = nn.BatchNorm(use_running_average=not train, momentum={momentum!r}{eps}, name="{n}")(x)')
            params.append(f'"{n}": {{"scale": s["{n}.weight"], "bias": s["{n}.bias"]}},')
            stats.append(f'"{n}": {{"mean": s["{n}.running_mean"], "var": s["{n}.running_var"]}},')
        elif kind == "layer_norm":
            init.append(f"self.{n} = torch.nn.LayerNorm({shape[-1]}, eps={s.eps!r})")
            forward.append(f"x = self.{n}(x)")
            eps = "" if slipped("layer_norm_eps", p, s.eps != 1e-6) else f"epsilon={s.eps!r}, "
            call.append(f'x = nn.LayerNorm({eps}name="{n}")(x)')
            params.append(f'"{n}": {{"scale": s["{n}.weight"], "bias": s["{n}.bias"]}},')
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

    source = HEAD.format(
        doc=json.dumps(doc),
        torch_init=lines(init, 8),
        torch_forward=lines(forward, 8),
        flax_call=lines(call, 8),
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


def port_of(doc: dict, folder: Path, slip: str | None = None) -> tuple[Path, Slip | None]:
    """The spec `doc` written as a port in `folder` (its network in port.py, with `slip`
    where a layer takes it; the spec naming it with the seed alone): the spec's path, and
    the slip written."""
    if doc["data"]["kind"] == "text":
        from tests.text_ports import text_port_source

        source, written = text_port_source(doc, slip)
    else:
        source, written = port_source(doc, slip)
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


def tool_arguments(argv: list[str]) -> tuple[int, int, int, int, Path, tuple[str, ...] | None, tuple[str, ...], bool]:
    """tools/port_family.py's and tools/forward_family.py's arguments, N SEED A B OUT
    [slips] [text | image]: those five, the kinds drawn (None: the family's own; `image`:
    its image networks alone, where the batch norms are), their slips, and
    whether `slips` was given. Keeps XLA's executables on disk beside OUT, before anything
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
    return n, seed, first, stop, out, kinds, slips, "slips" in argv[5:]


def to_write(out: Path, count: int, seed: int, first: int, stop: int, slips: tuple[str | None, ...], kinds: tuple[str, ...] | None = None):
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
            path, written = port_of(docs[i], folder, slip)
            if slip and written is None:
                continue
            kinds = [layer.get("kind") or next(iter(layer)) for layer in docs[i]["model"]["layers"]]
            yield i, slip, docs[i], path, written, {"i": i, "seed": seed, "layers": kinds, "slip": slip}
