"""A port's converter checked before any run (issue 52; harness/run/port_start.py): the
user's torch_to_flax of the port's initial tensors against flax's own init of the user's
module, so that a misnamed key is one line and exit 2 before the torch side and its members
train, not a failed JAX run after them."""

from __future__ import annotations

import numpy as np

from adapters import jax_port
from adapters.jax_adapter import _jax
from harness.inputs import port


def check_converter(
    path,
    loaded_sha256: str,
    functions: dict[str, str] | None,
    tensors: dict[str, np.ndarray],
    in_shape: tuple[int, ...],
    tokens: bool = False,
    tied: tuple[tuple[str, str], ...] = (),
) -> None:
    """Before any run (in a fresh process: harness/matrix.py): the user's torch_to_flax of the
    port's initial tensors against flax's own init of the user's module, leaf by leaf, every
    collection but the captured intermediates: the same key paths, shapes and floating
    dtypes; then that it moves every torch value to one place (jax_port._index_map: a tensor
    left out or placed twice, tied ones too, is named). A PortError of one line naming the
    first leaf or tensor that differs."""
    _jax("float32")  # flax in float32, as the float32 runs make it
    port.check_loaded(path, loaded_sha256, functions)
    net = port.flax_module(path)
    own = port.flax_init(path, net, in_shape, tokens)
    own = {k: v for k, v in jax_port._plain(own).items() if k != "intermediates"}
    converter = port.function(path, "torch_to_flax")
    made = port.call(path, "torch_to_flax(state)", converter, port.with_tied({k: np.asarray(v) for k, v in tensors.items()}, tied))
    if not isinstance(made, dict) or "params" not in made:
        raise port.PortError(f"{path}: torch_to_flax(state) returned no dict of flax variables with 'params'")
    theirs = {k: np.shape(v) for k, v in jax_port._leaves(own)}
    leaves = {k: np.asarray(v) for k, v in jax_port._leaves(made)}
    ours = {k: v.shape for k, v in leaves.items()}
    missing = [k for k in theirs if k not in ours]
    extra = [k for k in ours if k not in theirs]
    if missing or extra:
        if missing and extra:
            what = f"gives {extra[0]} (shape {ours[extra[0]]}) where flax's init has {missing[0]} (shape {theirs[missing[0]]})"
        elif missing:
            what = f"gives no {missing[0]} (flax's init has it, shape {theirs[missing[0]]})"
        else:
            what = f"gives {extra[0]} (shape {ours[extra[0]]}), which flax's init has not"
        raise port.PortError(f"{path}: torch_to_flax(state) {what}")
    for key, shape in theirs.items():
        if ours[key] != shape:
            raise port.PortError(f"{path}: torch_to_flax(state) gives {key} of shape {ours[key]}; flax's init has shape {shape}")
        if leaves[key].dtype.kind != "f":
            raise port.PortError(f"{path}: torch_to_flax(state) gives {key} of dtype {leaves[key].dtype}, not floating")
    jax_port._index_map(path, converter, tuple((k, np.shape(v)) for k, v in tensors.items()), tied)
