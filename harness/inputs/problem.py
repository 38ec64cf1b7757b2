"""The framework-neutral inputs of a run, made once per spec and handed to every adapter:
the data, the initial parameters and state, the batch order and the dropout masks, all
NumPy, all seeded.

Parameters are one flat mapping from names (dense1.weight, conv1.bias, bn1.running_mean)
to arrays in the spec's layout: a dense weight (fan_in, fan_out), so a layer is x @ W + b;
a conv weight [filters, channels, kh, kw]. Adapters whose framework stores them otherwise
(torch.nn.Linear, flax's HWIO kernels) transpose on the way in and out.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.core.errors import DataError
from harness.core.registry import GPU_ORACLE_KEY, ORACLE_KEY, PORT_REFERENCE_KEY, RunKey
from harness.inputs import arrays, data, resources
from harness.layers import dropout, initial_tensors
from harness.spec.load import LoadedSpec
from harness.spec.model import Spec, batch_bounds, check_batching, total_steps

# name -> array: every tensor of the network, trained or not, in the layers' order (the
# same names in the checks, the diagnosis, the artifacts and the export).
Params = dict[str, np.ndarray]
# Records and artifacts written before 2026-11-24 named a layer's tensors W0, b0, W1, ...
OLD_NAMES = re.compile(r"([Wb])(\d+)")
# A tensor's name: a layer (its kind's prefix and number) and the tensor's own name.
TENSOR_NAME = re.compile(r"[a-z]+[0-9]+\.[a-z_]+")


def from_named(arrays: dict[str, np.ndarray]) -> Params:
    """The tensors named in `arrays` (an artifact or an export); the older names W0, b0, ...
    read as dense1.weight, dense1.bias, .... Other keys are left out."""
    renamed = {}
    for key, value in arrays.items():
        old = OLD_NAMES.fullmatch(key)
        if old:
            renamed[f"dense{int(old[2]) + 1}.{'weight' if old[1] == 'W' else 'bias'}"] = value
        elif TENSOR_NAME.fullmatch(key):
            renamed[key] = value
    return renamed


def dropout_masks(spec: Spec, steps: int, rows: int) -> dict[str, np.ndarray]:
    """Each dropout layer's kept values, (steps, rows, *shape) booleans, drawn once in
    NumPy from init.seed and the layer's position: row j of step t's mask goes with row j
    of that step's batch. Empty without dropout."""
    return {
        p.name: dropout.kept(p.section, p.in_shape, steps, rows, [spec.init.seed, p.index]) for p in spec.model.placed if p.module.KIND == "dropout"
    }


# The re-anchored twins' segments when math_parity.every is unset: their cost, a few
# hundred float64 steps per framework, stays a small share of the run's.
DEFAULT_SEGMENTS = 4


@dataclass(frozen=True)
class Problem:
    """Everything an adapter needs to train a spec, and nothing framework-specific."""

    spec: Spec
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    initial_params: Params  # every tensor, trained or not (running statistics), by name
    batch_order: np.ndarray | None  # (epochs, n_train) permutations, or None: each step is the whole set in order
    bounds: list[tuple[int, int]]  # one epoch's [start, stop) slices, one per step
    data_files: tuple[data.UsedFile, ...] = ()
    data_source: str | None = None
    prep_seconds: float = 0.0
    step_limit: int | None = None  # train only the first steps (the float64 twins), see truncated
    # A calibration member's order of each hidden layer's units (see reordered): new unit j
    # is plain unit order[j]. Empty for a problem in the plain order.
    unit_orders: tuple = ()  # members.UnitOrder per reordered layer
    # A calibration member's other roundings (see reordered): over its first `jitter_steps`
    # steps, the array-module code moves every intermediate array at random (seeded) by at
    # most two ulps (harness.reference.network.jitter_function). None: the plain arithmetic.
    jitter_seed: int | None = None
    # ... from this step on (a re-anchored segment's member starts rounding where it starts)
    jitter_from: int = 0
    # The oracle computing a library's clipping (harness/inputs/library.py): see
    # harness.reference.network.recipe_gradients. 0: the spec's.
    clip_eps: float = 0.0
    # ... and a library's other behaviours (harness/known_differences.yaml): the learning
    # rate of each update as its schedule computes it, Adam's bias corrections in float32,
    # the logged loss summed one example after another. None / False: the spec's.
    rates: tuple[float, ...] | None = None
    float32_corrections: bool = False
    sequential_loss: bool = False
    # Each dropout layer's kept values (dropout_masks): layer name -> (steps, rows, *shape).
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    # A user's port (model.python, harness/inputs/port.py): its file, whose torch module made
    # initial_params (torch's state_dict names and layout), and its output width.
    port: Path | None = None
    port_outputs: int | None = None
    # ... and the tensors an L2 penalty sums (loss.l2): its Linear and convolution weights
    # by torch's names (port.penalized); flax's leaves holding them (adapters/jax_port.py)
    port_penalized: tuple[str, ...] = ()
    # A port's torch reference computing a library's formula (harness/inputs/library.py):
    # its batch norms store this variance ("biased": flax's). None: torch's own.
    port_running_var: str | None = None
    # ... and its clipping's eps (optax's 0: max_norm / norm, as the spec; torch's own: 1e-6)
    port_clip_eps: float | None = None
    # ... and its batch norms' batch variance as E[x^2] - E[x]^2 (flax's use_fast_variance)
    port_fast_variance: bool = False
    # ... and its layer norms' variance so too (flax's LayerNorm's use_fast_variance), in
    # training and evaluation
    port_layer_norm_fast: bool = False
    # ... and where it drops (port.Facts dropout): every dropout runs turned off, in both
    # frameworks, where any is found (each would draw its own masks)
    port_dropout: tuple[str, ...] = ()
    # ... and its tied tensors (port.tied): each state_dict name that holds the tensor an
    # earlier name holds, with that name; initial_params holds each tied tensor once
    port_tied: tuple[tuple[str, str], ...] = ()
    # A bf16 envelope member rounding where JAX rounds on the CPU (roles.bf16_jobs): each
    # Linear and convolution bias's gradient summed by XLA:CPU in bfloat16 (adapters/torch_bf16.py)
    xla_bf16_sums: bool = False
    # Where the oracle, its float32 calibration run and their members run: "cpu" (NumPy) or
    # "gpu" (CuPy; `harness run --references gpu`). A port has no oracle and ignores it.
    references: str = "cpu"

    @property
    def reference_key(self) -> RunKey:
        """The run every other is judged against: the float64 oracle (on the CPU, or on the
        GPU), or for a port (which has no array-module code) torch's float64 run."""
        if self.port is not None:
            return PORT_REFERENCE_KEY
        return ORACLE_KEY if self.references == "cpu" else GPU_ORACLE_KEY

    @property
    def jitter_steps(self) -> int:
        return self.spec.checks.math_parity.steps if self.jitter_seed is not None else 0

    @property
    def anchors(self) -> list[int]:
        """The steps the re-anchored twins start from (harness/run/anchored.py): every
        math_parity.every steps after the first, where a whole segment of math_parity.steps
        still fits; by default at most 4, evenly spaced. None in a truncated problem. A
        port's segments tile its whole run (issue 52: a jump at step 97 of 104 went unjudged):
        one every math_parity.steps at most, and a last one ending at the run's last step."""
        if self.step_limit is not None:
            return []
        parity, total = self.spec.checks.math_parity, self.total_steps
        every = parity.every or max(parity.steps, -(-total // DEFAULT_SEGMENTS))
        if self.port is None:
            return list(range(every, total - parity.steps + 1, every))
        found = list(range(min(every, parity.steps), total - parity.steps + 1, min(every, parity.steps)))
        if total > parity.steps and (found[-1] if found else 0) + parity.steps < total:
            found.append(total - parity.steps)
        return found

    def jittered(self, step: int) -> bool:
        """Whether a calibration member rounds otherwise at this step."""
        return self.jitter_from <= step < self.jitter_from + self.jitter_steps

    @property
    def total_steps(self) -> int:
        steps = self.spec.training.epochs * len(self.bounds)
        return steps if self.step_limit is None else min(steps, self.step_limit)

    @property
    def twin_steps(self) -> int:
        """The steps the float64 twins, math parity's reference over the first steps and its
        members train: math_parity.steps, or the whole run where it is shorter."""
        return min(self.total_steps, self.spec.checks.math_parity.steps)

    @property
    def probe(self) -> np.ndarray:
        return self.x_train[: self.spec.checks.probe_size]

    def batch_slice(self, step: int) -> tuple[int, int, int]:
        """(epoch, start, stop) of a step's rows in that epoch's permutation."""
        epoch, within = divmod(step, len(self.bounds))
        start, stop = self.bounds[within]
        return epoch, start, stop

    def batch_size(self, step: int) -> int:
        """How many rows step `step` trains on."""
        _, start, stop = self.batch_slice(step)
        return stop - start

    def host_arrays(self, dtype: str, index_dtype: type = np.int64) -> dict[str, np.ndarray]:
        """What an adapter puts on its device: "x" in the run's dtype (token ids as
        `index_dtype`); "y", targets in that
        dtype (mse) or class labels as `index_dtype`; "order", the batch order, if any."""
        # a text's token ids stay integers (an embedding's input); other inputs take the dtype
        arrays = {"x": self.x_train.astype(index_dtype if self.spec.model.tokens is not None else dtype)}
        arrays["y"] = self.y_train.astype(dtype if self.spec.loss.kind == "mse" else index_dtype)
        if self.batch_order is not None:
            arrays["order"] = self.batch_order.astype(index_dtype)
        arrays.update({f"mask:{name}": scaled for name, scaled in self.scaled_masks(dtype).items()})
        return arrays

    def scaled_masks(self, dtype: str) -> dict[str, np.ndarray]:
        """Each dropout layer's masks in `dtype`: 0 where dropped, 1 / (1 - rate) where kept."""
        sections = {p.name: p.section for p in self.spec.model.placed}
        return {name: dropout.scaled(sections[name], kept, dtype) for name, kept in self.masks.items()}

    def step_masks(self, data: dict, step: int) -> dict:
        """A step's mask of each dropout layer, out of arrays an adapter put on its device
        (host_arrays' "mask:NAME"), cut to the step's batch. Any array library."""
        size = self.batch_size(step)
        return {key.removeprefix("mask:"): value[step, :size] for key, value in data.items() if key.startswith("mask:")}

    def first_step_of_each_size(self, plan=()) -> dict[int, int]:
        """Batch size -> the first step of that size among the plan's [start, stop) ranges
        (every step, without a plan): what a warm-up compiles or captures once per size."""
        first: dict[int, int] = {}
        for start, stop in list(plan) or [(0, self.total_steps)]:
            for t in range(start, min(stop, start + len(self.bounds))):  # one epoch holds every size
                first.setdefault(self.batch_size(t), t)
        return dict(sorted(first.items()))

    def runs_of_one_size(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """Steps start .. stop-1 as (first step, steps, batch size) runs of one batch size."""
        runs: list[tuple[int, int, int]] = []
        for t in range(start, stop):
            size = self.batch_size(t)
            if runs and runs[-1][2] == size:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1, size)
            else:
                runs.append((t, 1, size))
        return runs

    def batch(self, data: dict, step: int):
        """A step's (x, y), indexed out of arrays an adapter put on its device: data["x"],
        data["y"] and, when there is a batch order, data["order"]. Any array library."""
        x, y = data["x"], data["y"]
        if self.batch_order is None:
            return x, y
        epoch, start, stop = self.batch_slice(step)
        rows = data["order"][epoch, start:stop]
        return x[rows], y[rows]


def initial_params(spec: Spec) -> Params:
    """Every tensor, drawn once in NumPy from the spec's seed and scheme, as float32
    (harness.layers.initial_tensors: layer by layer, each layer's weight before its bias)."""
    return initial_tensors(spec.model.placed, spec.init)


def with_port(problem: Problem, path: Path, loaded_sha256: str | None, apart: Callable | None = None) -> Problem:
    """The problem of a port: its torch module's initial tensors, its output width checked
    against the data's targets (harness/inputs/port.py; PortError naming the file). Only a
    port whose file load_spec read (`loaded_sha256`) is run, and only with those bytes.
    `apart(fn, *args)`: fn(*args) in another process (harness/matrix.py port_apart: the one
    kept for torch's calibration runs, or a fresh one), where the user's file is run, not in
    this one (the driver's); None: in this one."""
    from harness.inputs import port

    spec = problem.spec
    functions = spec.model.functions
    port.check_loaded(path, loaded_sha256, functions)
    if spec.loss.kind == "mse":
        wanted = ("targets", problem.y_train.shape[1] if problem.y_train.ndim == 2 else 1)
    else:  # the validation split's labels index the outputs too
        wanted = ("labels", max(int(y.max(initial=0)) for y in (problem.y_train, problem.y_val) if y is not None))
    found = (apart or _here)(port.facts, path, loaded_sha256, functions, spec.init.seed, spec.model.in_shape, spec.model.tokens is not None, wanted)
    width = found.width
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"port_options": found.options})})
    penalized = found.penalized if spec.loss.l2 is not None else ()
    return replace(
        problem, spec=spec, initial_params=found.initial, port=path, port_outputs=width, port_penalized=penalized, port_dropout=found.dropout,
        port_tied=found.tied,
    )


def _here(fn: Callable, *args):
    return fn(*args)


def truncated(problem: Problem, steps: int) -> Problem:
    """The same problem trained for its first `steps` steps only (the float64 twins)."""
    return replace(problem, step_limit=steps)


def batch_order(spec: Spec, n_train: int) -> np.ndarray | None:
    """One seeded permutation per epoch, or None when every step is the whole set in order."""
    training = spec.training
    if not training.shuffle:
        return None if training.batch_size == "full" else np.tile(np.arange(n_train), (training.epochs, 1))
    rng = np.random.default_rng(training.shuffle_seed)
    return np.stack([rng.permutation(n_train) for _ in range(training.epochs)])


def in_memory(spec: Spec, x: np.ndarray, y: np.ndarray) -> Problem:
    """`spec` trained on arrays at hand (no data section read, no validation split): its
    initial state, batch order and dropout masks drawn as build_problem draws them."""
    bounds = batch_bounds(spec.training, len(x))
    return Problem(
        spec=spec,
        x_train=x,
        y_train=y,
        x_val=None,
        y_val=None,
        initial_params=initial_params(spec),
        batch_order=batch_order(spec, len(x)),
        bounds=bounds,
        masks=dropout_masks(spec, spec.training.epochs * len(bounds), max(b - a for a, b in bounds)),
    )


def _load_data(loaded: LoadedSpec, data_dir: Path | None, source: str | None, download: bool, limits: resources.Limits):
    spec, section = loaded.spec, loaded.spec.data
    if section.kind == "peaks_grid":
        x, y = data.peaks_grid(section)
        return x, y, None, None, (), None
    if section.kind == "moons":
        x, y = data.make_moons(section.n_samples, section.noise, section.seed)
        return x, y, None, None, (), None
    if section.kind == "image_patterns":
        x, y = data.image_patterns(section)
        return x, y, None, None, (), None
    if section.kind == "text":
        try:
            split = data.load_text(section, data_dir or data.default_data_dir())
        except DataError as exc:
            message = str(exc)
            raise DataError(f"{loaded.path}: {message}" if message.startswith("data.") else message) from None
        return split.x_train, split.y_train, split.x_val, split.y_val, split.files, None
    if section.kind == "arrays":
        return _load_arrays(loaded, data_dir)
    folder, explicit = data_dir or data.default_data_dir(), source is not None
    source = source or section.source
    if not (explicit or download or data.source_present(section, source, folder)):
        shipped = data.embedded_source(section)  # the harness's own copy of MNIST's test set, said by the caller
        if shipped is not None:
            source, folder = shipped, data.EMBEDDED_DIR
    max_bytes = int(limits.memory_gb * resources.GIB)  # the images' features, before they are made

    def admit(n_train: int) -> None:
        resources.check(loaded, limits, n_train)

    try:
        split = data.load_idx(section, source, folder, download, max_bytes, admit)
    except DataError as exc:  # a message that names a key of the spec names its file too
        message = str(exc)
        raise DataError(f"{loaded.path}: {message}" if message.startswith(("data.", "model.")) else message) from None
    images, labels = (split.files[0].path, split.files[1].path) if len(split.files) == 2 else (source, source)
    check_images(loaded, images, split.example_shape)
    n_classes = spec.model.n_outputs  # a port's (model.python) is known once its module is built: with_port checks it
    top = max(split.y_train.max(initial=0), split.y_val.max(initial=0) if split.y_val is not None else 0)
    if n_classes is not None and top >= n_classes:  # the validation split too: its labels index the outputs as well
        raise DataError(f"{labels}: labels go up to {top}, but {loaded.path} gives the last of model.layers {n_classes} outputs")
    return split.x_train, split.y_train, split.x_val, split.y_val, split.files, source


def _load_arrays(loaded: LoadedSpec, data_dir: Path | None):
    """A user's arrays (data kind arrays), their rows' shape checked against the model's input
    and their labels against its outputs (a port's when its module is built: with_port)."""
    try:
        split = arrays.load_arrays(loaded.spec.data, data_dir or data.default_data_dir())
    except DataError as exc:
        message = str(exc)
        raise DataError(f"{loaded.path}: {message}" if message.startswith("data.") else message) from None
    model, path = loaded.spec.model, split.files[0].path
    if split.example_shape != model.in_shape:
        raise DataError(f"{path}: rows of shape {split.example_shape}, but {loaded.path} gives the model an input of {model.in_shape}")
    n_classes = model.n_outputs
    if split.y_train.dtype.kind == "i" and n_classes is not None:
        top = max(int(y.max(initial=0)) for y in (split.y_train, split.y_val) if y is not None)
        if top >= n_classes:
            raise DataError(f"{path}: labels go up to {top}, but {loaded.path} gives the last of model.layers {n_classes} outputs")
    return split.x_train, split.y_train, split.x_val, split.y_val, split.files, None


def check_images(loaded: LoadedSpec, images: str, example_shape: tuple[int, ...]) -> None:
    """One image's shape (height, width) against the model's input: its input_shape must be
    [1, height, width] (an IDX image has one channel), its input_width height x width. A
    DataError naming the file and the key where they disagree."""
    model = loaded.spec.model
    said = " x ".join(map(str, example_shape))
    if model.input_shape is not None and tuple(model.input_shape) != (1, *example_shape):
        raise DataError(f"{images}: images of 1 channel of {said} pixels, but {loaded.path} says model.input_shape: {model.input_shape}")
    pixels = math.prod(example_shape)
    if model.input_width is not None and pixels != model.input_width:
        raise DataError(f"{images}: images of {said} = {pixels} pixels, but {loaded.path} says model.input_width: {model.input_width}")


def unchecked_data(loaded: LoadedSpec, data_dir: Path | None) -> list[str]:
    """The data files a spec names that are not where a run would look (`harness validate`
    says so: it checks them only where they are): a text's file, and its IDX source's files
    (unless the harness ships them, harness/data/mnist)."""
    section, folder = loaded.spec.data, data_dir or data.default_data_dir()
    if section.kind == "text":
        found = (folder / section.file).is_file() or (data.SYSTEM_TEXTS / section.file).is_file()
        return [] if found else [str(folder / section.file)]
    if section.kind == "arrays":
        return [] if (folder / section.file).is_file() else [str(folder / section.file)]
    if section.kind != "idx" or data.source_present(section, section.source, folder):
        return []
    if data.embedded_source(section) is not None:
        return []
    chosen = section.sources[section.source]
    return [str(folder / f.file) for f in (chosen.images, chosen.labels)]


def check_image_files(loaded: LoadedSpec, data_dir: Path | None) -> list[str]:
    """Each data source's image file that is in the data folder, its header's dimensions
    checked against the model's input (check_images) without reading its data: what
    `harness validate` can say before a run. The files checked; a source whose file is not
    there is left to the run (which says how to get it)."""
    section = loaded.spec.data
    if section.kind != "idx":
        return []
    folder = data_dir or data.default_data_dir()
    checked = []
    for source in section.sources.values():
        name = source.images.file
        path = next((p for p in (folder / name, folder / name.removesuffix(".gz")) if p.is_file()), None)
        if path is None:
            continue
        dims = data.idx_shape(path)
        if len(dims) != 3:
            raise DataError(f"{path}: an IDX image file holds count x height x width; this one's header says {dims}")
        check_images(loaded, str(path), dims[1:])
        checked.append(str(path))
    return checked


def build_problem(
    loaded: LoadedSpec,
    data_dir: Path | None = None,
    source: str | None = None,
    download: bool = False,
    limits: resources.Limits = resources.DEFAULT_LIMITS,
    port_apart: Callable | None = None,
) -> Problem:
    """Make the data, the initial weights and the batch order of a spec, once; refused
    before anything is made when it is past the resource limits (for an IDX data set,
    again once its files are read and its size is known, before its features are made).
    `port_apart`: how a port's file is run apart from this process (with_port)."""
    spec = loaded.spec
    start = time.perf_counter()
    resources.check(loaded, limits)
    x_train, y_train, x_val, y_val, files, used_source = _load_data(loaded, data_dir, source, download, limits)
    resources.check(loaded, limits, len(x_train))
    try:
        check_batching(spec.training, len(x_train))
    except ValueError as exc:
        raise DataError(f"{loaded.path}: {exc}") from None
    steps, step = total_steps(spec.training, len(x_train)), spec.checks.params_after_steps.step
    if step > steps:  # the check would silently not be made
        raise DataError(f"{loaded.path}: checks.params_after_steps.step: {step} is past the run's last step, {steps}")
    problem = replace(in_memory(spec, x_train, y_train), x_val=x_val, y_val=y_val, data_files=files, data_source=used_source)
    if loaded.port is not None:
        problem = with_port(problem, loaded.port, loaded.port_sha256, port_apart)
    return replace(problem, prep_seconds=time.perf_counter() - start)
