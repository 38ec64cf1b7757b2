"""The layer registry: one module per layer kind, each owning its spec section, its shape
inference, its initialisation (drawn in NumPy, handed to every framework), its share of a
step's cost for the floor, and the oracle's forward and hand-written backward pass in the
array-module code (harness/reference/network.py composes them).

A layer module has: KIND, PREFIX (its tensors are named PREFIXk.weight, ...: dense1,
conv1, bn1, ln1, numbered per kind), TENSORS (the names init draws, in its order; a kind
whose tensors depend on its section has `tensors(section)` too), BUFFERS (those of them
that are state, not trained), Section, out_shape, init, cost, forward and backward. A new
kind is one module here plus one translation per adapter.

One example's shape is (features,), an image (channels, height, width), or a text's
(positions, width): dense, layer_norm and dropout act on its last axis, every position
alike. A residual's nested layers are placed flat, before the residual (see residual.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any

import numpy as np
from pydantic import Discriminator, Tag

from harness.layers import attention, avg_pool, batch_norm, conv2d, dense, dropout, embedding, flatten, layer_norm, max_pool, positional, residual
from harness.layers.base import Shape

KINDS: dict[str, ModuleType] = {
    m.KIND: m for m in (dense, conv2d, max_pool, avg_pool, flatten, batch_norm, layer_norm, dropout, embedding, positional, attention, residual)
}
# Layers whose output goes through the layer's `activation`.
ACTIVATED = ("dense", "conv2d")


def _kind(value: Any) -> str:
    """A layer's kind; one that names none is dense (the MLP specs' layers)."""
    if isinstance(value, dict):
        return value.get("kind", "dense")
    return getattr(value, "kind", "dense")


LayerSection = Annotated[
    Annotated[dense.Section, Tag("dense")]
    | Annotated[conv2d.Section, Tag("conv2d")]
    | Annotated[max_pool.Section, Tag("max_pool")]
    | Annotated[avg_pool.Section, Tag("avg_pool")]
    | Annotated[flatten.Section, Tag("flatten")]
    | Annotated[batch_norm.Section, Tag("batch_norm")]
    | Annotated[layer_norm.Section, Tag("layer_norm")]
    | Annotated[dropout.Section, Tag("dropout")]
    | Annotated[embedding.Section, Tag("embedding")]
    | Annotated[positional.Section, Tag("positional")]
    | Annotated[attention.Section, Tag("attention")]
    | Annotated[residual.Section, Tag("residual")],
    Discriminator(_kind),
]
residual.Section.model_rebuild(_types_namespace={"LayerSection": LayerSection})


@dataclass(frozen=True)
class Placed:
    """A layer in its network: its position, name, section and module, and one example's
    shape going in and coming out."""

    index: int
    name: str
    section: Any
    in_shape: Shape
    out_shape: Shape

    @property
    def module(self) -> ModuleType:
        """The kind's module (by name: a Placed pickles, and goes to a run's own process)."""
        return KINDS[self.section.kind]

    @property
    def activation(self) -> str | None:
        return self.section.activation if self.module.KIND in ACTIVATED else None

    local_names: tuple[str, ...]  # its tensors, in the order init draws them
    start: int | None = None  # a residual's: the index of its body's first layer

    @property
    def trained(self) -> list[str]:
        """The full names of its trained tensors."""
        return [f"{self.name}.{k}" for k in self.local_names if k not in self.module.BUFFERS]


def place(layers, input_shape: Shape, vocabulary: int | None = None) -> list[Placed]:
    """Every layer with its name and shapes, a residual's nested layers flat before it; a
    ValueError that names the layer by its key path where a shape does not fit. An
    embedding that gives no vocabulary takes `vocabulary` (the data's). Nothing is drawn: a
    spec is placed before its memory estimate refuses a layer too wide to hold."""
    placed: list[Placed] = []
    _place_into(placed, {}, layers, tuple(input_shape), vocabulary, "model.layers")
    return placed


def _place_into(placed: list[Placed], counts: dict[str, int], layers, shape: Shape, vocabulary: int | None, path: str) -> Shape:
    for i, section in enumerate(layers):
        module = KINDS[section.kind]
        counts[module.PREFIX] = counts.get(module.PREFIX, 0) + 1
        name = f"{module.PREFIX}{counts[module.PREFIX]}"
        if module is embedding and section.vocabulary is None and vocabulary is not None:
            section = section.model_copy(update={"vocabulary": vocabulary})
        if module is residual:
            start = len(placed)
            inner = _place_into(placed, counts, section.layers, shape, vocabulary, f"{path}.{i}.layers")
            if inner != shape:
                raise ValueError(f"{path}.{i}: a residual's layers must give back its input's shape {list(shape)}, not {list(inner)}")
            placed.append(Placed(len(placed), name, section, shape, shape, (), start))
            continue
        try:
            out = module.out_shape(section, shape)
        except ValueError as exc:
            raise ValueError(f"{path}.{i}: {exc}") from None
        names = module.tensors(section) if hasattr(module, "tensors") else module.TENSORS
        placed.append(Placed(len(placed), name, section, shape, out, names))
        shape = out
    return shape


def residual_starts(placed: list[Placed]) -> dict[int, list[str]]:
    """The residuals whose body starts at each layer (by the layer's index), innermost last."""
    found: dict[int, list[str]] = {}
    for p in placed:
        if p.start is not None:
            found.setdefault(p.start, []).insert(0, p.name)
    return found


def residual_tree(placed: list[Placed], lo: int = 0, hi: int | None = None) -> list:
    """placed[lo:hi] as the spec nests it: each item a layer's name, or a residual's name and
    its body's items (how a framework's module writes x + body(x))."""
    hi = len(placed) if hi is None else hi
    items, i = [], lo
    while i < hi:
        outer = max((p for p in placed[i:hi] if p.start == i), key=lambda p: p.index, default=None)
        if outer is None:
            items.append(placed[i].name)
            i += 1
        else:
            items.append((outer.name, residual_tree(placed, i, outer.index)))
            i = outer.index + 1
    return items


def costs(placed: list[Placed]):
    """Each layer's share of a training step (base.Cost): the floor's terms and the memory
    estimate's values; only the first layer skips the input gradient."""
    return [p.module.cost(p.section, p.in_shape, i == 0) for i, p in enumerate(placed)]


def initial_tensors(placed: list[Placed], init) -> dict[str, np.ndarray]:
    """Every tensor by name, drawn once in NumPy from the spec's seed and scheme, as float32.

    A legacy RandomState draws layer by layer, each layer's tensors in its order (a dense
    layer's weight, then its bias), so the moons weights are exactly the Theano code's
    randn(2, 1000) / sqrt(2) then randn(1000, 2) / sqrt(1000)."""
    rng = np.random.RandomState(init.seed)
    tensors = {}
    for p in placed:
        drawn = p.module.init(p.section, p.in_shape, rng, init)
        if tuple(drawn) != p.local_names:
            raise RuntimeError(f"{p.module.KIND}.init drew {list(drawn)}, not its TENSORS {list(p.local_names)}")
        for local, value in drawn.items():
            tensors[f"{p.name}.{local}"] = np.asarray(value).astype(np.float32)
    return tensors
