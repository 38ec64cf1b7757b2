"""A user's flax module (a port, harness/inputs/port.py) as the JAX adapter's network: the
same loss, optax update and data feeding as a spec of layers, only the module is the
user's. Its variables come from the port's tensors (torch's state_dict names and layout)
through the user's torch_to_flax; the way back, to judge flax's tensors by torch's
names, is read off that converter: it is fed tensors whose every element holds its own
index, and where each index lands in flax's variables says where it goes (a converter
may only move values: transpose, reshape, split into collections)."""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any

import numpy as np

from harness.core.errors import Unsupported
from harness.inputs import port


class Network:
    """The user's flax module behind the adapter's call `apply(variables, x, masks, train,
    mutable=...)`: x flat as the data has it (an image made NHWC), masks ignored."""

    def __init__(self, problem, dtype: str, compute: str | None = None):
        self.problem = problem
        self.shape = problem.spec.model.in_shape
        self.dtype = dtype
        if compute is not None and not port._takes_dtype(port.function(problem.port, "flax_model")):
            raise Unsupported(
                f"{problem.port}: a {compute} run calls flax_model(dtype=jnp.{compute}); give flax_model a `dtype` keyword and pass it "
                "on to every module that takes one (parameters stay float32, as flax's param_dtype keeps them)"
            )
        self.net = port.flax_module(problem.port, compute or dtype)

    def _x(self, x):
        if len(self.shape) == 3:
            return x.reshape((x.shape[0], *self.shape)).transpose(0, 2, 3, 1)
        return x.reshape((x.shape[0], *self.shape))

    def apply(self, variables, x, masks, train: bool, mutable=False, **kwargs):
        """The module's apply; where the port drops (problem.port_dropout), with every flax
        Dropout deterministic: its input given back, as torch's dropouts are turned off
        (adapters/torch_port.py _no_dropout)."""
        import flax.linen as nn

        what = "the flax module's __call__"
        with nn.intercept_methods(_deterministic) if self.problem.port_dropout else contextlib.nullcontext():
            return port.call(self.problem.port, what, self.net.apply, variables, self._x(x), train=train, mutable=mutable, **kwargs)

    def intermediates(self, variables, x) -> dict[str, np.ndarray]:
        """Every submodule's output of a training-mode pass (flax's captured intermediates),
        by module path ("fc1", "block/conv"), images made NCHW as torch's are; the whole
        module's as `output`. The variables are not changed. In the float64 twin, a module
        whose output is of a lower precision is a PortError naming it (below_float64)."""
        _, found = self.apply(variables, x, {}, True, mutable=["batch_stats", "intermediates"], capture_intermediates=True)
        out = {}

        def walk(tree, path):
            for key, value in tree.items():
                if key == "__call__":
                    found = port.first_array(value[0])  # its first call's output, its first array (a tuple's, a dataclass's)
                    if found is None or not np.issubdtype(np.asarray(found).dtype, np.floating):
                        continue
                    if self.dtype == "float64" and np.asarray(found).dtype.itemsize < 8:
                        self.below_float64("/".join(path) or "the whole module", np.asarray(found).dtype)
                    value = np.asarray(found, dtype=np.float64)
                    image = value.ndim == 4 and len(self.shape) == 3  # NHWC made NCHW; a text's (batch, position, head, ...) stays
                    out["/".join(path) or "output"] = value.transpose(0, 3, 1, 2) if image else value
                elif isinstance(value, dict) or hasattr(value, "items"):
                    walk(value, [*path, key])

        walk(found["intermediates"], [])
        pairs = module_pairs(self.problem)
        return {port.paired(pairs[k], k) if k in pairs else k: v for k, v in out.items()}

    def below_float64(self, module: str, dtype) -> None:
        """The float64 twin computes below float64 in `module`: one line, before any training,
        with the mend (a twin in float32 would read as different math)."""
        if port._takes_dtype(port.function(self.problem.port, "flax_model")):
            mend = "flax_model(dtype=jnp.float64) made it, so a module inside pins its own: pass that dtype on to it"
        else:
            mend = (
                "give flax_model a `dtype` keyword and pass it on to every module that takes one (HF's Flax modules do): "
                "the harness calls flax_model(dtype=jnp.float64) for the twin, jnp.float32 for float32 runs"
            )
        raise port.PortError(f"{self.problem.port}: flax's module {module} computes in {dtype} inside the float64 twin; {mend}")


def _deterministic(next_fun, args, kwargs, context):
    """flax's method interceptor: a Dropout's call gives its input back (deterministic)."""
    import flax.linen as nn

    if isinstance(context.module, nn.Dropout) and context.method_name == "__call__":
        return args[0] if args else kwargs["inputs"]
    return next_fun(*args, **kwargs)


def variables(problem, tensors: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """flax's variables holding the port's tensors, in `dtype` (the user's torch_to_flax)."""
    import jax

    state = port.with_tied({k: np.asarray(v) for k, v in tensors.items()}, problem.port_tied)
    made = port.call(problem.port, "torch_to_flax(state)", port.function(problem.port, "torch_to_flax"), state)
    if not isinstance(made, dict) or "params" not in made:
        raise port.PortError(f"{problem.port}: torch_to_flax(state) returned no dict of flax variables with 'params'")
    return jax.tree_util.tree_map(lambda a: np.ascontiguousarray(np.asarray(a)).astype(dtype), {k: _plain(v) for k, v in made.items()})


def _plain(tree):
    """A tree of dicts (a FrozenDict's too)."""
    return {k: _plain(v) for k, v in tree.items()} if hasattr(tree, "items") else tree


def _leaves(tree) -> list[tuple[str, Any]]:
    import jax

    found = jax.tree_util.tree_flatten_with_path(_plain(tree))[0]
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in found]


def tensors(problem, tree: dict[str, Any]) -> dict[str, np.ndarray]:
    """The port's tensors by torch's names and layout, from flax's variables (or a tree of
    the same shape, an optimizer moment's)."""
    where, names, shapes, _ = index_map(problem)
    leaves = dict(_leaves(tree))
    flat = np.concatenate([np.ravel(np.asarray(leaves[path])) for path in where])
    values = flat[names]
    out, at = {}, 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        out[name] = values[at : at + size].reshape(shape).copy()
        at += size
    return out


def penalized(problem, params: dict[str, Any]) -> list[Any]:
    """The leaves of flax's `params` an L2 penalty sums: those torch_to_flax moves the
    penalized torch weights to (problem.port_penalized), each wholly; a leaf holding some of
    a penalized weight and some of another tensor is refused (PortError)."""
    import jax

    paths = _penalized_paths(problem)
    found = jax.tree_util.tree_flatten_with_path(_plain({"params": params}))[0]
    return [leaf for path, leaf in found if jax.tree_util.keystr(path) in paths]


def _penalized_paths(problem) -> frozenset[str]:
    shapes = tuple((k, v.shape) for k, v in problem.initial_params.items())
    return _penalized_leaves(problem.port, port.function(problem.port, "torch_to_flax"), shapes, problem.port_tied, problem.port_penalized)


@functools.cache
def _penalized_leaves(path, converter, shapes, tied, names: tuple[str, ...]) -> frozenset[str]:
    """The paths of flax's leaves (jax.tree_util.keystr of the whole variables) that hold the
    torch tensors `names`, each wholly (_index_map: where each torch element lands)."""
    where, positions, _, sizes = _index_map(path, converter, shapes, tied)
    leaf_of = np.repeat(np.arange(len(where)), sizes)  # each flat position's leaf
    chosen = np.zeros(positions.size, dtype=bool)
    at = 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        chosen[positions[at : at + size]] = name in names
        at += size
    found = set()
    for i, leaf in enumerate(where):
        inside = chosen[leaf_of == i]
        if inside.any() and not inside.all():
            what = "part of a Linear or convolution weight and part of another tensor"
            raise port.PortError(f"{path}: flax's {leaf} holds {what}: loss.l2 cannot sum it")
        if inside.size and inside.all():
            found.add(leaf)
    return frozenset(found)


def module_pairs(problem) -> dict[str, str]:
    """flax's module paths paired with torch's ("layers/0/layer/layer_0" with torch's
    "layers.0.layer.0" written "layers/0/layer/0"), learnt from the converter (index_map):
    a flax module and a torch module pair where the torch tensors the converter moves into
    the one's variables are those under the other, and no other module has the same; among
    several with the same tensors (a module and its only child), the same path first, then
    spelt alike (_spelling), then in depth order. Only pairs whose paths differ; modules
    without tensors pair by path."""
    where, positions, shapes, sizes = index_map(problem)
    leaf_of = np.repeat(np.arange(len(where)), sizes)
    keys = [tuple(re.findall(r"\['(.*?)'\]", path))[1:-1] for path in where]  # no collection, no variable name
    flax_sets: dict[str, set[str]] = {}
    torch_sets: dict[str, set[str]] = {}
    at = 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        for leaf in set(leaf_of[positions[at : at + size]].tolist()):
            for depth in range(1, len(keys[leaf]) + 1):
                flax_sets.setdefault("/".join(keys[leaf][:depth]), set()).add(name)
        at += size
        parts = name.split(".")[:-1]
        for depth in range(1, len(parts) + 1):
            torch_sets.setdefault("/".join(parts[:depth]), set()).add(name)
    by_set: dict[frozenset, tuple[list[str], list[str]]] = {}
    for path, names in flax_sets.items():
        by_set.setdefault(frozenset(names), ([], []))[0].append(path)
    for path, names in torch_sets.items():
        by_set.setdefault(frozenset(names), ([], []))[1].append(path)
    pairs = {}
    for flax_paths, torch_paths in by_set.values():
        torch_left = [p for p in torch_paths if p not in flax_paths]
        flax_left = [p for p in flax_paths if p not in torch_paths]
        spelt = {_spelling(p): p for p in torch_left}
        for path in list(flax_left):  # flax's blocks_0 for torch's blocks.0
            if _spelling(path) in spelt:
                pairs[path] = spelt[_spelling(path)]
                flax_left.remove(path)
                torch_left.remove(pairs[path])
        if len(flax_left) == len(torch_left):
            pairs.update(zip(sorted(flax_left, key=lambda p: p.count("/")), sorted(torch_left, key=lambda p: p.count("/"))))
    return pairs


def _spelling(path: str) -> str:
    """A module path with its separators alike: flax's "blocks_0/layer_0" as torch's "blocks.0.layer.0"."""
    return re.sub(r"[_/.]", "/", path)


def index_map(problem) -> tuple[list[str], np.ndarray, list[tuple[str, tuple]], list[int]]:
    shapes = tuple((k, v.shape) for k, v in problem.initial_params.items())
    return _index_map(problem.port, port.function(problem.port, "torch_to_flax"), shapes, problem.port_tied)


@functools.cache
def _index_map(path, converter, shapes, tied=()) -> tuple[list[str], np.ndarray, list[tuple[str, tuple]], list[int]]:
    """Where each element of each torch tensor lands among flax's leaves: the leaves' paths
    in order, for the torch tensors' elements in order (`shapes`) their positions in those
    leaves flattened and joined, the shapes, and each leaf's size. The converter is given
    each tied name too (port.with_tied), holding its tensor's elements. A PortError naming
    the first tensor that does not land exactly once, moved and not changed."""
    ids, at = {}, 1
    for name, shape in shapes:
        size = int(np.prod(shape))
        ids[name] = np.arange(at, at + size, dtype=np.float64).reshape(shape)
        at += size
    total = at - 1
    made = port.call(path, "torch_to_flax(state)", converter, port.with_tied(ids, tied))
    leaves = _leaves(made)
    flat = np.concatenate([np.ravel(np.asarray(leaf, dtype=np.float64)) for _, leaf in leaves]) if leaves else np.zeros(0)
    index = np.rint(flat).astype(np.int64)
    exact = (flat == index) & (index >= 1) & (index <= total)
    counts = np.bincount(index[exact], minlength=total + 1)[1:]
    if not exact.all() or np.any(counts != 1):
        raise port.PortError(f"{path}: torch_to_flax(state) {_misplaced(shapes, tied, counts, exact, leaves)}")
    positions = np.empty(total, dtype=np.int64)
    positions[index - 1] = np.arange(total)
    return [p for p, _ in leaves], positions, list(shapes), [int(np.size(leaf)) for _, leaf in leaves]


def _misplaced(shapes, tied, counts: np.ndarray, exact: np.ndarray, leaves) -> str:
    """What a converter did beyond moving each torch value once, naming the first tensor (or
    flax leaf) where it shows."""
    rule = "every value of every floating tensor of the torch module must land once in flax's variables, moved (transposed, reshaped, split)"
    if not exact.all():
        at, first = 0, int(np.argmin(exact))
        for path, leaf in leaves:
            at += int(np.size(leaf))
            if first < at:
                return f"gives flax's {path} values that are not torch's moved (computed or changed): {rule}"
    at = 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        mine = counts[at : at + size]
        at += size
        if np.all(mine == 1):
            continue
        names = [alias for alias, kept in tied if kept == name]
        also = f" (tied: {', '.join(names)} is the same tensor, to land once under either name)" if names else ""
        if np.all(mine == 0):
            return f"leaves out {name}{also}: {rule}"
        if np.all(mine >= 1):
            return f"places {name} {int(mine.max())} times{also}: {rule}"
        return f"places only part of {name}{also}: {rule}"
    return rule
