"""A user's port checked from Python (issue 53): `harness.check_port` takes the three callables a
port file defines and the spec's sections as dicts, builds the same spec a YAML file and a port
file would (model.python naming the callables' source file, model.functions their qualified
names), and runs it as `harness run` does: the same matrix, checks and verdict.

Worker processes find each callable again by its source file and qualified name, so a callable
defined inside a function (a closure, a lambda, a class made there) is refused, unless every run
is in this process (`in_process=True`: torch's and JAX's thread pools then share the cores, so
its timings are not the matrix's; the verdict's checks are the same).

Arrays given as data travel to the workers as an .npz file (data kind `arrays`) in a temporary
folder, checked against its sha256 there, as a data file named by a spec is."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness import options
from harness.api import run_loaded
from harness.core.errors import SpecError
from harness.core.registry import DEVICES, PRECISION_CHOICES
from harness.execute.fresh import exit_if_importing_main
from harness.inputs import arrays as arrays_mod
from harness.inputs import port
from harness.result import Verdict
from harness.spec import load as spec_load
from harness.spec.model import FULL_PROFILE, PORT_FILE, QUALNAME

ROLES = port.FUNCTIONS  # torch_model, flax_model, torch_to_flax
# What check_port fills in where the sections leave it out: a run's order drawn from seed 0,
# its last smaller batch kept; the loss curve at every step; one timed repeat.
TRAINING_DEFAULTS = {"shuffle": True, "shuffle_seed": 0, "last_batch": "keep"}
LOGGING = {"loss_every": 1, "print_every": 1000}
TIMING = {"repeats": 1}


def _where(role: str, fn: Any, workers: bool = True) -> tuple[Path, str]:
    """A callable's source file and qualified name, by which a worker finds it again (in this
    process alone, `workers` False, the records name them: a closure is fine); else
    SpecError naming the argument and why."""
    if not callable(fn):
        raise SpecError(f"{role}: a function (or class) that {_DOES[role]}, got {type(fn).__name__}")
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        raise SpecError(f"{role}: {type(fn).__name__} has no qualified name: give a function or class defined at a module's top level")
    if workers and ("<lambda>" in qualname or "<locals>" in qualname):
        what = "a lambda" if "<lambda>" in qualname else "defined inside a function"
        raise SpecError(
            f"{role}: {qualname} is {what}: worker processes find each callable again by its source file and qualified name, "
            "so define it at a module's top level (or pass in_process=True to run everything in this process)"
        )
    try:
        source = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        source = None
    if source is None or not Path(source).is_file():
        raise SpecError(f"{role}: {qualname} has no Python source file a worker could read it from")
    return Path(source).resolve(), qualname


_DOES = {
    "torch_model": "builds the torch.nn.Module",
    "flax_model": "builds the flax.linen.Module",
    "torch_to_flax": "converts torch's state_dict (NumPy arrays) to flax's variables",
}


def _source(callables: dict[str, Any], in_process: bool) -> tuple[Path, dict[str, str]]:
    """The one source file the three callables are defined in, and the qualified names that
    play each role there (those that are not the role's own name)."""
    found = {role: _where(role, fn, workers=not in_process) for role, fn in callables.items()}
    files = sorted({str(path) for path, _ in found.values()})
    if len(files) != 1:
        raise SpecError(
            f"torch_model, flax_model, torch_to_flax: defined in {' and '.join(files)}: a port's three callables are found in one "
            "source file (define the three there; what they build may be imported from anywhere)"
        )
    path = Path(files[0])
    if not re.fullmatch(PORT_FILE, path.name):
        raise SpecError(f"torch_model: its file {path.name} is not a plain module name (letters, digits, _; .py)")
    # in this process, a closure's name (test.<locals>.f) names nothing a worker looks up
    names = {role: qualname for role, (_, qualname) in found.items() if qualname != role and re.fullmatch(QUALNAME, qualname)}
    return path, names


def _section(argument: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{argument}: a dict of the spec's {argument} section, got {type(value).__name__}")
    return copy.deepcopy(value)


def _split(argument: str, pair: Any) -> tuple[np.ndarray, np.ndarray]:
    """One split (x, y) of arrays given as data: float32 features a row each (vectors, or
    images channels x height x width), and integer labels or float32 targets, as many; or
    integer token ids (n, context), y each position's next token."""
    if not (isinstance(pair, tuple | list) and len(pair) == 2 and all(isinstance(a, np.ndarray) for a in pair)):
        raise SpecError(f"{argument}: a pair (x, y) of NumPy arrays, got {type(pair).__name__}")
    x, y = pair
    if _tokens(x):
        arrays_mod.check_tokens(argument, x, y, x.shape[1], max(int(x.max(initial=0)), int(y.max(initial=0))) + 1, SpecError)
    else:
        arrays_mod.check_split(argument, x, y, SpecError)
    return x, y


def _tokens(x: np.ndarray) -> bool:
    """Whether a split's x is a text's token ids: integers, (examples, context)."""
    return x.dtype.kind in "iu" and x.ndim == 2


def _arrays(data: dict[str, Any]) -> dict[str, np.ndarray]:
    unknown = sorted(set(data) - {"train", "validation"})
    if unknown or "train" not in data:
        raise SpecError(f"data: arrays as {{'train': (x, y), 'validation': (x, y)}} (validation optional), got keys {sorted(data)}")
    x, y = _split("data.train", data["train"])
    arrays = {"x_train": x, "y_train": y}
    if "validation" in data:
        xv, yv = _split("data.validation", data["validation"])
        if xv.shape[1:] != x.shape[1:] or yv.shape[1:] != y.shape[1:] or yv.dtype.kind != y.dtype.kind:
            raise SpecError(f"data.validation: rows of {xv.shape[1:]} and {yv.dtype} targets, but data.train's are {x.shape[1:]} and {y.dtype}")
        arrays.update(x_val=xv, y_val=yv)
    return arrays


def _is_arrays(data: Any) -> bool:
    return isinstance(data, dict) and "kind" not in data


def _model(data: Any, arrays: dict[str, np.ndarray] | None, input_shape: Any) -> dict[str, Any]:
    """The model section's input: the arrays' row shape, else `input_shape`, else a 2-feature
    data kind's; named by the spec's key (input_width of a vector, input_shape of an image).
    None for a text data section, which gives the token ids itself (model.tokens)."""
    if data.get("kind") == "text" or (arrays is not None and _tokens(arrays["x_train"])):  # the data gives the context and vocabulary
        if input_shape is not None:
            raise SpecError(f"input_shape: a text's input is its token ids, which the data gives: give no input_shape, got {input_shape!r}")
        return {}
    if input_shape is None and arrays is not None:
        input_shape = arrays["x_train"].shape[1:]
    if input_shape is None and data.get("kind") in ("moons", "peaks_grid"):
        input_shape = (2,)
    if input_shape is None:
        raise SpecError(f"input_shape: a {data.get('kind')!r} data section's rows are known once read: give input_shape, e.g. (784,) or (1, 28, 28)")
    if not (isinstance(input_shape, tuple | list) and len(input_shape) in (1, 3) and all(isinstance(d, int) and d > 0 for d in input_shape)):
        raise SpecError(f"input_shape: (features,) or (channels, height, width), positive integers, got {input_shape!r}")
    return {"input_width": input_shape[0]} if len(input_shape) == 1 else {"input_shape": list(input_shape)}


@contextlib.contextmanager
def _data_folder(arrays: dict[str, np.ndarray] | None, data_dir: Path | None) -> Iterator[tuple[Path | None, dict[str, Any] | None]]:
    """The arrays as an .npz file in a temporary folder (removed afterwards), and its data
    section (token ids with their context and vocabulary, the largest id's range); or the
    caller's data folder and no section."""
    if arrays is None:
        yield data_dir, None
        return
    with tempfile.TemporaryDirectory(prefix="harness-check-port-") as folder:
        path = Path(folder) / "arrays.npz"
        np.savez(path, **arrays)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        section = {"kind": "arrays", "file": path.name, "sha256": digest}
        if _tokens(arrays["x_train"]):
            vocabulary = max(int(a.max(initial=0)) for a in arrays.values()) + 1
            section["tokens"] = {"context": arrays["x_train"].shape[1], "vocabulary": vocabulary}
        yield Path(folder), section


def check_port(
    torch_model: Callable[[], Any],
    flax_model: Callable[[], Any],
    torch_to_flax: Callable[[dict[str, np.ndarray]], Any],
    *,
    data: Any,
    loss: str | dict[str, Any],
    optimizer: dict[str, Any],
    training: dict[str, Any],
    init_seed: int = 0,
    checks: dict[str, Any] | None = None,
    results: str | Path | None = None,
    input_shape: Sequence[int] | None = None,
    devices: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    seeds: int = 1,
    data_dir: str | Path | None = None,
    name: str | None = None,
    in_process: bool = False,
    train_anyway: bool = False,
) -> Verdict:
    """A user's port judged as `harness run` judges a port file (docs/ports.md): torch's and
    JAX's float32 runs against torch's float64 run, with the members that calibrate each check.

    `data`: a spec's data section (a dict with its `kind`; its files in `data_dir`), or NumPy
    arrays {"train": (x, y), "validation": (x, y)} (validation optional): float32 features and
    integer labels (or float32 targets for mse). `loss`: a loss section, or its kind
    ("cross_entropy", reduction mean). `optimizer`, `training`, `checks`: the spec's sections
    (training's shuffle, shuffle_seed and last_batch default to True, 0 and keep).
    `input_shape`: the model's input, (features,) or (channels, height, width); none for a
    text data section, which gives the token ids; the arrays'
    rows give it. `results`: a folder for the records (none written without it).
    `precisions`: as `harness run --precisions` (float32 always; bf16 adds torch's autocast
    run and flax_model(dtype=jnp.bfloat16)'s, measured, not gated). `seeds`: as `--seeds`
    (1: none; at least 5: both frameworks' runs at more init seeds and batch orders, judged
    by their final metrics' distributions).
    `train_anyway`: where flax's initial forward pass already differs from torch's, train the
    matrix all the same (by default that check fails at once and nothing trains). Bad
    arguments raise SpecError (a ValueError) naming the argument and key; nothing runs. So does
    the port's own code failing on them before training (labels past its outputs, a converter
    naming a layer flax's init lacks, images it cannot take: a PortError, one of these), in one
    line where a worker process found it. Called at a script's top level, outside `if __name__
    == "__main__":`, it raises RuntimeError saying so once a worker process starts."""
    exit_if_importing_main()
    callables = {"torch_model": torch_model, "flax_model": flax_model, "torch_to_flax": torch_to_flax}
    for argument, value in (("in_process", in_process), ("train_anyway", train_anyway)):
        if not isinstance(value, bool):
            raise SpecError(f"{argument}: True or False, got {type(value).__name__}")
    source, names = _source(callables, in_process)
    if isinstance(init_seed, bool) or not isinstance(init_seed, int):
        raise SpecError(f"init_seed: an integer, got {type(init_seed).__name__}")
    arrays = _arrays(data) if _is_arrays(data) else None
    if arrays is None and not isinstance(data, dict):
        raise SpecError(f"data: a spec's data section (a dict with its kind) or {{'train': (x, y), ...}} of NumPy arrays, got {type(data).__name__}")
    loss_section = {"kind": loss, "reduction": "mean"} if isinstance(loss, str) else _section("loss", loss)
    where = options.names("devices", devices, DEVICES)
    asked = options.names("precisions", precisions, PRECISION_CHOICES)
    folder, out = options.folder("data_dir", data_dir), options.folder("results", results)
    spec_name = name or re.sub(r"[^a-z0-9_]+", "_", f"port_{names.get('torch_model', 'torch_model')}".lower())[:60]
    document = {
        "name": spec_name,
        "title": f"a port checked from Python: {source.name}",
        "article": "harness.check_port",
        "model": {"python": source.name, **({"functions": names} if names else {}), **_model(data if arrays is None else {}, arrays, input_shape)},
        "init": {"seed": init_seed},
        "loss": loss_section,
        "optimizer": _section("optimizer", optimizer),
        "training": {**TRAINING_DEFAULTS, **_section("training", training)},
        "logging": LOGGING,
        "timing": TIMING,
        **({"checks": _section("checks", checks)} if checks is not None else {}),
    }
    with _data_folder(arrays, folder) as (used, section):
        document["data"] = section if section is not None else _section("data", data)
        loaded = spec_load.load_mapping(document, FULL_PROFILE, folder=source.parent, what="check_port")
        # no records, no floor: nothing holds a run's speed against the hardware's (its measure
        # cost the example's check 6.3 s on the 2-core VM: docs/measurements.md "A port check's
        # processes"); with `results` the records carry it as `harness run`'s do
        chosen = options.RunOptions(
            frameworks=("torch", "jax"),
            devices=where,
            precisions=asked,
            seeds=seeds,
            data_dir=used,
            results=out,
            no_floor=out is None,
            in_process=in_process,
            train_anyway=train_anyway,
        )
        with port.given(source, callables if in_process else None):
            return run_loaded(loaded, chosen)
